// Fuzz target: arbitrary bytes as a model directory's tokenizer_config.json, read the ways a
// model load reads it: the special-token settings (ReadSpecialTokens, with a config.json beside
// it naming ids) and the chat template with its bos/eos strings (LoadChatTemplateConfig, then a
// parse of the template found). Properties: no crash, hang or sanitizer report; settings that load
// keep their ids inside the vocabulary.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr int32_t kVocab = 1000;
std::string* g_dir = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/nibble_tokenizer_config_fuzz_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) std::abort();
  g_dir = new std::string(tmpl);
  std::ofstream(*g_dir + "/config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, 7]})";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = *g_dir + "/tokenizer_config.json";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                 static_cast<std::streamsize>(size));
  nibble::SpecialTokens defaults;
  defaults.bos_id = 0;
  auto st = nibble::ReadSpecialTokens(*g_dir, kVocab, defaults);
  if (st.ok()) {
    if (st->bos_id >= kVocab) std::abort();
    for (int32_t id : st->eos_ids)
      if (id < 0 || id >= kVocab) std::abort();
  }
  auto chat = nibble::chat::LoadChatTemplateConfig(path, false);
  if (chat.ok() && !chat->source.empty()) (void)nibble::chat::CheckChatTemplate(chat->source, chat->origin);
  return 0;
}
