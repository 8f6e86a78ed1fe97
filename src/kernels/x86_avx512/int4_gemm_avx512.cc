// W4A32 GEMM/GEMV and dequantization on the W4P layout (kernels/int4_packed.h) for AVX-512
// (F/BW/VL/DQ + FMA). Compiled with its own flags (CMakeLists.txt); called only after dispatch
// has checked CPUID and XCR0 (kernels/int4_dispatch.cc).
//
// Per group and row, a 16-entry fp32 table T[i] = (i − z) · s is built once (exactly the
// reference's weight value for code i, one rounding). A 64-byte superblock is one load of 16
// dwords; run j (codes 16j..16j+15) is that vector shifted right by 4j, whose low nibbles index T
// directly (vpermps reads index bits 3:0 only) — one shift and one permute per 16 weights, no
// widening shuffles. Tiles of MR rows of x × NR rows of W share each unpacked run across MR rows
// (GEMM) and keep NR independent FMA chains in flight (GEMV with large K). The GEMV with x in L1
// (K <= 8192, records of 128 weights) streams one row at a time instead (GemvRow128). Each output's accumulation order
// (runs in k order into one 16-lane accumulator — two for M = 1, even and odd runs, added at the
// end — lanes reduced, bias added) is independent of NR, the M-tiling and the row range. Groups that are not a multiple of 16 go to the scalar kernel.
#if defined(__x86_64__)

// GCC 12's avx512fintrin.h uses deliberately undefined vectors (_mm512_undefined_*) inside
// _mm512_reduce_add_ps and friends, which -Wuninitialized reports once inlined (GCC bug 105593);
// nothing in this file is uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "kernels/x86_avx512/int4_gemm_avx512.h"

