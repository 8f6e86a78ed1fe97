// AVX2 W4A8 GEMM (see int4_gemm_i8_avx2.h). Compiled with -mavx2 -mfma; called only after the
// dispatcher has checked CPUID and XCR0.
//
// The 16 dword lanes of a superblock are two ymm halves: bytes 0..31 (lanes 0..7) and 32..63
// (lanes 8..15), paired with the same halves of the block's A and B activation bytes. Per half,
// vpmaddubsw(codes, x8) adds byte pairs into int16 (|15·127·2| = 3810, never saturating), the A
// and B products add in int16 (|sum| <= 7620) and vpmaddwd by ones adds pairs into the int32
// lane sum: exactly the VNNI kernel's `vpdpbusd` lanes, so float(v) and every fp32 step after it
// are the scalar kernel's.
#if defined(__x86_64__)

#include "kernels/x86_avx2/int4_gemm_i8_avx2.h"
#include "kernels/x86_avx2/lane_tree.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace nibble {
namespace {

struct Act {
  const int8_t* x8;
  const float* xs;
  const int32_t* sx;
};

// Σ of the 16 lanes lo (0..7), hi (8..15) in the scalar kernel's tree: l + 8, then Hsum's + 4,
// + 2, + 1.
inline float ReduceTree(__m256 lo, __m256 hi) { return Hsum(_mm256_add_ps(lo, hi)); }

// Int32 lane sums of codes A / B against activation bytes xa / xb (one half of a superblock).
inline __m256i LaneSums(__m256i A, __m256i B, __m256i xa, __m256i xb) {
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(A, xa), _mm256_maddubs_epi16(B, xb));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// One superblock of weight row `rec` (64 bytes of codes at `sb`, block t) against MR activation
// rows; kParts groups gi0 .. of the record (kParts > 1: g = 32 / 64, the superblock is the whole
// record), `parts` <= kParts of them inside K. acc[2i], acc[2i + 1]: row i's lanes 0..7, 8..15.
template <int MR, int kParts, bool kSym>
inline void Superblock(const uint8_t* rec, const uint8_t* sb, int64_t rec_groups, int64_t t, int64_t parts,
                       const Act* a, __m256* acc) {
  const __m256i lo = _mm256_set1_epi8(0x0F);
  const __m256i s0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb));
  const __m256i s1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 32));
  const __m256i A[2] = {_mm256_and_si256(s0, lo), _mm256_and_si256(s1, lo)};
  const __m256i B[2] = {_mm256_and_si256(_mm256_srli_epi16(s0, 4), lo), _mm256_and_si256(_mm256_srli_epi16(s1, 4), lo)};
  for (int64_t p = 0; p < (kParts == 1 ? 1 : parts); ++p) {
    float sc;
    __builtin_memcpy(&sc, rec + 4 * p, 4);
    const int z = kSym ? 8 : rec[4 * rec_groups + p];
    // Bytes of part p in every dword lane: byte p (4 parts), bytes 2p, 2p + 1 (2 parts).
    const __m256i m = _mm256_set1_epi32(kParts == 4 ? static_cast<int>(0xFFu << (8 * p))
                                                    : static_cast<int>(0xFFFFu << (16 * p)));
    for (int i = 0; i < MR; ++i) {
      const int8_t* xp = a[i].x8 + t * 128;
      const __m256 fs = _mm256_set1_ps(sc * a[i].xs[t]);
      // Lane 0 adds the zero-point term −z·Σx8: exact, in int32.
      const __m256i v0 = _mm256_setr_epi32(-z * a[i].sx[t * kParts + p], 0, 0, 0, 0, 0, 0, 0);
      for (int h = 0; h < 2; ++h) {
        __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 32 * h));
        __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 64 + 32 * h));
        if (kParts > 1) {
          xa = _mm256_and_si256(xa, m);
          xb = _mm256_and_si256(xb, m);
        }
        __m256i v = LaneSums(A[h], B[h], xa, xb);
        if (h == 0) v = _mm256_add_epi32(v, v0);
        acc[2 * i + h] = _mm256_fmadd_ps(fs, _mm256_cvtepi32_ps(v), acc[2 * i + h]);
      }
    }
  }
}

