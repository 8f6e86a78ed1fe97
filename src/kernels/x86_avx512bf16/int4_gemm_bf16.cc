// AVX-512 BF16 W4A16 GEMM with bf16 activations (see int4_gemm_bf16.h). Compiled with
// -mavx512bf16 -mavx512vbmi; called only after the dispatcher has checked CPUID and XCR0.
#if defined(__x86_64__)

#include "kernels/x86_avx512bf16/int4_gemm_bf16.h"

// GCC 12's avx512fintrin.h builds _mm512_castps512_ps256 and friends from deliberately undefined
// vectors (_mm512_undefined_*), which -Wuninitialized reports once inlined (GCC bug 105593);
// nothing in this file is uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/x86_avx512/lane_tree.h"
#include "kernels/x86_avx512bf16/run_words.h"
#include "base/check.h"

#include <algorithm>
#include <cstdint>

namespace nibble {
namespace {

// The row tiles use no software prefetch: the hardware prefetchers follow the row stream; a
// non-temporal prefetch as in the W4A32 row GEMV was no faster there (docs/PERFORMANCE.md "bf16
// activations"). The flat decode loop below does gain from one.

// Activation rows per pass over a weight row in the row tiles (accumulators: MR × (2 + 4) zmm).
constexpr int64_t kMaxRows = 3;

// 0.f .. 15.f: a zero point as a float by one broadcast load.
alignas(64) constexpr float kCodeFloat[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// Weight row r against activation rows a[0..MR): y[i * w.n + r]. kGops = runs per group (g / 32)
// when fixed at compile time (1, 2: g = 32, 64), 0 = read from w. g = 128 never comes here
// (RowsG128 at one row, the blocks from two). Group gi of the row adds into running
// sum gi mod 4 (the group loop is unrolled by four so the sums stay in registers).
template <int MR, bool kSym, int kGops>
void Tile(const W4PackedWeight& w, const W4Bf16Acts* acts, const float* bias, float* y, int64_t r) {
  const uint16_t* xb[MR];
  const float* zc[MR];
  for (int i = 0; i < MR; ++i) {
    xb[i] = acts[i].xb;
    zc[i] = acts[i].zc;
  }
  __m512 tot[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int t = 0; t < 4; ++t) tot[i][t] = _mm512_setzero_ps();
  const __m512i ctl[4] = {RunControl(0), RunControl(1), RunControl(2), RunControl(3)};
  const int64_t gops = kGops > 0 ? kGops : w.group_size / 32, groups = w.k / w.group_size;
  const int64_t gpr = w.rec_groups, rec_bytes = w.rec_bytes, header = w.rec_header;
  const uint8_t* rec = w.data + r * w.row_bytes;  // record of group gi
  int64_t gl = 0;                                  // gi's index within it
  __m512i sbv = _mm512_setzero_si512();            // the superblock being read
  for (int64_t gi0 = 0; gi0 < groups; gi0 += 4) {
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const int64_t gi = gi0 + t;
      if (gi >= groups) break;
      // Per-lane start fma(z, c1, c0) = −(128 + z)·σ/16, from the activations' table (W4Bf16Acts::zc:
      // one broadcast load).
      const int64_t z = kSym ? 8 : rec[4 * gpr + gl];
      __m512 a0[MR], a1[MR];
      for (int i = 0; i < MR; ++i) {
        a0[i] = _mm512_set1_ps(zc[i][16 * gi + z]);
        a1[i] = _mm512_setzero_ps();
      }
      const uint16_t* xg[MR];
      for (int i = 0; i < MR; ++i) xg[i] = xb[i] + 32 * gops * gi;
      const int64_t ul0 = gl * gops;  // first run of the group within the record
      const uint8_t* codes = rec + header;
      // Runs ul0 .. ul0 + gops − 1 of the record: superblock ul / 4, run c = ul mod 4. Records hold
      // whole superblocks and gi0 is a multiple of 4, so for kGops in {1, 2} c = (t·gops + o)
      // mod 4 is a compile-time constant. Each superblock is loaded once, when its run 0 comes
      // (a register, not a memory operand of each vpmultishiftqb).
#pragma GCC unroll 4
      for (int64_t o = 0; o < gops; ++o) {
        const int64_t ul = ul0 + o;
        const int64_t c = kGops > 0 ? (t * kGops + o) & 3 : (ul & 3);
        if (c == 0 || (kGops == 0 && o == 0)) {
          sbv = _mm512_loadu_si512(codes + 64 * (ul >> 2));
        }
        const __m512bh v = RunWords(sbv, ctl[c]);
        for (int i = 0; i < MR; ++i) {
          const __m512bh x = (__m512bh)_mm512_loadu_si512(xg[i] + 32 * o);
          if ((o & 1) == 0)
            a0[i] = _mm512_dpbf16_ps(a0[i], v, x);
          else
            a1[i] = _mm512_dpbf16_ps(a1[i], v, x);
        }
      }
      float s;
      __builtin_memcpy(&s, rec + 4 * gl, 4);
      const __m512 sv = _mm512_set1_ps(s);
      for (int i = 0; i < MR; ++i) {
        const __m512 acc = gops >= 2 ? _mm512_add_ps(a0[i], a1[i]) : a0[i];
        tot[i][t] = _mm512_fmadd_ps(sv, acc, tot[i][t]);
      }
      if (++gl == gpr) {
        gl = 0;
        rec += rec_bytes;
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    const __m512 t = _mm512_add_ps(_mm512_add_ps(tot[i][0], tot[i][1]), _mm512_add_ps(tot[i][2], tot[i][3]));
    const float v = ReduceTree(t);
    y[i * w.n + r] = bias != nullptr ? v + bias[r] : v;
  }
}

// ---- Decode at g = 128 (one activation row, one group per record): the tile's arithmetic for
// that case as one flat loop over the row's records, unrolled by four: per group two chains over
// runs (0, 2) and (1, 3), the first starting at fma(z, c1, c0) (W4Bf16Acts::zc), then sum[gi mod
// 4] = fma(s, chain0 + chain1, sum[gi mod 4]). The scale and the chain start are broadcast memory
// operands (a register broadcast would take a shuffle slot from the vpmultishiftqb; on Zen 4 the
// start's FMA of three broadcasts cost as much as the rest of the group's scale work).

// The decode loop's software prefetch (hint P, kernels/stream_prefetch.h): this far ahead of the
// record being read
// (one per record; records are longer than a line, so about one line in 14 is left to the
// hardware prefetchers); docs/PERFORMANCE.md "Batched decode".
constexpr int64_t kRowPrefetchBytes = 4096;

static_assert(kW4DecodeChunkGroups % 4 == 0, "each row's four running sums take groups gi mod 4");

// Group gi of the row (one group per record at g = 128; `rec` points at its record) against the
// activations x = the group's 128 words, zc = its 16 chain starts: returns fma(s, chain0 + chain1,
// tot).
template <bool kSym, W4Bf16Unpack U>
inline __m512 GroupG128(const uint8_t* rec, int64_t header, const __m512i (&ctl)[4], const __m512bh* x,
                        const float* zc, __m512 tot) {
  constexpr bool kShift = U == W4Bf16Unpack::kShift;
  __m512i sb = _mm512_loadu_si512(rec + header);
  // One load: folded into each shift, the record (unaligned, often across two lines) would be
  // read three more times.
  if (kShift) __asm__("" : "+v"(sb));
  const __m512bh v0 = kShift ? ShiftWords<0>(sb) : RunWords(sb, ctl[0]);
  const __m512bh v1 = kShift ? ShiftWords<1>(sb) : RunWords(sb, ctl[1]);
  const __m512bh v2 = kShift ? ShiftWords<2>(sb) : RunWords(sb, ctl[2]);
  const __m512bh v3 = kShift ? ShiftWords<3>(sb) : RunWords(sb, ctl[3]);
  __m512 h0 = _mm512_set1_ps(zc[kSym ? 8 : rec[4]]);
  h0 = _mm512_dpbf16_ps(h0, v0, (__m512bh)_mm512_loadu_si512(x));
  __m512 h1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), v1, (__m512bh)_mm512_loadu_si512(x + 1));
  h0 = _mm512_dpbf16_ps(h0, v2, (__m512bh)_mm512_loadu_si512(x + 2));
  h1 = _mm512_dpbf16_ps(h1, v3, (__m512bh)_mm512_loadu_si512(x + 3));
  float s;  // records are 68 or 69 bytes apart: the scale is unaligned
  __builtin_memcpy(&s, rec, 4);
  return _mm512_fmadd_ps(_mm512_set1_ps(s), _mm512_add_ps(h0, h1), tot);
}

// Weight rows r .. r + NR − 1, each summed over its groups in order (the same bits for every NR
// and chunk), visited in chunks of `chunk` groups: chunk c of every row, then chunk c + 1. Each
// row reads its activations (2.5·K bytes with W4Bf16Acts::zc) once; past the L1 data cache every
// row fetched them from L2 again (docs/PERFORMANCE.md "Long rows"). In chunks they stay in L1 for
// all NR rows. `chunk` is a multiple of 4, so group gi still adds into sum gi mod 4. One row (NR =
// 1) prefetches kRowPrefetchBytes ahead along its row; in chunks a record prefetches the same
// record of its row's next chunk.
template <int NR, bool kSym, StreamPrefetch P, W4Bf16Unpack U>
void RowsG128(const W4PackedWeight& w, const W4Bf16Acts& a, const float* bias, float* y, int64_t r, int64_t chunk) {
  const __m512i ctl[4] = {RunControl(0), RunControl(1), RunControl(2), RunControl(3)};
  const __m512bh* xa = reinterpret_cast<const __m512bh*>(U == W4Bf16Unpack::kShift ? a.xs : a.xb);
  const int64_t groups = w.k / 128, rb = w.rec_bytes, header = w.rec_header;
  const int64_t ahead = NR == 1 ? kRowPrefetchBytes : chunk * rb;
  const uint8_t* row0 = w.data + r * w.row_bytes;
  __m512 tot[NR][4];
  for (int j = 0; j < NR; ++j)
    for (int t = 0; t < 4; ++t) tot[j][t] = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < groups; c0 += chunk) {
    const int64_t c1 = std::min(groups, c0 + chunk);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const uint8_t* rec = row0 + j * w.row_bytes + c0 * rb;
      for (int64_t g0 = c0; g0 < c1; g0 += 4) {
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {  // t constant after unrolling: the sums stay in registers
          const int64_t gi = g0 + t;
          if (gi >= c1) break;
          PrefetchAhead<P>(rec, ahead);
          tot[j][t] = GroupG128<kSym, U>(rec, header, ctl, xa + 4 * gi, a.zc + 16 * gi, tot[j][t]);
          rec += rb;
        }
      }
    }
  }
  for (int j = 0; j < NR; ++j) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(tot[j][0], tot[j][1]), _mm512_add_ps(tot[j][2], tot[j][3]));
    const float v = ReduceTree(sum);
    y[r + j] = bias != nullptr ? v + bias[r + j] : v;
  }
}

