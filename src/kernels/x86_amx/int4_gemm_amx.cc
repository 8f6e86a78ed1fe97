// AMX-BF16 W4A16 GEMM (see int4_gemm_amx.h). Compiled with -mamx-tile -mamx-bf16 and the AVX-512
// BF16 flags; called only after the dispatcher has checked CPUID, XCR0 and the tile-data grant.
#if defined(__x86_64__)

#include "kernels/x86_amx/int4_gemm_amx.h"

// GCC 12's avx512fintrin.h: see the note in x86_avx512bf16/int4_gemm_bf16.cc.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/x86_avx512bf16/run_words.h"

namespace nibble {
namespace {

// ldtilecfg's 64-byte operand, palette 1.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0, 1 the two chains of even groups, 2, 3 those of odd groups (16 weight rows × M fp32);
// 4, 5 weight runs (16 rows × 32 words); 6, 7 the batch's pair tiles (16 pairs × M dwords).
// Alternating by group lets the next group's products start while this one's are read out.
TileConfig MakeConfig(int64_t m) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = static_cast<uint16_t>(t == 4 || t == 5 ? 64 : 4 * m);
  }
  return c;
}

constexpr int64_t kRunWords = 16 * 32;  // one run of 16 weight rows in the unpack buffer

// The 16 rows' superblock at byte offset `off` of their records as four run tiles in `abuf`
// (run c of row j at abuf[kRunWords·c + 32·j]); rows from `rows` on keep their zeros.
inline void Unpack(const uint8_t* const* row, int64_t rows, int64_t off, const __m512i (&ctl)[4], uint16_t* abuf) {
  for (int64_t j = 0; j < rows; ++j) {
    const __m512i sb = _mm512_loadu_si512(row[j] + off);
    for (int c = 0; c < 4; ++c)
      _mm512_store_si512(abuf + kRunWords * c + 32 * j, (__m512i)RunWords(sb, ctl[c]));
  }
}

// The tile intrinsics take tile numbers as literals (they are pasted into the asm text), so the
// two pairs of chains get one function each from these macros.
#define NIBBLE_AMX_PRODUCTS(C0, C1, abuf, pairs)  \
  do {                                            \
    __asm__ __volatile__("" ::: "memory");        \
    _tile_loadd(4, abuf, 64);                     \
    _tile_loadd(6, pairs, 64);                    \
    _tile_dpbf16ps(C0, 4, 6);                     \
    _tile_loadd(5, abuf + kRunWords, 64);         \
    _tile_loadd(7, pairs + 256, 64);              \
    _tile_dpbf16ps(C1, 5, 7);                     \
    _tile_loadd(4, abuf + 2 * kRunWords, 64);     \
    _tile_loadd(6, pairs + 512, 64);              \
    _tile_dpbf16ps(C0, 4, 6);                     \
    _tile_loadd(5, abuf + 3 * kRunWords, 64);     \
    _tile_loadd(7, pairs + 768, 64);              \
    _tile_dpbf16ps(C1, 5, 7);                     \
  } while (0)

// Group gi of the 16 rows into chains C0, C1 (zeroed first; every superblock's runs, the
// barrier in NIBBLE_AMX_PRODUCTS keeping the unpacked runs' stores before the tile loads that
// read them, which name no memory), then the chains stored to cbuf (two 16 × 16 fp32 blocks).
#define NIBBLE_AMX_GROUP(NAME, C0, C1)                                                                        \
  inline void NAME(const W4PackedWeight& w, const W4Bf16Batch& b, const uint8_t* const* row, int64_t rows,  \
                   int64_t gi, const __m512i(&ctl)[4], uint16_t* abuf, float* cbuf) {                         \
    const int64_t spg = w.group_size / 128;                                                                  \
    _tile_zero(C0);                                                                                          \
    _tile_zero(C1);                                                                                          \
    for (int64_t sb = 0; sb < spg; ++sb) {                                                                   \
      Unpack(row, rows, gi * w.rec_bytes + w.rec_header + 64 * sb, ctl, abuf);                               \
      const uint32_t* pairs = b.pairs + 256 * (gi * 4 * spg + 4 * sb);                                        \
      NIBBLE_AMX_PRODUCTS(C0, C1, abuf, pairs);                                                              \
    }                                                                                                        \
    _tile_stored(C0, cbuf, 64);                                                                              \
    _tile_stored(C1, cbuf + 256, 64);                                                                        \
  }
