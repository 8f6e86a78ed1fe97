// The one native in-memory int4 layout of a quantized linear layer.
//
// Every importer (Quark, AutoAWQ, compressed-tensors, GPTQ) decodes into Int4Matrix and every
// exporter reads from it, so formats are converted through one hub instead of pairwise. The
// layout is deliberately simple — one unsigned code per byte, row-major like the HF weight
// [N = out_features, K = in_features] — and is the executable definition of the dequantized
// value. Kernels use their own packed layouts derived from it (non-goal here).
//
// Convention (SPEC Appendix A, §1.5 "uint4b8"): codes and zero points are unsigned 0..15 and
//   w[n][k] = (codes[n*K + k] - zero_points[n*G + k/g]) * scales[n*G + k/g],   G = K / g.
// Asymmetric uint4 stores Quark's codes and zero points as is. Symmetric int4 stores the signed
// code q ∈ [-8, 7] as q + 8 with every zero point 8, which gives the same w = q * s.
// With a g_idx (GPTQ / compressed-tensors act-order) column k belongs to group g_idx[k] instead
// of k / g; every group still holds exactly g columns.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace nibble {

/// Quantized weight of one linear layer, unpacked (see the file comment for the formula).
struct Int4Matrix {
  int64_t n = 0;           // out_features (rows)
  int64_t k = 0;           // in_features (columns)
  int64_t group_size = 0;  // g along K; equals k for per-channel; k % g == 0
  std::vector<uint8_t> codes;        // [N, K] unsigned codes 0..15, one per byte
  std::vector<float> scales;         // [N, K / g] fp32 (values already rounded to the stored dtype)
  std::vector<uint8_t> zero_points;  // [N, K / g] unsigned 0..15; all 8 when symmetric
  bool symmetric = false;            // true: Quark int4 (zero points are 8)
  std::vector<int32_t> g_idx;        // [K] group of each column; empty = natural (k / g)

  /// Group of column c.
  int64_t GroupOf(int64_t c) const { return g_idx.empty() ? c / group_size : g_idx[static_cast<size_t>(c)]; }

  /// Groups per row G = K / g.
  int64_t groups() const { return group_size > 0 ? k / group_size : 0; }

  bool operator==(const Int4Matrix&) const = default;
};

/// Codes as some formats store them (Quark per_group): int32 words [K, ceil(N / 8)] packed along
/// N, transposed: word (kk, c) holds outputs 8c .. 8c+7 of input kk, output 8c + order[i] in
/// nibble i (bits 4i..4i+3); a stored nibble v is the code v ^ xor_mask (int4: 8, uint4: 0).
/// A loader can repack these words straight into its own layout without the one-byte-per-code
/// Int4Matrix::codes.
struct TransposedNibbleCodes {
  const uint8_t* words = nullptr;  // little-endian int32, K * ceil(N / 8) of them
  int order[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  uint8_t xor_mask = 0;
};

/// A module imported without decoding its codes: `matrix` as Import gives it but with `codes`
/// empty (scales, zero points, group size, symmetric all set and checked), and the stored codes.
struct DeferredInt4 {
  Int4Matrix matrix;
  TransposedNibbleCodes codes;
};

/// The one rule for a stored scale, applied by every reader (Quark, compressed-tensors, AutoAWQ,
/// GPTQ) and by ValidateInt4Matrix: finite and >= 0. Zero is an all-zero group (what RTN writes
/// for one); a negative scale flips the sign of its group, which no quantizer writes.
inline bool IsValidScale(float s) { return std::isfinite(s) && s >= 0; }
/// The error for a scale failing IsValidScale (kCorruptInput): "<where> is <s> (expected a finite
/// scale >= 0)", where `where` names the file, tensor, group and output.
Error InvalidScaleError(const std::string& where, float s);

/// Checks the invariants: n >= 1, k >= 1, 1 <= g <= k, k % g == 0, vector sizes N*K and N*G,
/// codes and zero points <= 15, zero points == 8 when symmetric, scales IsValidScale; a g_idx has K
/// entries in 0..G-1 with g columns in every group. `what` names the layer in errors
/// ("model.layers.0.mlp.up_proj: codes[3][17] = 16 out of range 0..15").
Status ValidateInt4Matrix(const Int4Matrix& m, const std::string& what);

/// Whether the columns' groups are the natural k / g (no g_idx, or one equal to it).
bool HasNaturalGroups(const Int4Matrix& m);

/// The same weight with its columns sorted by group (stable), so the groups are the natural ones
/// and no g_idx remains; perm[j] is the original column now at j, so y = W x equals
/// y = sorted(W) x' with x'[j] = x[perm[j]]. perm is empty when m already has natural groups.
/// Precondition: m satisfies ValidateInt4Matrix.
Int4Matrix SortColumnsByGroup(const Int4Matrix& m, std::vector<int32_t>* perm);

/// Dense fp32 dequantization out[n*K + k] = (code - zero) * scale (exact fp32 arithmetic:
/// the difference is a small integer, so the only rounding is the one product).
/// Precondition (aborts otherwise): m satisfies ValidateInt4Matrix's size invariants;
/// `out` has room for N*K floats.
void DequantizeRef(const Int4Matrix& m, float* out);

}  // namespace nibble
