// W4A32 GEMM/GEMV and dequantization on the W4P layout (kernels/int4_packed.h) for AVX2 + FMA
// (+ F16C in the flags, unused so far). Compiled with its own flags (CMakeLists.txt); called only
// after dispatch has checked CPUID and XCR0 (kernels/int4_dispatch.cc).
//
// A 64-byte superblock is two 32-byte loads (dwords 0..7 and 8..15); run j (codes 16j..16j+15)
// is both shifted right by 4j and masked with 15. Each weight is float(q − z) · s (integer
// subtract, convert, one multiply: the reference's value bit for bit), then one FMA per 8 lanes.
// Accumulation order of an output (per run: lanes 0..7 then 8..15 into one 8-lane accumulator;
// lanes reduced in a fixed tree; bias) is independent of the tiling, M and the row range. Groups
// that are not a multiple of 16 go to the scalar kernel. Decode at g = 128 has its own loop
// (DecodeRowG128 below: the scale and the zero point per group instead of per weight).
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/stream_prefetch.h"
#include "kernels/x86_avx2/int4_gemm_avx2.h"
#include "kernels/x86_avx2/lane_tree.h"

namespace nibble {
namespace {

// Weights of run t of a record: 2 × 8 fp32 in k order.
inline void Run(const uint8_t* sb, int j, __m256i zv, __m256 sv, __m256& lo, __m256& hi) {
  const __m256i m15 = _mm256_set1_epi32(15);
  const __m128i cnt = _mm_cvtsi32_si128(4 * j);
  const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb));
  const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 32));
  const __m256i q0 = _mm256_and_si256(_mm256_srl_epi32(v0, cnt), m15);
  const __m256i q1 = _mm256_and_si256(_mm256_srl_epi32(v1, cnt), m15);
  lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q0, zv)), sv);
  hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q1, zv)), sv);
}

template <int MR, int NR>
void Tile(const W4PackedGemmArgs& a, int64_t i0, int64_t r0) {
  const W4PackedWeight& w = *a.w;
  const int64_t rpg = w.group_size / 16;
  const float* x[MR];
  for (int mi = 0; mi < MR; ++mi) x[mi] = a.x + (i0 + mi) * w.k;
  __m256 acc[MR][NR];
  for (int mi = 0; mi < MR; ++mi)
    for (int r = 0; r < NR; ++r) acc[mi][r] = _mm256_setzero_ps();
  for (int64_t ri = 0; ri < w.recs; ++ri) {
    const int64_t k0 = ri * w.rec_weights;
    const int64_t runs = std::min(w.rec_weights, w.k - k0) / 16;
    for (int r = 0; r < NR; ++r) {
      const uint8_t* rec = w.data + (r0 + r) * w.row_bytes + ri * w.rec_bytes;
      __m256i zv = _mm256_setzero_si256();
      __m256 sv = _mm256_setzero_ps();
      // Group gi starts every rpg runs; counted down, not t % rpg: rpg is known only at run time,
      // and a 64-bit division per 16 weights was the loop's bottleneck
      // (docs/KERNELS.md "Static analysis with llvm-mca").
      for (int64_t t = 0, gi = 0, left = 0; t < runs; ++t, --left) {
        if (left == 0) {
          zv = _mm256_set1_epi32(w4p::Zero(w, rec, gi));
          sv = _mm256_set1_ps(w4p::Scale(rec, gi));
          ++gi;
          left = rpg;
        }
        __m256 lo, hi;
        Run(rec + w.rec_header + 64 * (t / 8), static_cast<int>(t % 8), zv, sv, lo, hi);
        for (int mi = 0; mi < MR; ++mi) {
          acc[mi][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[mi] + k0 + 16 * t), lo, acc[mi][r]);
          acc[mi][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[mi] + k0 + 16 * t + 8), hi, acc[mi][r]);
        }
      }
    }
  }
  for (int mi = 0; mi < MR; ++mi)
    for (int r = 0; r < NR; ++r) {
      const float v = Hsum(acc[mi][r]);
      a.y[(i0 + mi) * w.n + r0 + r] = a.bias != nullptr ? v + a.bias[r0 + r] : v;
    }
}

