// bf16-weight GEMV for AVX-512 (see kernels/bf16_gemv.h): per 16 weights one 32-byte load, a
// zero-extension to dwords and a 16-bit left shift (the exact bf16 → fp32 widening), one FMA.
// One row at a time (a sequential stream), four accumulators for runs of 64 weights, a masked
// 16-lane step for the K tail; reduced as (acc0 + acc1) + (acc2 + acc3).
#if defined(__x86_64__)

// GCC 12's _mm512_reduce_add_ps trips -Wuninitialized once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/x86_avx512/int4_gemm_avx512.h"

namespace nibble {
namespace {

inline __m512 Widen16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// Software prefetch into L2, 2 KiB ahead along the row (the row's end runs on into the next
// row): the best of the distances measured over K = 2048 / 4096 / 5632 (docs/PERFORMANCE.md
// "Dense linears").
constexpr int64_t kPrefetchWeights = 1024;

}  // namespace

void GemvBf16Avx512(int64_t k, const uint16_t* w, const float* x, const float* bias, float* y, int64_t n0, int64_t n1) {
  for (int64_t r = n0; r < n1; ++r) {
    const uint16_t* row = w + r * k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= k; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(row + i + kPrefetchWeights), _MM_HINT_T1);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), Widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i))), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), Widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i + 16))), a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), Widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i + 32))), a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), Widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i + 48))), a3);
    }
    for (; i < k; i += 16) {  // tail: 16-lane steps, the last one masked
      const int64_t left = k - i;
      const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
      const __m256i hv = _mm256_maskz_loadu_epi16(m, row + i);
      a0 = _mm512_fmadd_ps(xv, Widen16(hv), a0);
    }
    const float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    y[r] = bias != nullptr ? s + bias[r] : s;
  }
}

}  // namespace nibble

#endif  // __x86_64__
