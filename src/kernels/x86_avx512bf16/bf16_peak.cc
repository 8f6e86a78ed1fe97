#include "kernels/x86_avx512bf16/bf16_peak.h"

#include <immintrin.h>

namespace nibble {

float Bf16DotPeakAvx512(int64_t iters, float seed) {
  // 12 chains cover vdpbf16ps's latency at two issues per cycle; the operands are tiny so the
  // accumulators stay finite for any iteration count.
  const __m512 s = _mm512_set1_ps(seed * 1e-30f);
  const __m512bh a = _mm512_cvtne2ps_pbh(s, s), b = _mm512_cvtne2ps_pbh(s, _mm512_set1_ps(1e-30f));
  __m512 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  }
  __m512 t = acc[0];
  for (int j = 1; j < 12; ++j) t = _mm512_add_ps(t, acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, t);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

}  // namespace nibble