// ---- Decode (M = 1) at g = 128 on records of one superblock (K % 128 == 0): a flat loop over the
// row's records, the superblock loaded once per record (the tiles load it again per run), each
// code float(q) (exact) and the scale applied once per group, not per weight; the zero point
// enters once per group as z·σ, σ = Σx of the group (GroupSums, once per call), so no subtract
// per weight. Per group gi, four 8-lane chains, chain j mod 4 taking run j's codes 16j + l, then
// 16j + 8 + l (the first as a product, then FMAs); sum[gi mod 4] = fma(s, (c0 + c1) + (c2 + c3),
// sum[gi mod 4]) and, in scalar, corr = fma(s, float(z)·σ, corr); at the end ((sum0 + sum1) +
// (sum2 + sum3)), the Hsum tree, − corr, + bias. The order is fixed by K, so results do not depend
// on the row range or the thread count. Any K up to kDecodeMaxGroups groups (σ on the stack): the
// loop is bound by its instructions, not by x coming from L2 past the L1 (docs/PERFORMANCE.md
// "AVX2 decode loop"). One software prefetch per record, kRowPrefetchBytes ahead along the row,
// with the dispatch's hint.
constexpr int64_t kRowPrefetchBytes = 4096;
constexpr int64_t kDecodeMaxGroups = 1024;  // K <= 131072; longer rows take the tiles

// σ of each 128-value group of x: 16 loads added in order into 8 lanes, then the Hsum tree.
void GroupSums(const float* x, int64_t groups, float* sums) {
  for (int64_t gi = 0; gi < groups; ++gi) {
    const float* xg = x + 128 * gi;
    __m256 v = _mm256_loadu_ps(xg);
    for (int j = 1; j < 16; ++j) v = _mm256_add_ps(v, _mm256_loadu_ps(xg + 8 * j));
    sums[gi] = Hsum(v);
  }
}

inline __m256 GroupG128(const uint8_t* rec, int64_t header, float s, const float* x, __m256 tot) {
  const __m256i m15 = _mm256_set1_epi32(15);
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + header));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + header + 32));
  __m256 c[4];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    // Nibble j of each dword; after the shift by 28 only the nibble is left.
    const __m256i a = j == 0 ? _mm256_and_si256(lo, m15) : j == 7 ? _mm256_srli_epi32(lo, 28)
                                                                  : _mm256_and_si256(_mm256_srli_epi32(lo, 4 * j), m15);
    const __m256i b = j == 0 ? _mm256_and_si256(hi, m15) : j == 7 ? _mm256_srli_epi32(hi, 28)
                                                                  : _mm256_and_si256(_mm256_srli_epi32(hi, 4 * j), m15);
    const __m256 wa = _mm256_cvtepi32_ps(a), wb = _mm256_cvtepi32_ps(b);
    const __m256 xa = _mm256_loadu_ps(x + 16 * j), xb = _mm256_loadu_ps(x + 16 * j + 8);
    c[j % 4] = j < 4 ? _mm256_mul_ps(xa, wa) : _mm256_fmadd_ps(xa, wa, c[j % 4]);
    c[j % 4] = _mm256_fmadd_ps(xb, wb, c[j % 4]);
  }
  return _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_add_ps(_mm256_add_ps(c[0], c[1]), _mm256_add_ps(c[2], c[3])), tot);
}

