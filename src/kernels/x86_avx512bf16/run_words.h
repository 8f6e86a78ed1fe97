// The codes of one 32-weight run of a W4P superblock as bf16 words, shared by the AVX-512 BF16
// and AMX kernels (translation units built with -mavx512bf16 -mavx512vbmi).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace nibble {

// Control of vpmultishiftqb for run c (0..3) of a superblock: in every qword (dword lanes 2m,
// 2m + 1), output byte 0 starts at bit 8c (lane 2m, nibble 2c), byte 2 at 8c + 4 (nibble 2c + 1),
// byte 4 at 32 + 8c (lane 2m + 1, nibble 2c), byte 6 at 32 + 8c + 4; odd bytes are masked off.
inline __m512i RunControl(int c) {
  const uint64_t b = static_cast<uint64_t>(8 * c);
  const uint64_t q = b | (b + 4) << 16 | (b + 32) << 32 | (b + 36) << 48;
  return _mm512_set1_epi64(static_cast<long long>(q));
}

// The 32 bf16 words 0x4300 | q of run c of the superblock `sb`: dword lane l holds (low word)
// the code of weight 32c + l and (high word) that of weight 32c + 16 + l.
inline __m512bh RunWords(__m512i sb, __m512i control) {
  const __m512i v = _mm512_multishift_epi64_epi8(control, sb);
  // (v & 0x000F000F) | 0x43004300
  return (__m512bh)_mm512_ternarylogic_epi32(v, _mm512_set1_epi32(0x000F000F), _mm512_set1_epi32(0x43004300), 0xEA);
}

// The same 32 codes of the superblock paired differently, unpacked by a shift instead of a
// vpmultishiftqb: dword lane l holds (low word) nibble C of `sb`'s dword l, i.e. weight
// 16C + l of the superblock, and (high word) nibble C + 4, weight 64 + 16C + l (W4Bf16Acts::xs
// pairs the activations so). Zen 4 issues shifts beside vdpbf16ps, vpmultishiftqb not.
template <int C>
inline __m512bh ShiftWords(__m512i sb) {
  const __m512i v = C == 0 ? sb : _mm512_srli_epi32(sb, 4 * C);
  return (__m512bh)_mm512_ternarylogic_epi32(v, _mm512_set1_epi32(0x000F000F), _mm512_set1_epi32(0x43004300), 0xEA);
}

}  // namespace nibble