namespace nibble {
namespace {

// kCodeMinusZero[z][i] = i − z (exact small integers): the unscaled table row for zero point z,
// one aligned load instead of converting z to float and broadcasting it (a scalar convert and a
// shuffle per group on the ports the kernel's permutes need).
struct CodeMinusZeroTable {
  alignas(64) float v[16][16];
  constexpr CodeMinusZeroTable() : v{} {
    for (int z = 0; z < 16; ++z)
      for (int i = 0; i < 16; ++i) v[z][i] = static_cast<float>(i - z);
  }
};
constexpr CodeMinusZeroTable kCodeMinusZero;

// T[i] = (i − z) · s for zero point z (0..15) and scale s: the reference's weight value for code i.
inline __m512 TableFor(int z, float s) {
  return _mm512_mul_ps(_mm512_load_ps(kCodeMinusZero.v[z]), _mm512_set1_ps(s));
}

inline __m512 Table(const W4PackedWeight& w, const uint8_t* rec, int64_t gi) {
  return TableFor(w4p::Zero(w, rec, gi) & 15, w4p::Scale(rec, gi));
}

// RPG: 16-code runs per group when a record holds several groups (g = 16, 32, 64 → 1, 2, 4: the
// group of run j is j / RPG, a compile-time constant once the 8 runs of a superblock are
// unrolled); RPG = 0: one group per record (g a multiple of 128), one table per record; RPG = -1:
// any other g % 16 == 0 (g = 48, 80, …), group tracked with a counter.
template <int MR, int NR, int RPG>
void Tile(const W4PackedGemmArgs& a, int64_t i0, int64_t r0) {
  const W4PackedWeight& w = *a.w;
  const int64_t rpg = w.group_size / 16;
  const float* x[MR];
  for (int mi = 0; mi < MR; ++mi) x[mi] = a.x + (i0 + mi) * w.k;
  // GEMV (MR = 1) splits each output over two accumulators (even / odd runs) for twice the
  // independent FMA chains; GEMM tiles have enough chains already.
  constexpr int kSplit = MR == 1 ? 2 : 1;
  __m512 acc[MR][NR][kSplit];
  for (int mi = 0; mi < MR; ++mi)
    for (int r = 0; r < NR; ++r)
      for (int h = 0; h < kSplit; ++h) acc[mi][r][h] = _mm512_setzero_ps();
  constexpr int kTables = RPG > 0 ? 8 / RPG : (RPG == 0 ? 1 : 8);
  __m512 tbl[NR][kTables];
  for (int64_t ri = 0; ri < w.recs; ++ri) {
    const int64_t k0 = ri * w.rec_weights;
    const bool full = k0 + w.rec_weights <= w.k;
    const int64_t valid = full ? w.rec_weights : w.k - k0;  // multiple of g, so of 16
    const int64_t ngroups = full ? w.rec_groups : valid / w.group_size;
    const uint8_t* sb[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* rec = w.data + (r0 + r) * w.row_bytes + ri * w.rec_bytes;
      for (int64_t gi = 0; gi < ngroups; ++gi) tbl[r][gi] = Table(w, rec, gi);
      sb[r] = rec + w.rec_header;
    }
    const int64_t runs = valid / 16;
    int64_t gi = 0, left = rpg;
    // One run: 16 codes of each of the NR rows → FMAs into the MR × NR accumulators.
    auto run = [&](const __m512i* v, int j, int64_t t, int tj) {
      __m512 wv[NR];
      for (int r = 0; r < NR; ++r) {
        const __m512i idx = _mm512_srl_epi32(v[r], _mm_cvtsi32_si128(4 * j));
        wv[r] = _mm512_permutexvar_ps(idx, tbl[r][tj]);
      }
      for (int mi = 0; mi < MR; ++mi) {
        const __m512 xv = _mm512_loadu_ps(x[mi] + k0 + 16 * t);
        for (int r = 0; r < NR; ++r) acc[mi][r][j % kSplit] = _mm512_fmadd_ps(xv, wv[r], acc[mi][r][j % kSplit]);
      }
    };
    int64_t t0 = 0;
    for (; t0 + 8 <= runs; t0 += 8) {
      __m512i v[NR];
      for (int r = 0; r < NR; ++r) v[r] = _mm512_loadu_si512(reinterpret_cast<const void*>(sb[r] + 64 * (t0 / 8)));
      if constexpr (RPG >= 0) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) run(v, j, t0 + j, RPG > 0 ? j / RPG : 0);
      } else {
        for (int j = 0; j < 8; ++j) {
          run(v, j, t0 + j, static_cast<int>(gi));
          if (--left == 0) {
            ++gi;
            left = rpg;
          }
        }
      }
    }
    if (t0 < runs) {  // partial last superblock (K not a multiple of 128)
      __m512i v[NR];
      for (int r = 0; r < NR; ++r) v[r] = _mm512_loadu_si512(reinterpret_cast<const void*>(sb[r] + 64 * (t0 / 8)));
      for (int j = 0; t0 + j < runs; ++j) {
        const int64_t t = t0 + j;
        run(v, j, t, static_cast<int>(RPG > 0 ? (t % 8) / RPG : (RPG == 0 ? 0 : gi)));
        if (--left == 0) {
          ++gi;
          left = rpg;
        }
      }
    }
  }
  for (int mi = 0; mi < MR; ++mi)
    for (int r = 0; r < NR; ++r) {
      const float v = _mm512_reduce_add_ps(kSplit == 2 ? _mm512_add_ps(acc[mi][r][0], acc[mi][r][kSplit - 1]) : acc[mi][r][0]);
      a.y[(i0 + mi) * w.n + r0 + r] = a.bias != nullptr ? v + a.bias[r0 + r] : v;
    }
}

// The common case R = 128 (g = 16, 32, 64, 128) with K a multiple of 128: every record is one
// superblock, so the loop over records is the only loop and the 8 runs are fully unrolled. Same
// accumulation order as Tile (runs in k order, even / odd accumulators for M = 1).
// Software prefetch along each row stream, since the hardware prefetchers lose track of 4-8
// interleaved row streams of 68-byte records: non-temporal, 1 KiB ahead, the best of the hints and
// distances measured (docs/PERFORMANCE.md "Row tiles prefetch").
constexpr int kPrefetchBytes = 1024;