// ---- Many activation rows (batched decode, prefill), g a multiple of 128: blocks of NJ weight
// rows × MI activation rows. Each decoded run feeds MI dot products and each activation load NJ.
// Arithmetic per (activation row, weight row), fixed by K and g alone: per group one 16-lane
// chain from zero through the group's runs in order, then sum = fma(s, chain, sum); after every
// kCorrGroups groups (and at the end) the zero-point corrections of those groups, 16 per vector
// (one per lane): sum = fma(16·s, fma(z, c1, c0), sum), i.e. s·(−(128 + z)·σ) per group; at the
// end the lane tree + bias. With the correction out of the chains each group and pair costs one
// FMA beside its four vdpbf16ps. The block's shape only schedules that work: every shape gives
// each pair the same bits.
constexpr int64_t kCorrGroups = 64;  // groups whose scales and zero points a block holds at once

// A block's running sums: in registers up to 8 pairs; past that the NJ·MI chains take half of the
// 32 zmm, so the sums live on the stack and each group's scale FMA reads and writes them there.
template <int NJ, int MI, bool kInRegs = (NJ * MI <= 8)>
struct BlockSums {
  __m512 v[NJ][MI];
  BlockSums() {
    for (int j = 0; j < NJ; ++j)
      for (int i = 0; i < MI; ++i) v[j][i] = _mm512_setzero_ps();
  }
  __m512 Get(int j, int i) const { return v[j][i]; }
  void Set(int j, int i, __m512 x) { v[j][i] = x; }
};

