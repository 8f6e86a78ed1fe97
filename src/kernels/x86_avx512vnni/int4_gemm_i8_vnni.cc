// AVX-512 VNNI W4A8 GEMM (see int4_gemm_i8_vnni.h). Compiled with -mavx512vnni; called only after
// the dispatcher has checked CPUID (avx512_vnni) and XCR0.
#if defined(__x86_64__)

#include "kernels/x86_avx512vnni/int4_gemm_i8_vnni.h"

// GCC 12's avx512fintrin.h builds _mm512_castps512_ps256 and friends from deliberately undefined
// vectors (_mm512_undefined_*), which -Wuninitialized reports once inlined (GCC bug 105593);
// nothing in this file is uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/x86_avx512/lane_tree.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace nibble {
namespace {


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
                       const Act* a, __m512* acc) {
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
      // Lane 0 starts at the zero-point term −z·Σx8: the subtraction is exact, in int32.
      const __m512i v0 = _mm512_maskz_set1_epi32(1, -z * a[i].sx[t * kParts + p]);
      const __m512i v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(v0, A, xa), B, xb);
      const float fs = sc * a[i].xs[t];
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(fs), _mm512_cvtepi32_ps(v), acc[i]);
    }
  }
}

// Weight row r against activation rows a[0..MR): y[i * w.n + r].
template <int MR, int kParts, bool kSym>
void Tile(const W4PackedWeight& w, const W4Int8Acts* acts, const float* bias, float* y, int64_t r) {
  Act a[MR];
  for (int i = 0; i < MR; ++i) a[i] = {acts[i].x8, acts[i].xs, acts[i].sx};
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const uint8_t* base = w.data + r * w.row_bytes;
  const int64_t rec_bytes = w.rec_bytes, header = w.rec_header, rec_groups = w.rec_groups;
  if (kParts > 1) {
    // g = 32 / 64: a record is one superblock of kParts groups; the last may be partial.
    const int64_t blocks = acts[0].blocks;
    for (int64_t t = 0; t < blocks; ++t) {
      const uint8_t* rec = base + t * rec_bytes;
      const int64_t parts =
          128 * (t + 1) <= w.k ? kParts : (w.k - 128 * t + w.group_size - 1) / w.group_size;  // last, partial
      Superblock<MR, kParts, kSym>(rec, rec + header, rec_groups, t, 0, parts, a, acc);
    }
  } else {
    // g = 128·j: a record is one group of j superblocks.
    const int64_t spg = w.group_size / 128, recs = w.recs;
    for (int64_t ri = 0, t = 0; ri < recs; ++ri) {
      const uint8_t* rec = base + ri * rec_bytes;
      for (int64_t b = 0; b < spg; ++b, ++t)
        Superblock<MR, 1, kSym>(rec, rec + header + 64 * b, rec_groups, t, 0, 1, a, acc);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const float v = ReduceTree(acc[i]);
    y[i * w.n + r] = bias != nullptr ? v + bias[r] : v;
  }
}

// Decode (M = 1) when a record is one superblock (g = 128, or per-channel K = 128): Tile<1, 1,
// kSym>'s superblock step (so bit-identical to it and to the scalar kernel) in one flat loop over
// the records (RowsG128). The general tile's nested record / superblock loops cost about as many scalar
// instructions per superblock as the vector work (docs/PERFORMANCE.md "Decode loop at g = 128").
constexpr int kRowPrefetchBytes = 4096;  // as the W4A32 row GEMV (x86_avx512/int4_gemm_avx512.cc)

// Rows r .. r + NR − 1 visited in chunks of `chunk` superblocks (chunk c of every row, then c + 1),
// each row adding its superblocks in order into its own accumulator: every NR and chunk gives the
// one-row bits. As the bf16 loop (x86_avx512bf16/int4_gemm_bf16.cc): past the L1 data cache a
// row's activations came from L2 again for every row (docs/PERFORMANCE.md "Long rows"); in chunks
// they serve all NR rows from L1.
// One row prefetches kRowPrefetchBytes ahead, in chunks a record the same record of its row's
// next chunk.
template <int NR, bool kSym, StreamPrefetch P>
void RowsG128(const W4PackedWeight& w, const W4Int8Acts& acts, const float* bias, float* y, int64_t r, int64_t chunk) {
  const Act a = {acts.x8, acts.xs, acts.sx};
  const int64_t rec_bytes = w.rec_bytes, header = w.rec_header, blocks = acts.blocks;
  const int64_t ahead = NR == 1 ? kRowPrefetchBytes : chunk * rec_bytes;
  const uint8_t* row0 = w.data + r * w.row_bytes;
  __m512 acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < blocks; c0 += chunk) {
    const int64_t c1 = std::min(blocks, c0 + chunk);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const uint8_t* rec = row0 + j * w.row_bytes + c0 * rec_bytes;
      // Unrolled by four records (fewer cycles per record than rolled; 2 and 8 measured alike;
      // docs/PERFORMANCE.md "Decode loop at g = 128").
#pragma GCC unroll 4
      for (int64_t t = c0; t < c1; ++t, rec += rec_bytes) {
        PrefetchAhead<P>(rec, ahead);
        Superblock<1, 1, kSym>(rec, rec + header, 1, t, 0, 1, &a, &acc[j]);
      }
    }
  }
  for (int j = 0; j < NR; ++j) {
    const float v = ReduceTree(acc[j]);
    y[r + j] = bias != nullptr ? v + bias[r + j] : v;
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

// ---- Large M, one group part per block (g a multiple of 128): 16 weight rows in the lanes. ----
//
// The per-row tiles above spend a cvt + fma (and the activation loads) on every 128 products of
// one (activation row, weight row) pair. With many activation rows it pays to turn the 16 rows of
// a work item into the lanes instead: for block t, T[h][l] holds, in lane n, the 4 codes of
// weight row n that dword lane l of its superblock's low (h = 0) / high (h = 1) nibbles pairs with
// (the bytes GemmW4A8PackedScalar multiplies with A[4l..4l+3] / B[4l..4l+3]). One vpdpbusd of
// T[h][l] with the broadcast activation dword then yields that lane-l partial sum for all 16
// rows at once, and the per-lane accumulators acc[l] (lanes = rows) follow the scalar kernel's
// arithmetic step for step: fs = s·xs[t], v_0 starting at −z·sx[t] (16 rows' zero points times the
// block's Σx8, exact in int32), acc[l] = fma(fs, float(v_l), acc[l]), the (l + 8, l + 4, l + 2,
// l + 1) tree, + bias — bit-identical to it, so to every other tiling. T is built (a 16×16 dword
// transpose of the 16 superblocks) once per chunk of kChunkBlocks blocks (16 KB, L1) and reused by
// every activation row; each row's 16 accumulators wait in a per-thread buffer between chunks and
// lane halves.
// From 6 rows on the lanes beat the per-row tiles (docs/PERFORMANCE.md "Lanes GEMM for many rows").
constexpr int64_t kLanesMinRows = 6;
constexpr int64_t kChunkBlocks = 8;
// Activation rows per LaneRows call: bounds a worker's accumulator buffer (1 KiB per row) to
// 128 KiB whatever M; each chunk is still shared by 128 rows.
constexpr int64_t kLaneRowsMax = 128;

struct LaneChunk {
  alignas(64) uint32_t T[kChunkBlocks][2][16][16];  // [block][h][l][row] 4 codes per dword
  alignas(64) float S[kChunkBlocks][16];            // scale of each row's group
  alignas(64) int32_t NZ[kChunkBlocks][16];         // minus each row's zero point
};

// c[j] (lane i) = r[i] (lane j): 16×16 dword transpose in four shuffle stages.
inline void Transpose16(const __m512i r[16], __m512i c[16]) {
  __m512i a[16], b[16];
  for (int k = 0; k < 8; ++k) {  // 32-bit interleave of row pairs, per 128-bit lane
    a[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {  // b[4k + m], 128-bit lane q: rows 4k..4k+3 at column 4q + m
    b[4 * k + 0] = _mm512_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 1] = _mm512_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
    b[4 * k + 2] = _mm512_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
    b[4 * k + 3] = _mm512_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
  }
  for (int m = 0; m < 4; ++m) {  // column 4q + m: lane q of b[m], b[4 + m], b[8 + m], b[12 + m]
    const __m512i e0 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0x44), e1 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0xEE);
    const __m512i f0 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0x44), f1 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0xEE);
    c[m] = _mm512_shuffle_i32x4(e0, f0, 0x88);
    c[4 + m] = _mm512_shuffle_i32x4(e0, f0, 0xDD);
    c[8 + m] = _mm512_shuffle_i32x4(e1, f1, 0x88);
    c[12 + m] = _mm512_shuffle_i32x4(e1, f1, 0xDD);
  }
}