template <int MR, int NR, int RPG>
void Tile128(const W4PackedGemmArgs& a, int64_t i0, int64_t r0) {
  constexpr int G = RPG <= 0 ? 1 : 8 / RPG;  // groups per record
  const W4PackedWeight& w = *a.w;
  const float* x[MR];
  for (int mi = 0; mi < MR; ++mi) x[mi] = a.x + (i0 + mi) * w.k;
  constexpr int kSplit = MR == 1 ? 2 : 1;
  __m512 acc[MR][NR][kSplit];
  for (int mi = 0; mi < MR; ++mi)
    for (int r = 0; r < NR; ++r)
      for (int h = 0; h < kSplit; ++h) acc[mi][r][h] = _mm512_setzero_ps();
  const int64_t zoff = w.symmetric ? -1 : 4 * G;
  const uint8_t* base = w.data + r0 * w.row_bytes;
  for (int64_t ri = 0; ri < w.recs; ++ri) {
    __m512 tbl[NR][G];
    __m512i v[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* rec = base + r * w.row_bytes + ri * w.rec_bytes;
      _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetchBytes), _MM_HINT_NTA);
      for (int gi = 0; gi < G; ++gi) tbl[r][gi] = TableFor(zoff < 0 ? 8 : (rec[zoff + gi] & 15), w4p::Scale(rec, gi));
      v[r] = _mm512_loadu_si512(reinterpret_cast<const void*>(rec + w.rec_header));
    }
    const int64_t k0 = ri * 128;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512 wv[NR];
      for (int r = 0; r < NR; ++r)
        wv[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(v[r], 4 * j), tbl[r][RPG <= 0 ? 0 : j / (RPG <= 0 ? 1 : RPG)]);
      for (int mi = 0; mi < MR; ++mi) {
        const __m512 xv = _mm512_loadu_ps(x[mi] + k0 + 16 * j);
        for (int r = 0; r < NR; ++r) acc[mi][r][j % kSplit] = _mm512_fmadd_ps(xv, wv[r], acc[mi][r][j % kSplit]);
      }
    }
  }
  for (int mi = 0; mi < MR; ++mi)
    for (int r = 0; r < NR; ++r) {
      const float v = _mm512_reduce_add_ps(kSplit == 2 ? _mm512_add_ps(acc[mi][r][0], acc[mi][r][kSplit - 1]) : acc[mi][r][0]);
      a.y[(i0 + mi) * w.n + r0 + r] = a.bias != nullptr ? v + a.bias[r0 + r] : v;
    }
}

// GEMV (M = 1) on records of one 128-weight superblock (g = 16/32/64/128, K % 128 == 0), used
// while x fits L1 (K <= kGemvRowMaxK). One weight row at a time, so the weights stream as one
// sequential run (interleaved row tiles are slower here; docs/PERFORMANCE.md "Row GEMV against
// row tiles").
//
// Software prefetch kRowPrefetchBytes ahead along the row (the end of a row runs on into the next
// row, which this thread streams next), with the hint P the dispatch chose for the CPU
// (kernels/stream_prefetch.h; docs/PERFORMANCE.md "Row GEMV prefetch").
//
// Eight accumulators (run j into acc[j]) keep eight FMA chains in flight, one per run, so the
// 4-cycle FMA latency does not bound the record (with four: 2 FMAs per chain per record, 8
// cycles); reduced as ((acc0 + acc4) + (acc1 + acc5)) + ((acc2 + acc6) + (acc3 + acc7)) at the
// end of the row — fixed, so the result depends on neither the thread count nor the row range.
//
// kGemvRowMaxK = 8192: x up to 32 KiB. Above it the 8-row tiles run: the row GEMV there lost
// without the prefetch and with it won only at g32 (even or lost at g128; the tiles are the Intel
// host's best case); K cut into L1-sized chunks lost (docs/PERFORMANCE.md "Row GEMV above K = 8192").
constexpr int64_t kGemvRowMaxK = 8192;
constexpr int kRowPrefetchBytes = 4096;