template <StreamPrefetch P>
void DecodeRowG128(const W4PackedGemmArgs& a, const float* sums, int64_t r) {
  const W4PackedWeight& w = *a.w;
  const int64_t groups = w.k / 128, rb = w.rec_bytes, header = w.rec_header;
  const uint8_t* rec = w.data + r * w.row_bytes;
  __m256 tot[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  float corr = 0.f;
  for (int64_t g0 = 0; g0 < groups; g0 += 4) {
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {  // t constant after unrolling: the sums stay in registers
      const int64_t gi = g0 + t;
      if (gi >= groups) break;
      PrefetchAhead<P>(rec, kRowPrefetchBytes);
      float s;  // records are 68 or 69 bytes apart: the scale is unaligned
      __builtin_memcpy(&s, rec, 4);
      corr = std::fma(s, static_cast<float>(w4p::Zero(w, rec, 0)) * sums[gi], corr);
      tot[t] = GroupG128(rec, header, s, a.x + 128 * gi, tot[t]);
      rec += rb;
    }
  }
  const float v = Hsum(_mm256_add_ps(_mm256_add_ps(tot[0], tot[1]), _mm256_add_ps(tot[2], tot[3]))) - corr;
  a.y[r] = a.bias != nullptr ? v + a.bias[r] : v;
}

template <int MR>
void Rows(const W4PackedGemmArgs& a, int64_t i0, int64_t n0, int64_t n1) {
  constexpr int NR = 4;
  int64_t r = n0;
  for (; r + NR <= n1; r += NR) Tile<MR, NR>(a, i0, r);
  for (; r < n1; ++r) Tile<MR, 1>(a, i0, r);
}

}  // namespace

template <StreamPrefetch P>
void GemmW4A32Avx2(const W4PackedGemmArgs& a, int64_t n0, int64_t n1) {
  if (!w4p::RunsFitGroups(*a.w)) return GemmW4A32PackedScalar(a, n0, n1);
  const W4PackedWeight& w = *a.w;
  if (a.m == 1 && w.group_size == 128 && w.rec_weights == 128 && w.k % 128 == 0 && w.k / 128 <= kDecodeMaxGroups) {
    float sums[kDecodeMaxGroups];
    GroupSums(a.x, w.k / 128, sums);
    for (int64_t r = n0; r < n1; ++r) DecodeRowG128<P>(a, sums, r);
    return;
  }
  int64_t i = 0;
  for (; i + 2 <= a.m; i += 2) Rows<2>(a, i, n0, n1);
  if (i < a.m) Rows<1>(a, i, n0, n1);
}

template void GemmW4A32Avx2<StreamPrefetch::kNonTemporal>(const W4PackedGemmArgs&, int64_t, int64_t);
template void GemmW4A32Avx2<StreamPrefetch::kL1>(const W4PackedGemmArgs&, int64_t, int64_t);

void DequantW4Avx2(const W4PackedWeight& w, int64_t n0, int64_t n1, float* out) {
  if (!w4p::RunsFitGroups(w)) return DequantW4PackedScalar(w, n0, n1, out);
  const int64_t rpg = w.group_size / 16;
  for (int64_t r = n0; r < n1; ++r)
    for (int64_t ri = 0; ri < w.recs; ++ri) {
      const uint8_t* rec = w.data + r * w.row_bytes + ri * w.rec_bytes;
      const int64_t k0 = ri * w.rec_weights;
      const int64_t runs = std::min(w.rec_weights, w.k - k0) / 16;
      float* o = out + (r - n0) * w.k + k0;
      __m256i zv = _mm256_setzero_si256();
      __m256 sv = _mm256_setzero_ps();
      for (int64_t t = 0, gi = 0, left = 0; t < runs; ++t, --left) {
        if (left == 0) {  // first run of group gi (a counter: no division per run, as in Tile)
          zv = _mm256_set1_epi32(w4p::Zero(w, rec, gi));
          sv = _mm256_set1_ps(w4p::Scale(rec, gi));
          ++gi;
          left = rpg;
        }
        __m256 lo, hi;
        Run(rec + w.rec_header + 64 * (t / 8), static_cast<int>(t % 8), zv, sv, lo, hi);
        _mm256_storeu_ps(o + 16 * t, lo);
        _mm256_storeu_ps(o + 16 * t + 8, hi);
      }
    }
}

uint64_t StreamReadAvx2(const uint64_t* p, int64_t words) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= words; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < words; ++i) sum += p[i];
  return sum;
}

}  // namespace nibble

#endif  // __x86_64__