void BuildChunk(const W4PackedWeight& w, int64_t r0, int64_t t0, int64_t nb, LaneChunk& c) {
  const int64_t spg = w.rec_weights / 128;  // superblocks per record (= per group)
  const __m512i lo = _mm512_set1_epi32(0x0F0F0F0F);
  for (int64_t tt = 0; tt < nb; ++tt) {
    const int64_t t = t0 + tt;
    __m512i rows[16], cols[16];
    for (int n = 0; n < 16; ++n) {
      const uint8_t* rec = w.data + (r0 + n) * w.row_bytes + (t / spg) * w.rec_bytes;
      rows[n] = _mm512_loadu_si512(rec + w.rec_header + 64 * (t % spg));
      c.S[tt][n] = w4p::Scale(rec, 0);
      c.NZ[tt][n] = -w4p::Zero(w, rec, 0);
    }
    Transpose16(rows, cols);
    for (int l = 0; l < 16; ++l) {
      _mm512_store_si512(c.T[tt][0][l], _mm512_and_si512(cols[l], lo));
      _mm512_store_si512(c.T[tt][1][l], _mm512_and_si512(_mm512_srli_epi32(cols[l], 4), lo));
    }
  }
}

struct alignas(64) Lanes {
  float v[16];
};

// Lanes kL0 .. kL0 + 7 of activation rows i0 .. i0 + R − 1 (R = 1, 2) over the chunk's blocks; the
// eight accumulators per row come from / go to `st` (16 per row). Two rows share every load of T;
// eight lanes at a time keep 2 × 8 accumulators in registers.
template <int R, int kL0>
inline void LaneHalf(const LaneChunk& c, const W4Int8Acts* a, int64_t i0, int64_t t0, int64_t nb, bool first, Lanes* st) {
  __m512 acc[R][8];
  for (int r = 0; r < R; ++r) {
    Lanes* s = st + 16 * (i0 + r);
    for (int l = 0; l < 8; ++l) acc[r][l] = first ? _mm512_setzero_ps() : _mm512_load_ps(s[kL0 + l].v);
  }
  for (int64_t tt = 0; tt < nb; ++tt) {
    const int64_t t = t0 + tt;
    const int8_t* A[R];
    __m512 fs[R];
    __m512i v0[R];  // lane 0's start: −z·sx[t], each row's zero-point term (exact int32)
    const __m512 S = _mm512_load_ps(c.S[tt]);
    for (int r = 0; r < R; ++r) {
      const W4Int8Acts& ai = a[i0 + r];
      A[r] = ai.x8 + t * 128;
      fs[r] = _mm512_mul_ps(S, _mm512_set1_ps(ai.xs[t]));
      if (kL0 == 0) v0[r] = _mm512_mullo_epi32(_mm512_load_si512(c.NZ[tt]), _mm512_set1_epi32(ai.sx[t]));
    }
    const __m512i* T0 = reinterpret_cast<const __m512i*>(c.T[tt][0]);
    const __m512i* T1 = reinterpret_cast<const __m512i*>(c.T[tt][1]);
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const __m512i t0v = _mm512_load_si512(T0 + kL0 + l), t1v = _mm512_load_si512(T1 + kL0 + l);
      for (int r = 0; r < R; ++r) {
        int32_t al, bl;
        std::memcpy(&al, A[r] + 4 * (kL0 + l), 4);
        std::memcpy(&bl, A[r] + 64 + 4 * (kL0 + l), 4);
        __m512i v = _mm512_dpbusd_epi32(kL0 + l == 0 ? v0[r] : _mm512_setzero_si512(), t0v, _mm512_set1_epi32(al));
        v = _mm512_dpbusd_epi32(v, t1v, _mm512_set1_epi32(bl));
        acc[r][l] = _mm512_fmadd_ps(fs[r], _mm512_cvtepi32_ps(v), acc[r][l]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    Lanes* s = st + 16 * (i0 + r);
    for (int l = 0; l < 8; ++l) _mm512_store_ps(s[kL0 + l].v, acc[r][l]);
  }
}

void LaneRows(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y, int64_t r0) {
  // Per worker (this runs inside the caller's parallel region), bounded: the chunk is 17 KB, the
  // state 16 Lanes of 64 B per row for m <= kLaneRowsMax rows (128 KiB).
  thread_local LaneChunk chunk;
  thread_local std::vector<Lanes> state;  // [m][16]: acc[0..16)
  if (static_cast<int64_t>(state.size()) < 16 * m) state.resize(static_cast<size_t>(16 * m));
  Lanes* st = state.data();
  const int64_t blocks = a[0].blocks;
  for (int64_t t0 = 0; t0 < blocks; t0 += kChunkBlocks) {
    const int64_t nb = std::min(kChunkBlocks, blocks - t0);
    const bool first = t0 == 0;
    BuildChunk(w, r0, t0, nb, chunk);
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) {
      LaneHalf<2, 0>(chunk, a, i, t0, nb, first, st);
      LaneHalf<2, 8>(chunk, a, i, t0, nb, first, st);
    }
    if (i < m) {
      LaneHalf<1, 0>(chunk, a, i, t0, nb, first, st);
      LaneHalf<1, 8>(chunk, a, i, t0, nb, first, st);
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    const Lanes* s = st + 16 * i;
    __m512 acc[16];
    for (int l = 0; l < 16; ++l) acc[l] = _mm512_load_ps(s[l].v);
    for (int h = 8; h >= 1; h /= 2)
      for (int l = 0; l < h; ++l) acc[l] = _mm512_add_ps(acc[l], acc[l + h]);
    __m512 v = acc[0];
    if (bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + r0));
    _mm512_storeu_ps(y + i * w.n + r0, v);
  }
}

}  // namespace