template <int RPG, StreamPrefetch P>
void GemvRow128(const W4PackedGemmArgs& a, int64_t r) {
  constexpr int G = RPG <= 0 ? 1 : 8 / RPG;  // groups per record
  constexpr int D = RPG <= 0 ? 8 : RPG;      // runs per group table
  const W4PackedWeight& w = *a.w;
  const bool sym = w.symmetric;
  const uint8_t* rec = w.data + r * w.row_bytes;
  __m512 acc[8];
  for (__m512& v : acc) v = _mm512_setzero_ps();
  for (int64_t ri = 0; ri < w.recs; ++ri, rec += w.rec_bytes) {
    PrefetchAhead<P>(rec, kRowPrefetchBytes);
    __m512 tbl[G];
    for (int gi = 0; gi < G; ++gi) tbl[gi] = TableFor(sym ? 8 : (rec[4 * G + gi] & 15), w4p::Scale(rec, gi));
    __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(rec + w.rec_header));
    // Keep the superblock in a register: GCC otherwise folds the load into each of the 7 shifts,
    // 8 loads that mostly straddle two cache lines (68-byte records; docs/PERFORMANCE.md).
    asm("" : "+v"(v));
    const float* xk = a.x + ri * 128;
    acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(xk), _mm512_permutexvar_ps(v, tbl[0]), acc[0]);
#pragma GCC unroll 7
    for (int j = 1; j < 8; ++j)
      acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(xk + 16 * j), _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * j), tbl[j / D]), acc[j]);
  }
  const __m512 s04 = _mm512_add_ps(acc[0], acc[4]), s15 = _mm512_add_ps(acc[1], acc[5]);
  const __m512 s26 = _mm512_add_ps(acc[2], acc[6]), s37 = _mm512_add_ps(acc[3], acc[7]);
  const float y = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s04, s15), _mm512_add_ps(s26, s37)));
  a.y[r] = a.bias != nullptr ? y + a.bias[r] : y;
}

template <int MR, int RPG>
void Rows(const W4PackedGemmArgs& a, int64_t i0, int64_t n0, int64_t n1) {
  // GEMV with one table per record (g a multiple of 128) streams 8 rows at once: more independent
  // FMA chains and x loads shared by more rows; with several tables per record 8 rows would spill.
  constexpr int NR = (MR == 1 && RPG == 0) ? 8 : 4;
  int64_t r = n0;
  if constexpr (RPG >= 0) {
    if (a.w->rec_weights == 128 && a.w->k % 128 == 0) {
      for (; r + NR <= n1; r += NR) Tile128<MR, NR, RPG>(a, i0, r);
      for (; r < n1; ++r) Tile128<MR, 1, RPG>(a, i0, r);
      return;
    }
  }
  for (; r + NR <= n1; r += NR) Tile<MR, NR, RPG>(a, i0, r);
  for (; r < n1; ++r) Tile<MR, 1, RPG>(a, i0, r);
}

template <int RPG, StreamPrefetch P>
void Gemm(const W4PackedGemmArgs& a, int64_t n0, int64_t n1) {
  if constexpr (RPG >= 0) {
    if (a.m == 1 && a.w->rec_weights == 128 && a.w->k % 128 == 0 && a.w->k <= kGemvRowMaxK) {
      for (int64_t r = n0; r < n1; ++r) GemvRow128<RPG, P>(a, r);
      return;
    }
  }
  int64_t i = 0;
  for (; i + 4 <= a.m; i += 4) Rows<4, RPG>(a, i, n0, n1);
  switch (a.m - i) {
    case 3: Rows<3, RPG>(a, i, n0, n1); break;
    case 2: Rows<2, RPG>(a, i, n0, n1); break;
    case 1: Rows<1, RPG>(a, i, n0, n1); break;
    default: break;
  }
}

}  // namespace

