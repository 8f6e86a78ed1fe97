// AMD Quark hf_format (custom_mode "quark", weight_format "real_quantized") tensors of one 4-bit
// linear layer <-> the native Int4Matrix (SPEC §1.4, §1.5, §1.6, Appendix A).
//
// Layout implemented, for a layer with prefix P, N = out_features, K = in_features, G = K / g:
//   per_group (ch_axis 1; also group_size −1, i.e. g = K) — transposed, packed along N:
//     P.weight             int32 [K, ceil(N / 8)]   word (k, c) holds outputs 8c .. 8c+7 of input k
//     P.weight_scale       F32/F16/BF16 [G, N]
//     P.weight_zero_point  int32 [G, ceil(N / 8)]   same packing as the weight
//   per_channel (ch_axis 0, group_size −1) — not transposed, packed along K (SPEC §1.4 "Per-channel
//   int4 is NOT transposed: weight [out, ceil(in/8)] packed along the input dim; scale [out];
//   zero point [out/8]"; we read "[out/8]" as a 1-D tensor packed along N, width ceil(N / 8)):
//     P.weight             int32 [N, ceil(K / 8)]   word (n, c) holds inputs 8c .. 8c+7 of output n
//     P.weight_scale       F32/F16/BF16 [N]
//     P.weight_zero_point  int32 [ceil(N / 8)]
// Nibble order inside a word: element 8c + j sits in nibble i where order_map[i] = j, order_map =
// [0,2,4,6,1,3,5,7] (reorder) or [0..7] (order); nibble i = bits 4i..4i+3. Padding nibbles past
// the end of the packed dimension are written as 0 and ignored on import.
// Nibble values: uint4 stores the code / zero point as is; int4 stores the signed value q as the
// two's-complement nibble q & 0xF, i.e. native code (q + 8) XOR 8; int4 zero points are 0, so every
// int4 zero-point word is 0.
// Non-goals: fake_quantized weights (a float P.weight; the model loader reads it as dense),
// multi-stage `_2` tensors, custom_mode "awq" names (qweight/scales/qzeros) — same layout, other
// names; a later importer can reuse the views function below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/int4_matrix.h"
#include "formats/quark_config.h"
#include "io/safetensors.h"

namespace nibble {

/// Packs 8 nibbles (elements 0..7 of a run along the packed dimension; values 0..15) into one
/// word with the order map of `pack` (SPEC §1.5; TV-2: codes 1..8 → order 0x87654321,
/// reorder 0x86427531).
uint32_t PackNibbleWord(const uint8_t nibbles[8], PackMethod pack);

/// Inverse of PackNibbleWord: element j of the run ← its nibble.
void UnpackNibbleWord(uint32_t word, PackMethod pack, uint8_t nibbles[8]);

/// Shapes of the three Quark tensors for a layer of N outputs and K inputs (see file comment).
struct QuarkTensorShapes {
  std::vector<int64_t> weight;             // per_group [K, ceil(N/8)]; per_channel [N, ceil(K/8)]
  std::vector<int64_t> weight_scale;       // per_group [G, N];         per_channel [N]
  std::vector<int64_t> weight_zero_point;  // per_group [G, ceil(N/8)]; per_channel [ceil(N/8)]
};

/// Computes the shapes without touching data (TV-5: K = 4096, N = 14336, g = 128 → weight
/// [4096, 1792], weight_scale [32, 14336], weight_zero_point [32, 1792]).
/// Errors: n < 1, k < 1, invalid group size, K not a multiple of g (names N, K, g).
Result<QuarkTensorShapes> QuarkLinearShapes(const WeightQuantSpec& spec, int64_t n, int64_t k);

/// The three tensors written for one quantized linear (names "<prefix>.weight", ...).
struct QuarkLinearTensors {
  TensorToWrite weight;             // I32, packed codes
  TensorToWrite weight_scale;       // scale_dtype
  TensorToWrite weight_zero_point;  // I32, packed zero points
};

/// Packs `m` into Quark tensors for layer `prefix` (e.g. "model.layers.0.self_attn.q_proj").
/// Scales are rounded to `scale_dtype` (the model dtype for scale_type "float", SPEC §1.4).
/// Errors: m fails ValidateInt4Matrix; spec inconsistent with m (int4 ⇔ m.symmetric; group size:
/// spec g, or K for −1 / per_channel); scale_dtype not F32/F16/BF16; a scale overflowing F16.
Result<QuarkLinearTensors> ExportQuarkLinear(const std::string& prefix, const Int4Matrix& m, const WeightQuantSpec& spec,
                                             PackMethod pack, DType scale_dtype);

/// The stored tensors of one layer, as found in a checkpoint (any may be nullptr = missing).
struct QuarkLinearViews {
  const TensorView* weight = nullptr;
  const TensorView* weight_scale = nullptr;
  const TensorView* weight_zero_point = nullptr;
};

/// Finds one layer's tensors in `store`. Real Quark exports spell the scale and zero point either
/// flat, `P.weight_scale` / `P.weight_zero_point` (what nibble writes), or after the quantizer
/// submodule, `P.weight_quantizer.scale` / `P.weight_quantizer.zero_point` (ONNX Runtime GenAI
/// renames these to the flat names on load, SPEC §1.8). Either is read; a missing one stays
/// nullptr. Errors: both spellings of one tensor stored (names both).
Result<QuarkLinearViews> FindQuarkLinearViews(const TensorStore& store, const std::string& prefix);
/// The suffixes FindQuarkLinearViews reads, flat spellings first.
const std::vector<std::string>& QuarkTensorSuffixes();

/// The names, dtypes, shapes and byte counts of ImportQuarkLinear's checks, without decoding.
Status CheckQuarkLinearTensors(const QuarkLinearViews& views, const std::string& prefix, const WeightQuantSpec& spec,
                               int64_t expected_n, int64_t expected_k);

/// Decodes one layer into the native layout, checking everything against the resolved `spec`
/// and the model's expected N (out_features) and K (in_features): every tensor present; weight
/// and zero point I32, scale F32/F16/BF16; exact shapes per QuarkLinearShapes; scales finite;
/// for int4 every (non-padding) zero-point nibble 0. Errors name the tensor, expected and found,
/// e.g. "tensor model.layers.0.mlp.up_proj.weight: shape [4096, 1791], expected [4096, 1792]
/// (Quark uint4 per_group g=128, N=14336, K=4096)" or "tensor P.weight_zero_point: zero point
/// nibble 3 out of range for symmetric int4 (group 0, output 5; expected 0)".
Result<Int4Matrix> ImportQuarkLinear(const QuarkLinearViews& views, const std::string& prefix, const WeightQuantSpec& spec,
                                     PackMethod pack, int64_t expected_n, int64_t expected_k);

/// ImportQuarkLinear without decoding the codes of a per_group layer (the transposed words,
/// DeferredInt4); nullopt for per_channel. Same errors.
Result<std::optional<DeferredInt4>> ImportQuarkLinearDeferred(const QuarkLinearViews& views, const std::string& prefix,
                                                              const WeightQuantSpec& spec, PackMethod pack,
                                                              int64_t expected_n, int64_t expected_k);

/// Same, looking the three tensors up in `store` with FindQuarkLinearViews.
Result<Int4Matrix> ImportQuarkLinear(const TensorStore& store, const std::string& prefix, const WeightQuantSpec& spec,
                                     PackMethod pack, int64_t expected_n, int64_t expected_k);

}  // namespace nibble
