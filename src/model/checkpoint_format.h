// Which weight format a model directory holds, and the LinearLoader that decodes it.
//
// Detection reads config.json's `quantization_config`: absent → dense; quant_method "quark" →
// AMD Quark hf_format (SPEC §1); anything else → an error naming the method (never a guess).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/quant_config.h"
#include "model/llama.h"

namespace nibble {

enum class CheckpointFormat { kDense, kQuark };

/// The format of one model directory plus its parsed quantization config (Quark only).
struct CheckpointInfo {
  CheckpointFormat format = CheckpointFormat::kDense;
  std::optional<QuarkQuantConfig> quark;
};

/// Reads `dir/config.json` and detects the format. Errors: unreadable / malformed config.json,
/// unsupported quant_method, every Quark config parse error.
Result<CheckpointInfo> DetectCheckpointFormat(const std::string& dir);

/// The loader for a Quark checkpoint: each module's config is resolved with Quark semantics;
/// quantized modules are imported into Int4Linear, others loaded dense. A module whose stored
/// tensors contradict its resolved config (quantized in the config but a float `weight` on disk,
/// or the reverse) is an error naming the module and the rule.
LinearLoader MakeQuarkLinearLoader(const QuarkQuantConfig& config);

/// Loads a model directory of any supported format.
Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, CheckpointInfo* info_out = nullptr);

/// Every linear module name of a model with this config, in execution order (decoder
/// projections of each layer, then "lm_head" unless tied without an lm_head tensor).
std::vector<std::string> LinearModuleNames(const ModelConfig& c, bool has_lm_head);

/// {N = out_features, K = in_features} of a linear module named as LinearModuleNames does.
std::pair<int64_t, int64_t> LinearShape(const ModelConfig& c, const std::string& name);

/// Short text for a spec: "uint4 per_group g128" / "int4 per_channel".
std::string DescribeSpec(const WeightQuantSpec& spec);

}  // namespace nibble
