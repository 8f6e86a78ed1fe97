// bf16-weight GEMV for AVX2 (see kernels/bf16_gemv.h): per 8 weights one 16-byte load, a
// zero-extension to dwords and a 16-bit left shift (the exact bf16 → fp32 widening), one FMA.
// One row at a time (a sequential stream), four accumulators for runs of 32 weights, 8-lane
// steps and then a zero-padded step for the K tail; reduced as (acc0 + acc1) + (acc2 + acc3) and
// the 8-lane tree.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>

#include "kernels/x86_avx2/int4_gemm_avx2.h"
#include "kernels/x86_avx2/lane_tree.h"

namespace nibble {
namespace {

inline __m256 Widen8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

inline __m128i Load8(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// Software prefetch into L2 2 KiB ahead along the row, as the AVX-512 GEMV.
constexpr int64_t kPrefetchWeights = 1024;

}  // namespace

void GemvBf16Avx2(int64_t k, const uint16_t* w, const float* x, const float* bias, float* y, int64_t n0, int64_t n1) {
  for (int64_t r = n0; r < n1; ++r) {
    const uint16_t* row = w + r * k;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
      _mm_prefetch(reinterpret_cast<const char*>(row + i + kPrefetchWeights), _MM_HINT_T1);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), Widen8(Load8(row + i)), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), Widen8(Load8(row + i + 8)), a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), Widen8(Load8(row + i + 16)), a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), Widen8(Load8(row + i + 24)), a3);
    }
    for (; i + 8 <= k; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), Widen8(Load8(row + i)), a0);
    if (i < k) {  // the last k − i < 8 weights, zero-padded (0 · 0 adds nothing)
      uint16_t wt[8] = {};
      float xt[8] = {};
      std::memcpy(wt, row + i, static_cast<size_t>(k - i) * sizeof(uint16_t));
      std::memcpy(xt, x + i, static_cast<size_t>(k - i) * sizeof(float));
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xt), Widen8(Load8(wt)), a0);
    }
    const float s = Hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    y[r] = bias != nullptr ? s + bias[r] : s;
  }
}

}  // namespace nibble

#endif  // __x86_64__