template <int NJ, int MI>
struct BlockSums<NJ, MI, false> {
  alignas(64) float v[NJ][MI][16];
  BlockSums() {
    for (int j = 0; j < NJ; ++j)
      for (int i = 0; i < MI; ++i) _mm512_store_ps(v[j][i], _mm512_setzero_ps());
  }
  __m512 Get(int j, int i) const { return _mm512_load_ps(v[j][i]); }
  void Set(int j, int i, __m512 x) { _mm512_store_ps(v[j][i], x); }
};

template <int NJ, int MI, typename Sums>
inline void AddCorrection(const float (&sc)[NJ][kCorrGroups], const float (&zc)[NJ][kCorrGroups],
                          const W4Bf16Acts* acts, int64_t g0, int64_t len, Sums& tot) {
  for (int64_t o = 0; o < len; o += 16) {
    const __mmask16 mk = len - o >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (len - o)) - 1);
    __m512 s16[NJ], z[NJ];
    for (int j = 0; j < NJ; ++j) {
      s16[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, sc[j] + o), _mm512_set1_ps(16.f));
      z[j] = _mm512_maskz_loadu_ps(mk, zc[j] + o);
    }
    for (int i = 0; i < MI; ++i) {
      const __m512 c0 = _mm512_maskz_loadu_ps(mk, acts[i].c0 + g0 + o);
      const __m512 c1 = _mm512_maskz_loadu_ps(mk, acts[i].c1 + g0 + o);
      for (int j = 0; j < NJ; ++j) tot.Set(j, i, _mm512_fmadd_ps(s16[j], _mm512_fmadd_ps(z[j], c1, c0), tot.Get(j, i)));
    }
  }
}

