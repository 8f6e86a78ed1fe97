// Elementwise and row operations of the Llama forward pass (fp32, HF numerics).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/exp_f.h"  // ExpF
#include "kernels/vec_ops.h"  // ExpShiftedInPlace, vectorised per ISA
#include "model/config.h"

namespace nibble {

/// y[t,:] = x[t,:] / sqrt(mean(x[t,:]²) + eps) * weight, for t < rows; HF LlamaRMSNorm. Rows are
/// threaded when there are several (each row computed as alone). y may be x (in place).
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* y);

/// inv_freq per HF rope init (default, linear, llama3), [head_dim / 2].
std::vector<float> RopeInvFreq(const ModelConfig& c);

/// Applies RoPE (rotate_half convention) in place to `heads` heads of size head_dim stored
/// contiguously in `x`, using cos/sin rows [head_dim/2] of one position.
void ApplyRope(float* x, int64_t heads, int64_t head_dim, const float* cos, const float* sin);

/// out[i] = a[i] + b[i] for i < n; out may be a or b (threaded for large n; every element as
/// alone, so any split gives the same sums).
void Add(const float* a, const float* b, int64_t n, float* out);

/// x[i] = ExpF(x[i]).
void ExpInPlace(float* x, int64_t n);

/// In-place softmax over the first n entries of a row (max-subtracted, fp32; the sum runs in
/// index order).
void SoftmaxRow(float* row, int64_t n);

/// a[i] = silu(g[i]) * u[i].
void SiluMul(const float* g, const float* u, int64_t n, float* a);

}  // namespace nibble
