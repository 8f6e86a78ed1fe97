// Elementwise and row operations of the Llama forward pass (fp32, HF numerics).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace nibble {

/// y[t,:] = x[t,:] / sqrt(mean(x[t,:]²) + eps) * weight, for t < rows; HF LlamaRMSNorm. Rows are
/// threaded when there are several (each row computed as alone).
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* y);

/// inv_freq per HF rope init (default, linear, llama3), [head_dim / 2].
std::vector<float> RopeInvFreq(const ModelConfig& c);

/// Applies RoPE (rotate_half convention) in place to `heads` heads of size head_dim stored
/// contiguously in `x`, using cos/sin rows [head_dim/2] of one position.
void ApplyRope(float* x, int64_t heads, int64_t head_dim, const float* cos, const float* sin);

/// exp(x) in fp32 without branches or calls, so loops over it vectorise: Cody-Waite range
/// reduction x = n·ln2 + r, a degree-6 polynomial for e^r on |r| <= ln2/2, then 2^n through the
/// exponent bits. Max relative error ~2 ulp on [-87, 88]; clamps outside (0 below, 2^128-ish
/// finite above; inputs here are max-subtracted logits or activations, never that large).
/// always_inline so that ExpShiftedInPlace's per-ISA clones inline and vectorise it.
__attribute__((always_inline)) inline float ExpF(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round to nearest even with the 1.5·2^23 trick (vectorises without SSE4.1's roundps).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f;  // ln2 high part (exact in fp32)
  r = r - n * 1.428606765330187e-06f;    // ln2 low part
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return p * scale;
}

/// out[i] = a[i] + b[i] for i < n; out may be a or b (threaded for large n; every element as
/// alone, so any split gives the same sums).
void Add(const float* a, const float* b, int64_t n, float* out);

/// x[i] = ExpF(x[i]).
void ExpInPlace(float* x, int64_t n);

/// row[i] = ExpF(row[i] + shift) for i < n, bit-identical to ExpF, vectorised (16 / 8 lanes
/// where the CPU has AVX-512 / AVX2, chosen at load time).
void ExpShiftedInPlace(float* row, int64_t n, float shift);

/// In-place softmax over the first n entries of a row (max-subtracted, fp32; the sum runs in
/// index order).
void SoftmaxRow(float* row, int64_t n);

/// a[i] = silu(g[i]) * u[i].
void SiluMul(const float* g, const float* u, int64_t n, float* a);

}  // namespace nibble