// One run of the block as vdpbf16ps computes it, in fp32 FMAs: per lane l the high words'
// product first (weight 32c + 16 + l, activation xf[16 + l]), then the low words' (weight 32c + l,
// xf[l]), each rounded once. The products are exact, so these are vdpbf16ps's bits
// (docs/KERNELS.md "FMA blocks"); the weights widen straight to fp32 0x430q0000 = 128 + q.
template <int NJ, int MI>
inline void RunFma(const uint8_t* const (&rec)[NJ], int64_t off, __m512i ctl, const W4Bf16Acts* acts, int64_t x0,
                   __m512 (&acc)[NJ][MI]) {
  const __m512i nib = _mm512_set1_epi32(0x000F0000), one28 = _mm512_set1_epi32(0x43000000);
  __m512 hi[NJ], lo[NJ];
  for (int j = 0; j < NJ; ++j) {
    const __m512i v = _mm512_multishift_epi64_epi8(ctl, _mm512_loadu_si512(rec[j] + off));
    lo[j] = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_slli_epi32(v, 16), nib, one28, 0xEA));
    hi[j] = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(v, nib, one28, 0xEA));
  }
  // Each activation vector loaded once into a register for the NJ rows (the empty asm keeps GCC
  // from folding it into every FMA as a memory operand: twice the L1 loads, 6 % slower at 2 x 8).
  for (int i = 0; i < MI; ++i) {
    __m512 xh = _mm512_loadu_ps(acts[i].xf + x0 + 16);
    if (NJ > 1) __asm__("" : "+v"(xh));
    for (int j = 0; j < NJ; ++j) acc[j][i] = _mm512_fmadd_ps(hi[j], xh, acc[j][i]);
  }
  for (int i = 0; i < MI; ++i) {
    __m512 xl = _mm512_loadu_ps(acts[i].xf + x0);
    if (NJ > 1) __asm__("" : "+v"(xl));
    for (int j = 0; j < NJ; ++j) acc[j][i] = _mm512_fmadd_ps(lo[j], xl, acc[j][i]);
  }
}

