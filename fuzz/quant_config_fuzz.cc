// Fuzz target: Quark quantization_config parsing and per-layer resolution on arbitrary JSON and
// arbitrary layer names. Input: "<layer name>\n<layer name>\n...\n\n<json>" (names optional).
// Properties: no crash; an accepted config survives ToJson -> parse unchanged; resolution of any
// name returns a value or an error, never throws.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/fnmatch.h"
#include "formats/quark_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> names = {"lm_head", "model.layers.0.self_attn.q_proj", "model.layers.31.mlp.down_proj",
                                    "model.layers.0.mlp.gate", "model.layers.0.mlp.gate_proj"};
  std::string json_text = input;
  const size_t sep = input.find("\n\n");
  if (sep != std::string::npos) {
    size_t pos = 0;
    while (pos < sep) {
      size_t nl = input.find('\n', pos);
      if (nl == std::string::npos || nl > sep) nl = sep;
      names.push_back(input.substr(pos, nl - pos));
      pos = nl + 1;
    }
    json_text = input.substr(sep + 2);
  }
  for (const auto& a : names)
    for (const auto& b : names) (void)nibble::FnMatch(a, b);  // names double as patterns
  auto j = nlohmann::ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto cfg = nibble::ParseQuarkQuantConfig(j, "fuzz");
  if (!cfg.ok()) return 0;
  auto again = nibble::ParseQuarkQuantConfig(nibble::ToJson(*cfg), "fuzz round trip");
  if (!again.ok() || !(*again == *cfg)) __builtin_trap();
  for (const auto& n : names) (void)nibble::ResolveLayer(*cfg, n);
  return 0;
}
