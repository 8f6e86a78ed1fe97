// The GPTQ quantization_config (keys and semantics in formats/gptq_format.h): parsing, the
// per-module resolution of `dynamic`, and the writer's factory (formats/gptq_writer.cc).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "formats/checkpoint_format.h"

namespace nibble {

/// One `dynamic` entry, in config order.
struct GptqOverride {
  std::string key;      // as stored ("-:model\\.layers\\.0\\..*")
  std::string pattern;  // the regex, without a "+:" / "-:" prefix
  bool exclude = false;  // "-:": the module stays float
  std::optional<int64_t> group_size;
  std::optional<bool> sym, desc_act;
};

struct GptqConfig {
  int64_t group_size = 128;  // −1: one group per row
  bool sym = true;
  bool desc_act = false;
  bool v2 = false;  // checkpoint_format "gptq_v2" (stored z) vs "gptq" (stored z − 1)
  bool lm_head = false;
  std::vector<GptqOverride> dynamic;
  nlohmann::ordered_json json;  // as stored, for inspect
};

/// Parses a GPTQ config object (key order kept: it orders `dynamic`); `where` prefixes errors. Refused (kUnsupported): bits (or a
/// dynamic bits) other than 4; checkpoint_format other than gptq / gptq_v2 (marlin, bitblas,
/// ipex, qqq, ...); a non-empty modules_in_block_to_quantize. Errors: wrong JSON types, an
/// invalid group_size, a dynamic key that is not a valid regex.
Result<GptqConfig> ParseGptqConfig(const nlohmann::ordered_json& qc, const std::string& where);

/// config.json's quantization_config against quantize_config.json: every key of the GPTQ
/// semantics both hold must be equal; the error names both files, the key and both values.
Status CheckGptqConfigsAgree(const nlohmann::ordered_json& a, const std::string& a_path, const nlohmann::ordered_json& b,
                             const std::string& b_path);

/// The plan for `module`: lm_head float unless lm_head true; the first dynamic entry matching
/// the name decides (exclude, or its overrides of the global spec); else the global spec.
Result<LinearPlan> ResolveGptq(const GptqConfig& c, const std::string& module);
Result<std::optional<QuantSpec>> ResolveGptqSpec(const GptqConfig& c, const std::string& module);

/// The GPTQ writer for the request (formats/gptq_writer.cc).
Result<std::unique_ptr<FormatWriter>> MakeGptqWriter(const ExportRequest& request);

}  // namespace nibble