template <int NJ, int MI, bool kSym>
void Block(const W4PackedWeight& w, const W4Bf16Acts* acts, const float* bias, float* y, int64_t r0) {
  const __m512i ctl[4] = {RunControl(0), RunControl(1), RunControl(2), RunControl(3)};
  const int64_t groups = w.k / w.group_size, spg = w.group_size / 128, header = w.rec_header;
  const uint8_t* rec[NJ];
  for (int j = 0; j < NJ; ++j) rec[j] = w.data + (r0 + j) * w.row_bytes;  // one group per record
  BlockSums<NJ, MI> tot;
  alignas(64) float sc[NJ][kCorrGroups], zc[NJ][kCorrGroups];  // s and z of the chunk's groups
  for (int64_t g0 = 0; g0 < groups; g0 += kCorrGroups) {
    const int64_t len = std::min(kCorrGroups, groups - g0);
    for (int64_t gi = g0; gi < g0 + len; ++gi) {
      // The NJ rows are NJ short streams that the hardware prefetchers pick up late (each block
      // starts new ones): fetch the same records of the next block's rows now.
      for (int j = 0; j < NJ; ++j)
        for (int64_t off = 0; off < w.rec_bytes; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(rec[j] + NJ * w.row_bytes + off), _MM_HINT_T0);
      __m512 acc[NJ][MI];
      for (int j = 0; j < NJ; ++j)
        for (int i = 0; i < MI; ++i) acc[j][i] = _mm512_setzero_ps();
      for (int64_t b = 0; b < spg; ++b) {
        const int64_t u = (gi * spg + b) * 4;  // first run of the superblock in K
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          __m512bh v[NJ];
          for (int j = 0; j < NJ; ++j) v[j] = RunWords(_mm512_loadu_si512(rec[j] + header + 64 * b), ctl[c]);
          for (int i = 0; i < MI; ++i) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512(acts[i].xb + 32 * (u + c));
            for (int j = 0; j < NJ; ++j) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], v[j], x);
          }
        }
      }
      // One group per record (g % 128 == 0): the scale at +0, the zero point (asymmetric) at +4.
      for (int j = 0; j < NJ; ++j) {
        float s;
        __builtin_memcpy(&s, rec[j], 4);
        sc[j][gi - g0] = s;
        zc[j][gi - g0] = kCodeFloat[kSym ? 8 : rec[j][4]];
        const __m512 sv = _mm512_set1_ps(s);
        for (int i = 0; i < MI; ++i) tot.Set(j, i, _mm512_fmadd_ps(sv, acc[j][i], tot.Get(j, i)));
        rec[j] += w.rec_bytes;
      }
    }
    AddCorrection<NJ, MI>(sc, zc, acts, g0, len, tot);
  }
  for (int j = 0; j < NJ; ++j)
    for (int i = 0; i < MI; ++i) {
      const float v = ReduceTree(tot.Get(j, i));
      y[i * w.n + r0 + j] = bias != nullptr ? v + bias[r0 + j] : v;
    }
}