template <StreamPrefetch P>
void GemmW4A8Vnni(const W4PackedWeight& w, const W4Int8Acts* a, int64_t m, const float* bias, float* y, int64_t n0,
                  int64_t n1) {
  if (m == 0) return;
  if (m >= kLanesMinRows && a[0].parts == 1)
    for (; n0 + 16 <= n1; n0 += 16)
      for (int64_t i0 = 0; i0 < m; i0 += kLaneRowsMax)
        LaneRows(w, a + i0, std::min(kLaneRowsMax, m - i0), bias, y + i0 * w.n, n0);
  if (n0 == n1) return;
  // One weight row at a time streams W strictly sequentially (rows are contiguous), which the
  // hardware prefetchers follow best (docs/PERFORMANCE.md "W4A8"). Up to 4 activation rows share
  // each unpacked superblock.
  if (m == 1 && a[0].parts == 1 && w.rec_weights == 128) {
    const int64_t blocks = a[0].blocks;
    int64_t r = n0;
    static const int64_t chunk_min_k = W4DecodeChunkMinK(L1DataCacheBytes(), kW4I8ActBytesPerGroup);
    const auto chunked = w.symmetric ? RowsG128<kW4DecodeChunkRows, true, P> : RowsG128<kW4DecodeChunkRows, false, P>;
    const auto one = w.symmetric ? RowsG128<1, true, P> : RowsG128<1, false, P>;
    if (w.k >= chunk_min_k)
      for (; r + kW4DecodeChunkRows <= n1; r += kW4DecodeChunkRows) chunked(w, a[0], bias, y, r, kW4DecodeChunkGroups);
    for (; r < n1; ++r) one(w, a[0], bias, y, r, blocks);
    return;
  }
  const TileFn full = Select(a[0].parts, w.symmetric, 4), tail = Select(a[0].parts, w.symmetric, m % 4);
  for (int64_t r = n0; r < n1; ++r) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) full(w, a + i, bias, y + i * w.n, r);
    if (i < m) tail(w, a + i, bias, y + i * w.n, r);
  }
}

template void GemmW4A8Vnni<StreamPrefetch::kNonTemporal>(const W4PackedWeight&, const W4Int8Acts*, int64_t, const float*,
                                                        float*, int64_t, int64_t);
template void GemmW4A8Vnni<StreamPrefetch::kL1>(const W4PackedWeight&, const W4Int8Acts*, int64_t, const float*, float*,
                                               int64_t, int64_t);

}  // namespace nibble

#endif  // __x86_64__