// Weight row r against activation rows a[0..MR): y[i * w.n + r].
template <int MR, int kParts, bool kSym>
void Tile(const W4PackedWeight& w, const W4Int8Acts* acts, const float* bias, float* y, int64_t r) {
  Act a[MR];
  for (int i = 0; i < MR; ++i) a[i] = {acts[i].x8, acts[i].xs, acts[i].sx};
  __m256 acc[2 * MR];
  for (int i = 0; i < 2 * MR; ++i) acc[i] = _mm256_setzero_ps();
  const uint8_t* base = w.data + r * w.row_bytes;
  const int64_t rec_bytes = w.rec_bytes, header = w.rec_header, rec_groups = w.rec_groups;
  if (kParts > 1) {
    // g = 32 / 64: a record is one superblock of kParts groups; the last may be partial.
    for (int64_t t = 0; t < acts[0].blocks; ++t) {
      const uint8_t* rec = base + t * rec_bytes;
      const int64_t parts = 128 * (t + 1) <= w.k ? kParts : (w.k - 128 * t + w.group_size - 1) / w.group_size;
      Superblock<MR, kParts, kSym>(rec, rec + header, rec_groups, t, parts, a, acc);
    }
  } else {
    // g = 128·j: a record is one group of j superblocks.
    const int64_t spg = w.group_size / 128;
    for (int64_t ri = 0, t = 0; ri < w.recs; ++ri) {
      const uint8_t* rec = base + ri * rec_bytes;
      for (int64_t b = 0; b < spg; ++b, ++t)
        Superblock<MR, 1, kSym>(rec, rec + header + 64 * b, rec_groups, t, 1, a, acc);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const float v = ReduceTree(acc[2 * i], acc[2 * i + 1]);
    y[i * w.n + r] = bias != nullptr ? v + bias[r] : v;
  }
}

// Decode (M = 1) when a record is one superblock (g = 128, or per-channel K = 128): Tile<1, 1,
// kSym>'s superblock step in one flat loop over the row's records, prefetching 4 KiB ahead as
// the other decode loops ("Decode prefetch" in docs/KERNELS.md).
constexpr int kRowPrefetchBytes = 4096;

template <bool kSym, StreamPrefetch P>
void RowG128(const W4PackedWeight& w, const W4Int8Acts& acts, const float* bias, float* y, int64_t r) {
  const Act a = {acts.x8, acts.xs, acts.sx};
  const int64_t rec_bytes = w.rec_bytes, header = w.rec_header;
  const uint8_t* rec = w.data + r * w.row_bytes;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
#pragma GCC unroll 4
  for (int64_t t = 0; t < acts.blocks; ++t, rec += rec_bytes) {
    PrefetchAhead<P>(rec, kRowPrefetchBytes);
    Superblock<1, 1, kSym>(rec, rec + header, 1, t, 1, &a, acc);
  }
  const float v = ReduceTree(acc[0], acc[1]);
  y[r] = bias != nullptr ? v + bias[r] : v;
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

template <StreamPrefetch P>
void GemmW4A8Avx2(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y, int64_t n0,
                  int64_t n1) {
  if (m == 0) return;
  if (m == 1 && a[0].parts == 1 && w.rec_weights == 128) {
    const auto row = w.symmetric ? RowG128<true, P> : RowG128<false, P>;
    for (int64_t r = n0; r < n1; ++r) row(w, a[0], bias, y, r);
    return;
  }
  // One weight row at a time streams W sequentially; up to 4 activation rows share each
  // unpacked superblock. Many rows (prefill) go kRowChunk at a time over the range's weight
  // rows, so that the chunk's activations stay in L2 instead of streaming past every weight row.
  const TileFn full = Select(a[0].parts, w.symmetric, 4), tail = Select(a[0].parts, w.symmetric, m % 4);
  constexpr int64_t kRowChunk = 32;
  for (int64_t i0 = 0; i0 < m; i0 += kRowChunk) {
    const int64_t i1 = std::min(m, i0 + kRowChunk);
    for (int64_t r = n0; r < n1; ++r) {
      int64_t i = i0;
      for (; i + 4 <= i1; i += 4) full(w, a + i, bias, y + i * w.n, r);
      if (i < i1) tail(w, a + i, bias, y + i * w.n, r);
    }
  }
}

template void GemmW4A8Avx2<StreamPrefetch::kNonTemporal>(const W4PackedWeight&, const W4Int8Acts*, int64_t,
                                                        const float*, float*, int64_t, int64_t);
template void GemmW4A8Avx2<StreamPrefetch::kL1>(const W4PackedWeight&, const W4Int8Acts*, int64_t, const float*, float*,
                                               int64_t, int64_t);

}  // namespace nibble

#endif  // __x86_64__