// ---- The blocks' arithmetic in fp32 FMAs (W4Bf16BlockArith::kFma). Two FMAs read twice the
// activation bytes of one vdpbf16ps, more than L2 supplies at this rate, so the work goes in
// strips: up to kStripRows weight rows pass over K in chunks of about kChunkK, each chunk's
// activations (8 rows x 2 KiB) staying in L1 while every block of the strip uses them. Each
// pair's operations and their order are those of Block: the same bits.
constexpr int64_t kStripRows = 16;
constexpr int64_t kChunkK = 512;

template <int NJ, int MI, bool kSym>
void StripFma(const W4PackedWeight& w, const W4Bf16Acts* acts, const float* bias, float* y, int64_t r0,
              int64_t r1) {
  constexpr int64_t kMaxBlocks = kStripRows / NJ;
  const __m512i ctl[4] = {RunControl(0), RunControl(1), RunControl(2), RunControl(3)};
  const int64_t groups = w.k / w.group_size, spg = w.group_size / 128, header = w.rec_header;
  const int64_t nb = (r1 - r0) / NJ, chunk = std::max<int64_t>(1, kChunkK / w.group_size);  // divides 64
  NIBBLE_CHECK(nb * NJ == r1 - r0 && nb <= kMaxBlocks && kCorrGroups % chunk == 0);
  BlockSums<NJ, MI, false> tot[kMaxBlocks];
  alignas(64) float sc[NJ][kCorrGroups], zc[NJ][kCorrGroups];
  for (int64_t g0 = 0; g0 < groups; g0 += chunk) {
    const int64_t g1 = std::min(groups, g0 + chunk);
    for (int64_t bl = 0; bl < nb; ++bl) {
      const uint8_t* rec[NJ];
      for (int j = 0; j < NJ; ++j) rec[j] = w.data + (r0 + bl * NJ + j) * w.row_bytes + g0 * w.rec_bytes;
      for (int64_t gi = g0; gi < g1; ++gi) {
        for (int j = 0; j < NJ; ++j)
          for (int64_t off = 0; off < w.rec_bytes; off += 64)
            _mm_prefetch(reinterpret_cast<const char*>(rec[j] + NJ * w.row_bytes + off), _MM_HINT_T0);
        __m512 acc[NJ][MI];
        for (int j = 0; j < NJ; ++j)
          for (int i = 0; i < MI; ++i) acc[j][i] = _mm512_setzero_ps();
        for (int64_t u = 0; u < 4 * spg; ++u)
          RunFma<NJ, MI>(rec, header + 64 * (u >> 2), ctl[u & 3], acts, 32 * (gi * spg * 4 + u), acc);
        for (int j = 0; j < NJ; ++j) {
          float s;
          __builtin_memcpy(&s, rec[j], 4);
          const __m512 sv = _mm512_set1_ps(s);
          for (int i = 0; i < MI; ++i) tot[bl].Set(j, i, _mm512_fmadd_ps(sv, acc[j][i], tot[bl].Get(j, i)));
          rec[j] += w.rec_bytes;
        }
      }
    }
    if (g1 % kCorrGroups != 0 && g1 != groups) continue;
    // The corrections of groups c0 .. g1 - 1, as Block adds them after each kCorrGroups groups.
    const int64_t c0 = (g1 - 1) / kCorrGroups * kCorrGroups;
    for (int64_t bl = 0; bl < nb; ++bl) {
      for (int j = 0; j < NJ; ++j)
        for (int64_t gi = c0; gi < g1; ++gi) {
          const uint8_t* rec = w.data + (r0 + bl * NJ + j) * w.row_bytes + gi * w.rec_bytes;
          __builtin_memcpy(&sc[j][gi - c0], rec, 4);
          zc[j][gi - c0] = kCodeFloat[kSym ? 8 : rec[4]];
        }
      AddCorrection<NJ, MI>(sc, zc, acts, c0, g1 - c0, tot[bl]);
    }
  }
  for (int64_t bl = 0; bl < nb; ++bl)
    for (int j = 0; j < NJ; ++j)
      for (int i = 0; i < MI; ++i) {
        const int64_t r = r0 + bl * NJ + j;
        const float v = ReduceTree(tot[bl].Get(j, i));
        y[i * w.n + r] = bias != nullptr ? v + bias[r] : v;
      }
}

