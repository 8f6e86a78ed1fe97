// Scalar reference GEMM for 4-bit weights with fp32 activations (W4A32), the executable
// definition every ISA kernel (kernels/x86_avx2/, kernels/x86_avx512/, ...) is tested against.
//
// Weight layout: the native unpacked layout of formats/int4_matrix.h, passed as raw pointers —
// kernels never include formats/ (docs/ARCHITECTURE.md "Layers"). Dequantization happens on the fly:
//   y[m][n] = bias[n] + Σ_k x[m][k] · ((codes[n][k] − zero_points[n][k/g]) · scales[n][k/g])
// accumulated in fp32 in increasing k. No allocation, no threads, no error values: argument
// problems are broken internal contracts and abort (check.h).
#pragma once

#include <cstdint>

namespace nibble {

/// Arguments of one W4A32 GEMM y = x · dequant(W)ᵀ (+ bias). All pointers row-major, unaliased
/// with y.
struct W4GemmArgs {
  int64_t m = 0;           // rows of x and y (tokens)
  int64_t n = 0;           // out_features
  int64_t k = 0;           // in_features
  int64_t group_size = 0;  // g along K, k % g == 0 (g == k for per-channel)
  const float* x = nullptr;              // [M, K] fp32
  const uint8_t* codes = nullptr;        // [N, K] unsigned codes 0..15, one per byte
  const float* scales = nullptr;         // [N, K / g] fp32
  const uint8_t* zero_points = nullptr;  // [N, K / g] unsigned 0..15 (8 for symmetric int4)
  const float* bias = nullptr;           // [N] fp32 or nullptr
  float* y = nullptr;                    // [M, N] fp32, overwritten
};

/// Computes y = x · dequant(W)ᵀ (+ bias) with fp32 accumulation, dequantizing each weight as
/// float(code − zero) · scale (exact up to the one product, same as formats' DequantizeRef).
/// Preconditions (abort with file:line otherwise): m, n, k >= 0; g >= 1 and k % g == 0 when k > 0;
/// non-null x/codes/scales/zero_points/y whenever the corresponding extent is non-zero.
void GemmW4A32Ref(const W4GemmArgs& args);

}  // namespace nibble
