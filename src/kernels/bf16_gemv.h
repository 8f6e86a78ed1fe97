// GEMV with bf16 weights and fp32 activations: the decode step of a dense linear whose checkpoint
// stores bf16 (lm_head kept in high precision, unquantized layers, bf16 fp models). bf16 → fp32 is
// exact (the 16 bits become the high half of the fp32 word), so keeping the weights as bf16 and
// widening them in registers gives the fp32 products of the widened matrix with half the memory
// traffic and half the resident bytes.
#pragma once

#include <cstdint>

namespace nibble {

/// y[r] = Σ_k x[k] · float(w[r][k]) (+ bias[r]) for rows r in [n0, n1).
/// w: [N, K] bf16 bit patterns (uint16, little-endian, row-major, `k` apart); x: [K] fp32;
/// bias: [N] or nullptr; y: [N] fp32. fp32 accumulation; each row's order is fixed by K alone
/// (16-lane accumulators, four of them for runs of 64), so results do not depend on the range.
using Bf16GemvKernel = void (*)(int64_t k, const uint16_t* w, const float* x, const float* bias, float* y, int64_t n0,
                                int64_t n1);

/// Scalar reference: per row, one fp32 accumulator in k order (fma).
void GemvBf16Scalar(int64_t k, const uint16_t* w, const float* x, const float* bias, float* y, int64_t n0, int64_t n1);

/// Widens [n, k] bf16 to fp32 (exact), rows threaded. out: [n, k].
void Bf16ToF32Rows(const uint16_t* w, int64_t n, int64_t k, float* out);

/// Threaded driver: splits N in fixed blocks over the OpenMP team and runs `kernel` (the active
/// dispatch's when nullptr). Bit-identical for any thread count. A misaligned x is read from a
/// 64-byte-aligned copy (AlignedActs; same values, so the same result).
void GemvBf16(int64_t n, int64_t k, const uint16_t* w, const float* x, const float* bias, float* y,
              Bf16GemvKernel kernel = nullptr);

/// Activation rows below which Bf16DenseLinear runs GemvBf16Rows instead of widening the whole
/// matrix to fp32 for the GEMM (a widening per call costs N·K stores, whatever m).
inline constexpr int64_t kBf16GemvMaxRows = 16;

/// The same for m activation rows (batched decode): x [m, K], y [m, N]. Each block of weight rows
/// is streamed from memory once and applied to every row while it is in cache; row i's result
/// is bit-identical to GemvBf16 on x row i alone.
void GemvBf16Rows(int64_t m, int64_t n, int64_t k, const uint16_t* w, const float* x, const float* bias, float* y,
                  Bf16GemvKernel kernel = nullptr);

}  // namespace nibble
