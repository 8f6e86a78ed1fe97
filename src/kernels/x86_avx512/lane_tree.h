// The fixed lane tree that the AVX-512 opt-in kernels (W4A8 VNNI, bf16 activations) end each
// output with: lanes (l + 8), then (l + 4), (l + 2), (l + 1) — the order their scalar
// descriptions (kernels/int4_packed.h) specify. Include only from translation units compiled with
// AVX-512 F + DQ; internal linkage, so each such unit has its own copy built with its own flags.
#pragma once

#include <immintrin.h>

namespace nibble {
namespace {

/// Σ of the 16 fp32 lanes of `a` in the order ((l, l + 8), then + 4, + 2, + 1).
inline float ReduceTree(__m512 a) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  const __m128 h1 = _mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1));
  return _mm_cvtss_f32(h1);
}

}  // namespace
}  // namespace nibble
