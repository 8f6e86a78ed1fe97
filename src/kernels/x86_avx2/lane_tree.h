// The fixed 8-lane tree that the AVX2 kernels end each output with: lanes (l + 4), then (l + 2),
// (l + 1) — the order their scalar order models spell out. Include only from translation units
// compiled with AVX2; internal linkage, so each such unit has its own copy built with its flags.
#pragma once

#include <immintrin.h>

namespace nibble {
namespace {

/// Σ of the 8 fp32 lanes of `v` in the order ((l, l + 4), then + 2, + 1).
inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace
}  // namespace nibble