using BlockFn = void (*)(const W4PackedWeight&, const W4Bf16Acts*, const float*, float*, int64_t);
using StripFn = void (*)(const W4PackedWeight&, const W4Bf16Acts*, const float*, float*, int64_t, int64_t);

// f.template operator()<NJ, MI>() for runtime nj in 1..4 and mi in 1..8: one switch for the
// instantiations of Block and StripFma.
template <int NJ, typename F>
auto ForActs(int64_t mi, F f) {
  switch (mi) {
    case 8: return f.template operator()<NJ, 8>();
    case 7: return f.template operator()<NJ, 7>();
    case 6: return f.template operator()<NJ, 6>();
    case 5: return f.template operator()<NJ, 5>();
    case 4: return f.template operator()<NJ, 4>();
    case 3: return f.template operator()<NJ, 3>();
    case 2: return f.template operator()<NJ, 2>();
    default: return f.template operator()<NJ, 1>();
  }
}

template <typename F>
auto ForShape(int64_t nj, int64_t mi, F f) {
  switch (nj) {
    case 4: return ForActs<4>(mi, f);
    case 3: return ForActs<3>(mi, f);
    case 2: return ForActs<2>(mi, f);
    default: return ForActs<1>(mi, f);
  }
}

template <bool kSym>
BlockFn SelectBlock(int64_t nj, int64_t mi) {
  return ForShape(nj, mi, []<int NJ, int MI>() -> BlockFn { return Block<NJ, MI, kSym>; });
}

template <bool kSym>
StripFn SelectStrip(int64_t nj, int64_t mi) {
  return ForShape(nj, mi, []<int NJ, int MI>() -> StripFn { return StripFma<NJ, MI, kSym>; });
}

using TileFn = void (*)(const W4PackedWeight&, const W4Bf16Acts*, const float*, float*, int64_t);

template <bool kSym, int kGops>
TileFn TileFor(int64_t mr) {
  switch (mr) {
    case 3: return Tile<3, kSym, kGops>;
    case 2: return Tile<2, kSym, kGops>;
    default: return Tile<1, kSym, kGops>;
  }
}

template <bool kSym>
TileFn SelectGops(int64_t gops, int64_t mr) {
  switch (gops) {
    case 1: return TileFor<kSym, 1>(mr);
    case 2: return TileFor<kSym, 2>(mr);
    default: return TileFor<kSym, 0>(mr);
  }
}

}  // namespace

void GemmW4Bf16Avx512Blocks(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                            int64_t n0, int64_t n1, W4Bf16BlockShape shape, W4Bf16BlockArith arith) {
  NIBBLE_CHECK(w.group_size % 128 == 0 && shape.rows >= 1 && shape.rows <= kW4Bf16BlockMaxRows && shape.acts >= 1 &&
               shape.acts <= kW4Bf16BlockMaxActs);
  for (int64_t i0 = 0; i0 < m; i0 += shape.acts) {
    const int64_t mi = std::min(shape.acts, m - i0);
    const W4Bf16Acts* ai = a + i0;
    float* yi = y + i0 * w.n;
    if (arith == W4Bf16BlockArith::kFma) {
      // Strips of whole blocks, then the strip's remainder as one narrower block.
      for (int64_t r = n0; r < n1; r += kStripRows) {
        const int64_t e = std::min(n1, r + kStripRows), full = r + (e - r) / shape.rows * shape.rows;
        if (full > r) (w.symmetric ? SelectStrip<true> : SelectStrip<false>)(shape.rows, mi)(w, ai, bias, yi, r, full);
        if (e > full) (w.symmetric ? SelectStrip<true> : SelectStrip<false>)(e - full, mi)(w, ai, bias, yi, full, e);
      }
      continue;
    }
    for (int64_t r = n0; r < n1; r += shape.rows) {
      const int64_t nj = std::min(shape.rows, n1 - r);
      (w.symmetric ? SelectBlock<true> : SelectBlock<false>)(nj, mi)(w, ai, bias, yi, r);
    }
  }
}