template <StreamPrefetch P>
void GemmW4A32Avx512(const W4PackedGemmArgs& a, int64_t n0, int64_t n1) {
  if (!w4p::RunsFitGroups(*a.w)) return GemmW4A32PackedScalar(a, n0, n1);
  if (a.w->rec_groups == 1) return Gemm<0, P>(a, n0, n1);
  switch (a.w->group_size) {
    case 16: return Gemm<1, P>(a, n0, n1);
    case 32: return Gemm<2, P>(a, n0, n1);
    case 64: return Gemm<4, P>(a, n0, n1);
    default: return Gemm<-1, P>(a, n0, n1);
  }
}
template void GemmW4A32Avx512<StreamPrefetch::kNonTemporal>(const W4PackedGemmArgs&, int64_t, int64_t);
template void GemmW4A32Avx512<StreamPrefetch::kL1>(const W4PackedGemmArgs&, int64_t, int64_t);

namespace {

// Rows n0..n1 of W, 16 exact fp32 weights at a time handed to store(row-major offset, values).
template <class Store>
void DequantRuns(const W4PackedWeight& w, int64_t n0, int64_t n1, Store store) {
  const int64_t rpg = w.group_size / 16;
  for (int64_t r = n0; r < n1; ++r)
    for (int64_t ri = 0; ri < w.recs; ++ri) {
      const uint8_t* rec = w.data + r * w.row_bytes + ri * w.rec_bytes;
      const int64_t k0 = ri * w.rec_weights;
      const int64_t runs = std::min(w.rec_weights, w.k - k0) / 16;
      const int64_t o = (r - n0) * w.k + k0;
      __m512 tbl = Table(w, rec, 0);
      // A new table every rpg runs, counted down (no division per run: rpg is a run-time value).
      for (int64_t t = 0, gi = 0, left = rpg; t < runs; ++t, --left) {
        if (left == 0) {
          tbl = Table(w, rec, ++gi);
          left = rpg;
        }
        const __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(rec + w.rec_header + 64 * (t / 8)));
        const __m128i cnt = _mm_cvtsi32_si128(static_cast<int>(4 * (t % 8)));
        store(o + 16 * t, _mm512_permutexvar_ps(_mm512_srl_epi32(v, cnt), tbl));
      }
    }
}

// F32ToBf16 on 16 lanes: round to nearest even on the bits, NaN kept quiet.
__m256i ToBf16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

}  // namespace

void DequantW4Avx512(const W4PackedWeight& w, int64_t n0, int64_t n1, float* out) {
  if (!w4p::RunsFitGroups(w)) return DequantW4PackedScalar(w, n0, n1, out);
  DequantRuns(w, n0, n1, [out](int64_t o, __m512 v) { _mm512_storeu_ps(out + o, v); });
}

void DequantW4Bf16Avx512(const W4PackedWeight& w, int64_t n0, int64_t n1, uint16_t* out) {
  if (!w4p::RunsFitGroups(w)) return DequantW4PackedBf16Scalar(w, n0, n1, out);
  DequantRuns(w, n0, n1, [out](int64_t o, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + o), ToBf16(v));
  });
}

uint64_t StreamReadAvx512(const uint64_t* p, int64_t words) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= words; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(reinterpret_cast<const void*>(p + i)));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(reinterpret_cast<const void*>(p + i + 8)));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(reinterpret_cast<const void*>(p + i + 16)));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(reinterpret_cast<const void*>(p + i + 24)));
  }
  // Lanes reduced as uint64 (wrapping): _mm512_reduce_add_epi64 adds signed long longs, whose
  // overflow is undefined behaviour (UBSan reports it).
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  for (; i < words; ++i) sum += p[i];
  return sum;
}

}  // namespace nibble

#endif  // __x86_64__
