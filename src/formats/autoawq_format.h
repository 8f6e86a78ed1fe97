// AutoAWQ GEMM checkpoints (quant_method "awq", version "gemm"; SPEC §2.3, §9.5) as a registry
// entry (formats/checkpoint_format.h).
//
// Layout per quantized linear P (N = out_features, K = in_features, g = group_size, G = K / g):
//   P.qweight  int32 [K, N / 8]  word (k, c) holds the codes of outputs 8c..8c+7 of input k
//   P.qzeros   int32 [G, N / 8]  the zero points, packed the same way
//   P.scales   fp16  [G, N]
//   P.bias     optional, float [N]
// Nibble order inside a word: AutoAWQ's order_map [0,2,4,6,1,3,5,7] (PackMethod::kReorder, the
// same as Quark `reorder`). N % 8 must be 0: AutoAWQ asserts it and has no padding rule.
// Config: bits / w_bit (4), group_size / q_group_size, zero_point (false reads every zero as 8,
// i.e. symmetric), version (case-insensitive "gemm"; gemv, gemv_fast, marlin, exllama, ipex are
// refused), modules_to_not_convert (null or a list; a module is kept in float when an entry is a
// substring of its name, as AutoAWQ, Transformers and vLLM match it). lm_head stays float unless
// the config says "lm_head": true (vLLM's AWQ-Marlin key).
// Writing: asymmetric uint4 per_group with one global group size and fp16 scales only; float
// linears are listed in modules_to_not_convert by exact name.
#pragma once

#include "formats/checkpoint_format.h"

namespace nibble {

/// The registry entry ("awq", --model_export awq).
const FormatEntry& AutoAwqFormatEntry();

}  // namespace nibble
