// Fuzz target: loading arbitrary bytes as a tokenizer.json (HfTokenizer::FromJsonText).
// Properties: no crash, hang or sanitizer report; a file that loads encodes a few texts without
// error or with one, and decodes any id sequence to valid UTF-8 (streamed too).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/stream_decoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  auto tok = nibble::HfTokenizer::FromJsonText(input, "fuzz/tokenizer.json");
  if (!tok.ok()) return 0;
  const nibble::Tokenizer& t = **tok;
  for (const char* text : {"", "Hello world", "  a\tb\n\n12345 \xC3\xA9\xE6\x97\xA5 \xF0\x9F\x98\x80 <s></s>"}) {
    auto ids = t.Encode(text);
    if (!ids.ok()) continue;
    for (int32_t id : *ids)
      if (id < 0 || id >= t.vocab_size()) std::abort();
    if (nibble::FirstInvalidUtf8(t.Decode(*ids)) >= 0) std::abort();
  }
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < t.vocab_size() && i < 64; ++i) ids.push_back(i);
  nibble::StreamDecoder dec(t);
  for (int32_t id : ids)
    if (nibble::FirstInvalidUtf8(dec.Push(id)) >= 0) std::abort();
  if (nibble::FirstInvalidUtf8(t.Decode(ids)) >= 0) std::abort();
  return 0;
}
