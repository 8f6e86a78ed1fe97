// compressed-tensors `pack-quantized` (llm-compressor's W4A16 checkpoints) as a registry entry
// (formats/checkpoint_format.h): config in formats/compressed_tensors_config.h, engines in
// formats/compressed_tensors_engines.h.
//
// Tensors of a quantized linear P, N = out_features, K = in_features, g the group size (K for
// the channel strategy and when K < group_size), G = K / g (SPEC §2.2, TV-1, TV-5):
//   P.weight_packed      I32 [N, ceil(K / 8)]  packed along K: column 8c + j in nibble j of word c
//   P.weight_scale       F32/F16/BF16 [N, G]
//   P.weight_zero_point  I32 [ceil(N / 8), G]  asymmetric only; packed along N: output 8r + j in
//                                              nibble j of word (r, group)
//   P.weight_shape       I32/I64 [2] = [N, K]  (written as I64)
//   P.weight_g_idx       I32 [K]               actorder "group" only: the group of each column
// Nibbles hold the library's signed values + 8, which are the native codes and zero points
// (Int4Matrix) as they are: asymmetric nibble = uint4 code / zero point, symmetric nibble = q + 8
// with the implicit zero point 8. A symmetric layer stores no zero point (one that has one is
// refused, SPEC §9.3). Padding nibbles past N or K are written 0 and ignored on import. Every
// nibble value 0..15 is valid, so no zero-point nibble is refused.
// Non-goals (refused when the config is opened): other formats (marlin-24, int-quantized,
// float-quantized, naive-quantized, nvfp4 / mxfp4), num_bits ≠ 4, activation and KV-cache
// quantization, dynamic weights, sparse layouts, transforms.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/checkpoint_format.h"
#include "formats/compressed_tensors_config.h"

namespace nibble {

/// Decodes module `prefix`'s tensors in `store` for the resolved `spec` (expected N, K from
/// config.json), checking names, dtypes, shapes, weight_shape's values, scales (finite, not
/// negative), and the g_idx (length K, values < G, g columns per group; one other than the natural
/// k / g needs actorder "group"). Errors name the file, tensor, expected and found.
Result<Int4Matrix> ImportCtLinear(const TensorStore& store, const std::string& prefix, const QuantSpec& spec, int64_t n,
                                  int64_t k);

/// The tensors of one quantized linear (weight_g_idx only when m has a g_idx). Errors: m fails
/// ValidateInt4Matrix or disagrees with spec's symmetry; a scale `scale_dtype` cannot hold exactly
/// (names layer, row, group, value).
Result<std::vector<TensorToWrite>> ExportCtLinear(const std::string& prefix, const Int4Matrix& m, const QuantSpec& spec,
                                                  DType scale_dtype);

/// The quantization_config written for `request` (`g_idx_modules`: the modules written with a
/// weight_g_idx, which get actorder "group"): one config group per distinct spec in module order,
/// group_0 the most common one (targets "Linear" when every fused q/k/v and gate/up shard resolves
/// to it, so vLLM's fused layers resolve alike; else exact names), the others by exact name;
/// `ignore` every float linear by exact name (and an absent lm_head the class target would match).
nlohmann::ordered_json CtQuantizationConfig(const ExportRequest& request, const std::vector<std::string>& g_idx_modules);

/// The format of an already parsed config (tests).
std::unique_ptr<QuantizedFormat> MakeCompressedTensorsFormat(CtConfig config);

/// The registry entry ("compressed-tensors", --model_export compressed-tensors).
const FormatEntry& CompressedTensorsFormatEntry();

}  // namespace nibble
