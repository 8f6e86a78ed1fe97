// AVX-512 VNNI W4A8 GEMM (see int4_gemm_i8_vnni.h). Compiled with -mavx512vnni; called only after
// the dispatcher has checked CPUID (avx512_vnni) and XCR0.
#include "kernels/x86_avx512vnni/int4_gemm_i8_vnni.h"

// GCC 12's avx512fintrin.h builds _mm512_castps512_ps256 and friends from deliberately undefined
// vectors (_mm512_undefined_*), which -Wuninitialized reports once inlined (GCC bug 105593);
// nothing in this file is uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

namespace nibble {
namespace {


// The scalar kernel's lane tree: (l + 8), (l + 4), (l + 2), (l + 1).
inline float ReduceTree(__m512 a) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  const __m128 h1 = _mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1));
  return _mm_cvtss_f32(h1);
}

// Activation row views hoisted into locals (the loops below then keep them in registers).
struct Act {
  const int8_t* x8;
  const float* xs;
  const int32_t* sx;
};

// One superblock of weight row `rec` (64 bytes of codes at `sb`, block t) against MR activation
// rows; kParts groups gi0 .. gi0 + kParts − 1 of the record (kParts > 1: g = 32 / 64, the superblock
// is the whole record), `parts` <= kParts of them inside K.
template <int MR, int kParts, bool kSym>
inline void Superblock(const uint8_t* rec, const uint8_t* sb, int64_t rec_groups, int64_t t, int64_t gi0, int64_t parts,
                       const Act* a, __m512* acc, float* corr) {
  const __m512i lo = _mm512_set1_epi8(0x0F);
  const __m512i s = _mm512_loadu_si512(sb);
  const __m512i A = _mm512_and_si512(s, lo), B = _mm512_and_si512(_mm512_srli_epi16(s, 4), lo);
  for (int64_t p = 0; p < (kParts == 1 ? 1 : parts); ++p) {
    const int64_t gi = gi0 + p;
    float sc;
    __builtin_memcpy(&sc, rec + 4 * gi, 4);
    const int z = kSym ? 8 : rec[4 * rec_groups + gi];
    for (int i = 0; i < MR; ++i) {
      const int8_t* xp = a[i].x8 + t * 128;
      __m512i xa = _mm512_loadu_si512(xp), xb = _mm512_loadu_si512(xp + 64);
      if (kParts > 1) {
        // Bytes of part p in every dword lane: byte p (4 parts), bytes 2p, 2p + 1 (2 parts).
        const __m512i m = _mm512_set1_epi32(kParts == 4 ? static_cast<int>(0xFFu << (8 * p))
                                                        : static_cast<int>(0xFFFFu << (16 * p)));
        xa = _mm512_and_si512(xa, m);
        xb = _mm512_and_si512(xb, m);
      }
      const __m512i v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), A, xa), B, xb);
      const float fs = sc * a[i].xs[t];
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(fs), _mm512_cvtepi32_ps(v), acc[i]);
      corr[i] = __builtin_fmaf(fs, static_cast<float>(z * a[i].sx[t * kParts + p]), corr[i]);
    }
  }
}

// Weight row r against activation rows a[0..MR): y[i * w.n + r].
template <int MR, int kParts, bool kSym>
void Tile(const W4PackedWeight& w, const W4Int8Acts* acts, const float* bias, float* y, int64_t r) {
  Act a[MR];
  for (int i = 0; i < MR; ++i) a[i] = {acts[i].x8, acts[i].xs, acts[i].sx};
  __m512 acc[MR];
  float corr[MR];
  for (int i = 0; i < MR; ++i) {
    acc[i] = _mm512_setzero_ps();
    corr[i] = 0.f;
  }
  const uint8_t* base = w.data + r * w.row_bytes;
  const int64_t rec_bytes = w.rec_bytes, header = w.rec_header, rec_groups = w.rec_groups;
  if (kParts > 1) {
    // g = 32 / 64: a record is one superblock of kParts groups; the last may be partial.
    const int64_t blocks = acts[0].blocks;
    for (int64_t t = 0; t < blocks; ++t) {
      const uint8_t* rec = base + t * rec_bytes;
      const int64_t parts =
          128 * (t + 1) <= w.k ? kParts : (w.k - 128 * t + w.group_size - 1) / w.group_size;  // last, partial
      Superblock<MR, kParts, kSym>(rec, rec + header, rec_groups, t, 0, parts, a, acc, corr);
    }
  } else {
    // g = 128·j: a record is one group of j superblocks.
    const int64_t spg = w.group_size / 128, recs = w.recs;
    for (int64_t ri = 0, t = 0; ri < recs; ++ri) {
      const uint8_t* rec = base + ri * rec_bytes;
      for (int64_t b = 0; b < spg; ++b, ++t)
        Superblock<MR, 1, kSym>(rec, rec + header + 64 * b, rec_groups, t, 0, 1, a, acc, corr);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const float v = ReduceTree(acc[i]) - corr[i];
    y[i * w.n + r] = bias != nullptr ? v + bias[r] : v;
  }
}

using TileFn = void (*)(const W4PackedWeight&, const W4Int8Acts*, const float*, float*, int64_t);

template <int kParts, bool kSym>
TileFn TileFor(int64_t mr) {
  switch (mr) {
    case 4: return Tile<4, kParts, kSym>;
    case 3: return Tile<3, kParts, kSym>;
    case 2: return Tile<2, kParts, kSym>;
    default: return Tile<1, kParts, kSym>;
  }
}

TileFn Select(int64_t parts, bool sym, int64_t mr) {
  if (parts == 4) return sym ? TileFor<4, true>(mr) : TileFor<4, false>(mr);
  if (parts == 2) return sym ? TileFor<2, true>(mr) : TileFor<2, false>(mr);
  return sym ? TileFor<1, true>(mr) : TileFor<1, false>(mr);
}

}  // namespace

void GemmW4A8Vnni(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y, int64_t n0,
                  int64_t n1) {
  if (m == 0) return;
  // One weight row at a time streams W strictly sequentially (rows are contiguous), which the
  // hardware prefetchers follow best: measured 4096x11008 g128 M=1, 1 thread, weights past L3,
  // 1 row 16.7 GB/s, 2 rows 15.8, 4 rows 11.8, 8 rows 11.4. Up to 4 activation rows share each
  // unpacked superblock.
  const TileFn full = Select(a[0].parts, w.symmetric, 4), tail = Select(a[0].parts, w.symmetric, m % 4);
  for (int64_t r = n0; r < n1; ++r) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) full(w, a + i, bias, y + i * w.n, r);
    if (i < m) tail(w, a + i, bias, y + i * w.n, r);
  }
}

}  // namespace nibble