NIBBLE_AMX_GROUP(EvenGroup, 0, 1)
NIBBLE_AMX_GROUP(OddGroup, 2, 3)
#undef NIBBLE_AMX_GROUP
#undef NIBBLE_AMX_PRODUCTS

// sum[j] = fma(s, chain0 + chain1 + fma(z, 16·c1, 16·c0), sum[j]) for group gi of each row.
template <bool kSym>
inline void AddGroup(const W4PackedWeight& w, const W4Bf16Batch& b, const uint8_t* const* row, int64_t gi,
                     const float* cbuf, __m512 (&sum)[16]) {
  const __m512 c0 = _mm512_load_ps(b.c0 + 16 * gi), c1 = _mm512_load_ps(b.c1 + 16 * gi);
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const uint8_t* rec = row[j] + gi * w.rec_bytes;  // rows past the slice point at its last row
    float s;
    std::memcpy(&s, rec, 4);
    const float z = kSym ? 8.f : static_cast<float>(rec[4]);
    const __m512 chains = _mm512_add_ps(_mm512_load_ps(cbuf + 16 * j), _mm512_load_ps(cbuf + 256 + 16 * j));
    const __m512 corr = _mm512_fmadd_ps(_mm512_set1_ps(z), c1, c0);
    sum[j] = _mm512_fmadd_ps(_mm512_set1_ps(s), _mm512_add_ps(chains, corr), sum[j]);
  }
}

// Weight rows n0 .. n1 (at most 16). Group gi's products run before group gi − 1 is read out.
template <bool kSym>
void Rows16(const W4PackedWeight& w, const W4Bf16Batch& b, const float* bias, float* y, int64_t n0, int64_t n1) {
  const __m512i ctl[4] = {RunControl(0), RunControl(1), RunControl(2), RunControl(3)};
  const int64_t rows = n1 - n0, groups = w.k / w.group_size;
  alignas(64) uint16_t abuf[2][4 * kRunWords];
  alignas(64) float cbuf[2][512];
  if (rows < 16) std::memset(abuf, 0, sizeof abuf);
  // Tile stores write the first M lanes of each row; the rest must be zeros, not stack garbage
  // (a denormal or NaN there costs a microcode assist in every FMA that reads it).
  std::memset(cbuf, 0, sizeof cbuf);
  const uint8_t* row[16];
  for (int64_t j = 0; j < 16; ++j) row[j] = w.data + (n0 + std::min(j, rows - 1)) * w.row_bytes;
  __m512 sum[16];
  for (auto& v : sum) v = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < groups; ++gi) {
    if ((gi & 1) == 0)
      EvenGroup(w, b, row, rows, gi, ctl, abuf[0], cbuf[0]);
    else
      OddGroup(w, b, row, rows, gi, ctl, abuf[1], cbuf[1]);
    if (gi > 0) AddGroup<kSym>(w, b, row, gi - 1, cbuf[(gi - 1) & 1], sum);
  }
  AddGroup<kSym>(w, b, row, groups - 1, cbuf[(groups - 1) & 1], sum);
  for (int64_t j = 0; j < rows; ++j) {
    alignas(64) float v[16];
    _mm512_store_ps(v, sum[j]);
    for (int64_t i = 0; i < b.m; ++i) y[i * w.n + n0 + j] = bias != nullptr ? v[i] + bias[n0 + j] : v[i];
  }
}

}  // namespace

void GemmW4Bf16Amx(const W4PackedWeight& w, const W4Bf16Batch& batch, const float* bias, float* y, int64_t n0,
                   int64_t n1) {
  const TileConfig cfg = MakeConfig(batch.m);
  __asm__ __volatile__("" ::: "memory");  // ldtilecfg's asm names only the first 8 bytes of cfg
  _tile_loadconfig(&cfg);
  for (int64_t r = n0; r < n1; r += 16)
    (w.symmetric ? Rows16<true> : Rows16<false>)(w, batch, bias, y, r, std::min(n1, r + 16));
  _tile_release();
}

}  // namespace nibble

#endif  // __x86_64__