template <StreamPrefetch P, W4Bf16BlockArith A, W4Bf16Unpack U>
void GemmW4Bf16Avx512(const W4PackedWeight& w, const W4Bf16Acts* a, int64_t m, const float* bias, float* y,
                      int64_t n0, int64_t n1) {
  if (m >= kW4Bf16BlockMinRows && w.group_size % 128 == 0) {
    // FMA blocks from 3 rows (2 rows ran slower in them); 4 x 4 up to 4 rows, where 2 x 8 blocks
    // would be short (docs/PERFORMANCE.md "FMA blocks on Intel without AMX").
    if (A == W4Bf16BlockArith::kFma && m > 2)
      GemmW4Bf16Avx512Blocks(w, a, m, bias, y, n0, n1, m <= 4 ? W4Bf16BlockShape{4, 4} : kW4Bf16BlockShape, A);
    else
      GemmW4Bf16Avx512Blocks(w, a, m, bias, y, n0, n1, kW4Bf16BlockShape);
    return;
  }
  if (m == 1 && w.group_size == 128) {
    const int64_t groups = w.k / 128;
    int64_t r = n0;
    static const int64_t chunk_min_k = W4DecodeChunkMinK(L1DataCacheBytes(), kW4Bf16ActBytesPerGroup);
    const auto chunked = w.symmetric ? RowsG128<kW4DecodeChunkRows, true, P, U> : RowsG128<kW4DecodeChunkRows, false, P, U>;
    const auto one = w.symmetric ? RowsG128<1, true, P, U> : RowsG128<1, false, P, U>;
    if (w.k >= chunk_min_k)
      for (; r + kW4DecodeChunkRows <= n1; r += kW4DecodeChunkRows) chunked(w, a[0], bias, y, r, kW4DecodeChunkGroups);
    for (; r < n1; ++r) one(w, a[0], bias, y, r, groups);
    return;
  }
  const int64_t gops = w.group_size / 32;
  for (int64_t i0 = 0; i0 < m; i0 += kMaxRows) {
    const int64_t mr = std::min(kMaxRows, m - i0);
    const TileFn tile = w.symmetric ? SelectGops<true>(gops, mr) : SelectGops<false>(gops, mr);
    for (int64_t r = n0; r < n1; ++r) tile(w, a + i0, bias, y + i0 * w.n, r);
  }
}

#define NIBBLE_INSTANTIATE(P, A, U)                                                                            \
  template void GemmW4Bf16Avx512<StreamPrefetch::P, W4Bf16BlockArith::A, W4Bf16Unpack::U>(                     \
      const W4PackedWeight&, const W4Bf16Acts*, int64_t, const float*, float*, int64_t, int64_t);
NIBBLE_INSTANTIATE(kNonTemporal, kDpbf16, kMultishift)
NIBBLE_INSTANTIATE(kL1, kDpbf16, kMultishift)
NIBBLE_INSTANTIATE(kNonTemporal, kFma, kMultishift)
NIBBLE_INSTANTIATE(kL1, kFma, kMultishift)
NIBBLE_INSTANTIATE(kNonTemporal, kDpbf16, kShift)
NIBBLE_INSTANTIATE(kL1, kDpbf16, kShift)
NIBBLE_INSTANTIATE(kNonTemporal, kFma, kShift)
NIBBLE_INSTANTIATE(kL1, kFma, kShift)
#undef NIBBLE_INSTANTIATE

}  // namespace nibble

#endif  // __x86_64__
