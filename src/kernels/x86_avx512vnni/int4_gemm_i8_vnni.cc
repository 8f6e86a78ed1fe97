// AVX-512 VNNI W4A8 GEMM (see int4_gemm_i8_vnni.h). Compiled with -mavx512vnni; called only after
// the dispatcher has checked CPUID (avx512_vnni) and XCR0.
#include "kernels/x86_avx512vnni/int4_gemm_i8_vnni.h"

#include <immintrin.h>

#include <algorithm>

namespace nibble {
namespace {


// The scalar kernel's lane tree: (l + 8), (l + 4), (l + 2), (l + 1).
inline float ReduceTree(__m512 a) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  const __m128 h1 = _mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1));
  return _mm_cvtss_f32(h1);
}

// One superblock of weight row `rec` (64 bytes of codes at `sb`) against MR activation rows;
// `parts` groups gi0 .. gi0 + parts − 1 (parts > 1 only when the superblock is a whole record).
template <int MR>
inline void Superblock(const W4PackedWeight& w, const W4Int8Acts* a, const uint8_t* rec, const uint8_t* sb, int64_t t,
                       int64_t gi0, int64_t parts, __m512* acc, float* corr) {
  const __m512i lo = _mm512_set1_epi8(0x0F);
  const __m512i s = _mm512_loadu_si512(sb);
  const __m512i A = _mm512_and_si512(s, lo), B = _mm512_and_si512(_mm512_srli_epi16(s, 4), lo);
  const int64_t np = a[0].parts;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t gi = gi0 + p;
    const float sc = w4p::Scale(rec, gi);
    const int z = w4p::Zero(w, rec, gi);
    // Bytes of part p in every dword lane: byte p (4 parts), bytes 2p, 2p + 1 (2 parts), all (1).
    const __m512i m = _mm512_set1_epi32(np == 1 ? -1 : (np == 4 ? static_cast<int>(0xFFu << (8 * p))
                                                                : static_cast<int>(0xFFFFu << (16 * p))));
    for (int i = 0; i < MR; ++i) {
      const int8_t* xp = a[i].x8 + t * 128;
      const __m512i xa = _mm512_and_si512(_mm512_loadu_si512(xp), m), xb = _mm512_and_si512(_mm512_loadu_si512(xp + 64), m);
      const __m512i v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), A, xa), B, xb);
      const float fs = sc * a[i].xs[t];
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(fs), _mm512_cvtepi32_ps(v), acc[i]);
      corr[i] = __builtin_fmaf(fs, static_cast<float>(z * a[i].sx[t * np + p]), corr[i]);
    }
  }
}

// Weight row r against activation rows a[0..MR): y[i * w.n + r].
template <int MR>
inline void Tile(const W4PackedWeight& w, const W4Int8Acts* a, const float* bias, float* y, int64_t r) {
  __m512 acc[MR];
  float corr[MR];
  for (int i = 0; i < MR; ++i) {
    acc[i] = _mm512_setzero_ps();
    corr[i] = 0.f;
  }
  const uint8_t* base = w.data + r * w.row_bytes;
  if (a[0].parts > 1) {
    // g = 32 / 64: a record is one superblock of `parts` groups; the last may be partial.
    for (int64_t t = 0; t < a[0].blocks; ++t) {
      const uint8_t* rec = base + t * w.rec_bytes;
      const int64_t parts =
          128 * (t + 1) <= w.k ? a[0].parts : (w.k - 128 * t + w.group_size - 1) / w.group_size;  // last, partial
      Superblock<MR>(w, a, rec, rec + w.rec_header, t, 0, parts, acc, corr);
    }
  } else {
    // g = 128·j: a record is one group of j superblocks.
    const int64_t spg = w.group_size / 128;
    for (int64_t ri = 0, t = 0; ri < w.recs; ++ri) {
      const uint8_t* rec = base + ri * w.rec_bytes;
      for (int64_t b = 0; b < spg; ++b, ++t) Superblock<MR>(w, a, rec, rec + w.rec_header + 64 * b, t, 0, 1, acc, corr);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const float v = ReduceTree(acc[i]) - corr[i];
    y[i * w.n + r] = bias != nullptr ? v + bias[r] : v;
  }
}

}  // namespace

void GemmW4A8Vnni(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y, int64_t n0,
                  int64_t n1) {
  // One weight row at a time streams W strictly sequentially (rows are contiguous), which the
  // hardware prefetchers follow best: measured 4096x11008 g128 M=1, 1 thread, weights past L3,
  // 1 row 16.7 GB/s, 2 rows 15.8, 4 rows 11.8, 8 rows 11.4. Up to 4 activation rows share each
  // unpacked superblock.
  for (int64_t r = n0; r < n1; ++r)
    for (int64_t i = 0; i < m; i += 4) {
      switch (std::min<int64_t>(4, m - i)) {
        case 4: Tile<4>(w, a + i, bias, y + i * w.n, r); break;
        case 3: Tile<3>(w, a + i, bias, y + i * w.n, r); break;
        case 2: Tile<2>(w, a + i, bias, y + i * w.n, r); break;
        default: Tile<1>(w, a + i, bias, y + i * w.n, r); break;
      }
    }
}

}  // namespace nibble
