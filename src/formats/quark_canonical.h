// The canonical form of a Quark quantization_config for one model: the config `quantize` writes,
// which vLLM, ONNX Runtime GenAI, Transformers and nibble resolve to the same per-linear spec.
//
// Why: engines read the same keys differently (SPEC §1.3, §1.8). Quark and Transformers fnmatch
// `exclude` and `layer_quant_config` keys; vLLM matches `exclude` by exact name or `re:` only and
// tests a key without `*` as a substring of it; ORT GenAI looks a per-layer spec up by the
// top-level module name only and vLLM never consults `layer_type_quant_config`. Exact module names
// mean the same to all of them, so the canonical config lists every decision by exact name.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "formats/quark_config.h"

namespace nibble {

/// `c` rewritten for a model whose linear modules are `modules` (execution order) such that every
/// module resolves the same under Quark's rules (ResolveLayer) and under exact-name-only rules:
/// * global_quant_config: the spec most quantized modules resolve to (ties: c's global if it is
///   among them), so that ORT GenAI, which reads per-layer specs by top-level name only, reads as
///   many modules right as one global spec allows;
/// * exclude: the entries of `c` that are plain names (no glob character `*?[`, no comma, no
///   `re:`, not empty) in their order, then the exact name of every other module kept in float, in
///   module order; a name in `absent` (a linear the checkpoint does not store, e.g. the lm_head of
///   a tied model) that would resolve quantized is excluded too, so the config never declares it;
/// * layer_quant_config: one key per quantized module whose spec is not the global one, the
///   module's exact name, in module order (globs, comma-separated, `re:` and unused keys of `c`
///   are replaced by the names they decided);
/// * layer_type_quant_config: empty (vLLM never reads it; what it decided is in the above);
/// * everything else unchanged. A canonical config is its own canonical form.
/// Errors: as ResolveLayer.
Result<QuarkQuantConfig> CanonicalQuarkConfig(const QuarkQuantConfig& c, const std::vector<std::string>& modules,
                                              const std::vector<std::string>& absent);

/// Whether `entry` is a plain layer name: no glob character, no `re:` prefix, not empty.
bool IsPlainLayerName(const std::string& entry);

}  // namespace nibble
