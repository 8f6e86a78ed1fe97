// What serving engines make of a compressed-tensors config: per linear, what nibble, Transformers
// (the compressed-tensors library), vLLM and ONNX Runtime GenAI resolve, against what the file
// means (nibble's reading, compressed_tensors_config.h), and vLLM tensor-parallel readiness.
//
// Engine models (what each reads, from its source; SPEC §2.2, §9.2):
// * Transformers (compressed-tensors match_targets / apply_quantization_config): `ignore` by name,
//   `re:` or class wins; else the matching targets ordered exact name, then `re:`, then class,
//   each kind in sorted (string) order, and the first one's group; no fused layers; a tied model
//   runs the embedding as lm_head.
// * vLLM (compressed_tensors.py get_scheme, utils.py should_ignore_layer / find_matched_target):
//   runs q/k/v as one `qkv_proj` (QKVParallelLinear) and gate/up as `gate_up_proj`
//   (MergedColumnParallelLinear); o/down are RowParallelLinear. `ignore` entries match by name or
//   `re:` only (no class), a fused layer is ignored when its shards are, and shards that disagree
//   fail to load. Otherwise, in the flattened target order: the first target equal to the layer
//   name or whose regex matches it; else the first target contained (case-insensitively) in the
//   layer's class name ("Linear" is); else, for a fused layer, the first shard's target when every
//   shard matches one by name or regex. A layer no target matches fails to load. Shards of one
//   fused layer that mean different specs fail to load (one scheme is created for the fused
//   weight). lm_head is a ParallelLMHead, not a linear: a quantized lm_head fails to load; a tied
//   model runs the embedding. W4A16 group / channel, symmetric or not, act-order g_idx: supported.
// * ONNX Runtime GenAI (src/python/py/models/quantized_model.py QuantModel.from_pretrained): knows
//   quant_method awq, gptq, olive, quark, modelopt only; "compressed-tensors" raises
//   NotImplementedError, so no linear of such a checkpoint loads.
#pragma once

#include <vector>

#include "base/result.h"
#include "formats/compressed_tensors_config.h"
#include "formats/engines.h"

namespace nibble {

/// The report for `c` over `linears`; `tied` is the model's tie_word_embeddings.
/// Errors: as ResolveCt.
Result<EnginesReport> ReportCtEngines(const CtConfig& c, const std::vector<LinearShapeInfo>& linears, bool tied);

/// nibble's reading of `c` (ResolveCt) as the neutral resolver; `c` must outlive it.
SpecResolver CtSpecResolver(const CtConfig& c);

}  // namespace nibble
