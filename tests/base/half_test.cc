// fp16 / bf16 conversion tests (base/half.h).
//
// Every assertion is bit-exact. References are independent of the code under test: F16ToF32 is
// checked against an ldexp formula, the narrowing conversions against a "pick the nearer of the two
// neighbours, ties to even" rule evaluated in double (exact for these magnitudes), and F32ToF16
// additionally against the compiler's _Float16 conversion where the compiler has one.
#include "base/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace nibble {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

bool IsF16NaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool IsBf16NaN(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// Value of fp16 bits `h` by the IEEE 754 binary16 definition (not NaN).
double F16Value(uint16_t h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 31) return sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), -24);
  return sign * std::ldexp(static_cast<double>(1024 + mant), exp - 25);
}

// Reference fp32 -> fp16: the nearer of the two fp16 neighbours of |x|, ties to the even code;
// with an unbounded exponent the successor of 65504 is 65536, which encodes as inf.
uint16_t RefF32ToF16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  if (std::isnan(x)) return sign | 0x7e00u;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65536.0) return sign | 0x7c00u;
  // Largest finite positive code lo with value(lo) <= a (codes 0..0x7bff are monotonic).
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (F16Value(mid) <= a) lo = mid; else hi = static_cast<uint16_t>(mid - 1);
  }
  const double vlo = F16Value(lo);
  if (vlo == a) return sign | lo;
  const uint16_t up = static_cast<uint16_t>(lo + 1);  // 0x7c00 (inf) stands for 65536
  const double vup = up == 0x7c00u ? 65536.0 : F16Value(up);
  const double dlo = a - vlo, dup = vup - a;  // exact: both operands have <= 24 significant bits
  if (dlo < dup) return sign | lo;
  if (dup < dlo) return sign | up;
  return sign | ((lo & 1u) ? up : lo);
}

// Reference fp32 -> bf16, same rule; bf16 shares fp32's exponent so the neighbours are the
// truncation and the next code (0x7f80 = inf stands for 2^128).
uint16_t RefF32ToBf16(float x) {
  if (std::isnan(x)) return 0;  // not used for NaN
  const uint32_t u = Bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a == 0x7f800000u) return sign | 0x7f80u;
  const uint16_t lo = static_cast<uint16_t>(a >> 16);
  const double vx = static_cast<double>(FromBits(a));
  const double vlo = static_cast<double>(FromBits(static_cast<uint32_t>(lo) << 16));
  const uint16_t up = static_cast<uint16_t>(lo + 1);
  const double vup = up == 0x7f80u ? std::ldexp(1.0, 128) : static_cast<double>(FromBits(static_cast<uint32_t>(up) << 16));
  const double dlo = vx - vlo, dup = vup - vx;
  if (dlo < dup) return sign | lo;
  if (dup < dlo) return sign | up;
  return sign | ((lo & 1u) ? up : lo);
}

TEST(HalfTest, F16ToF32MatchesLdexpFormulaForAll65536Patterns) {
  int failures = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float got = F16ToF32(h);
    if (IsF16NaN(h)) {
      // NaN keeps sign and payload (shifted into the top of the fp32 mantissa).
      const uint32_t want = (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u | (static_cast<uint32_t>(h & 0x3ffu) << 13);
      if (!std::isnan(got) || Bits(got) != want) {
        if (++failures <= 5) ADD_FAILURE() << "h=0x" << std::hex << h << " got bits 0x" << Bits(got);
      }
      continue;
    }
    const float want = static_cast<float>(F16Value(h));  // exact: fp16 values are fp32 values
    if (Bits(got) != Bits(want)) {
      if (++failures <= 5) ADD_FAILURE() << "h=0x" << std::hex << h << " got 0x" << Bits(got) << " want 0x" << Bits(want);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(HalfTest, F16ToF32SpecialValues) {
  EXPECT_EQ(Bits(F16ToF32(0x0000)), 0x00000000u);
  EXPECT_EQ(Bits(F16ToF32(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));  // signalling NaN with the smallest payload
}

TEST(HalfTest, F32ToF16RoundTripsEveryNonNaNF16) {
  int failures = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if (IsF16NaN(h)) continue;
    const uint16_t back = F32ToF16(F16ToF32(h));
    if (back != h && ++failures <= 5) ADD_FAILURE() << "h=0x" << std::hex << h << " -> 0x" << back;
  }
  EXPECT_EQ(failures, 0);
}

TEST(HalfTest, F32ToF16NaNStaysNaNWithSign) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if (!IsF16NaN(h)) continue;
    const uint16_t back = F32ToF16(F16ToF32(h));
    ASSERT_TRUE(IsF16NaN(back)) << std::hex << h << " -> " << back;
    ASSERT_EQ(back & 0x8000u, h & 0x8000u) << std::hex << h;
  }
  // fp32 NaNs whose payload lies only in bits that fp16 drops must not become inf.
  for (uint32_t u : {0x7f800001u, 0xff800001u, 0x7f801fffu, 0x7fc00000u, 0x7fffffffu}) {
    const uint16_t h = F32ToF16(FromBits(u));
    EXPECT_TRUE(IsF16NaN(h)) << std::hex << u << " -> " << h;
    EXPECT_EQ(h & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
  }
}

TEST(HalfTest, F32ToF16InfinityOverflowAndUnderflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(F32ToF16(inf), 0x7c00u);
  EXPECT_EQ(F32ToF16(-inf), 0xfc00u);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::max()), 0x7c00u);
  EXPECT_EQ(F32ToF16(-1e10f), 0xfc00u);
  // 65520 is the midpoint of 65504 (odd mantissa 0x3ff) and 65536: ties to even -> inf.
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00u);
  EXPECT_EQ(F32ToF16(std::nextafter(65520.0f, 0.0f)), 0x7bffu);
  EXPECT_EQ(F32ToF16(-65520.0f), 0xfc00u);
  // Subnormal fp16 boundary: 2^-25 is the midpoint of 0 and 2^-24: ties to even -> 0.
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000u);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -25)), 0x8000u);
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(F32ToF16(3.0f * std::ldexp(1.0f, -25)), 0x0002u);  // 1.5 units -> 2 (even)
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001u);
  // Largest subnormal + half a unit ties to the smallest normal (even).
  EXPECT_EQ(F32ToF16(std::ldexp(2047.0f, -25)), 0x0400u);
  // fp32 subnormals are far below fp16's range: signed zero.
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::denorm_min()), 0x8000u);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000u);
}

// For each pair of adjacent fp16 codes (both signs, subnormals and normals, up to 65504 -> inf)
// the exact midpoint rounds to the even code and one fp32 ulp either side rounds to the nearer.
TEST(HalfTest, F32ToF16TiesToEvenAtEveryMidpoint) {
  int failures = 0;
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint32_t c = 0; c < 0x7c00u; ++c) {
      const uint16_t lo = static_cast<uint16_t>(c), up = static_cast<uint16_t>(c + 1);
      const double vup = up == 0x7c00u ? 65536.0 : F16Value(up);
      const float mid = static_cast<float>((F16Value(lo) + vup) / 2);  // exact in fp32
      const float s = sign ? -1.0f : 1.0f;
      const uint16_t even = (lo & 1u) ? up : lo;
      const uint16_t got_mid = F32ToF16(s * mid);
      const uint16_t got_below = F32ToF16(s * std::nextafter(mid, 0.0f));
      const uint16_t got_above = F32ToF16(s * std::nextafter(mid, 1e30f));
      if ((got_mid != (sign | even) || got_below != (sign | lo) || got_above != (sign | up)) && ++failures <= 5) {
        ADD_FAILURE() << "between 0x" << std::hex << (sign | lo) << " and 0x" << (sign | up) << ": mid->0x" << got_mid
                      << " below->0x" << got_below << " above->0x" << got_above;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// A strided sweep over all 2^32 fp32 patterns (plus random ones) against the reference rule.
TEST(HalfTest, F32ToF16MatchesReferenceOnSweep) {
  int failures = 0;
  auto check = [&](uint32_t u) {
    const float f = FromBits(u);
    const uint16_t got = F32ToF16(f);
    if (std::isnan(f)) {
      if (!IsF16NaN(got) && ++failures <= 5) ADD_FAILURE() << "NaN 0x" << std::hex << u << " -> 0x" << got;
      return;
    }
    const uint16_t want = RefF32ToF16(f);
    if (got != want && ++failures <= 5) ADD_FAILURE() << "f=" << f << " (0x" << std::hex << u << ") got 0x" << got << " want 0x" << want;
  };
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) check(static_cast<uint32_t>(u));
  std::mt19937 rng(12345);
  for (int i = 0; i < 200000; ++i) check(rng());
  EXPECT_EQ(failures, 0);
}

#if defined(__FLT16_MANT_DIG__)
// The compiler's own fp32 -> _Float16 conversion (libgcc __truncsfhf2 / F16C) is RNE as well.
TEST(HalfTest, F32ToF16MatchesCompilerFloat16) {
  int failures = 0;
  auto check = [&](uint32_t u) {
    const float f = FromBits(u);
    volatile float vf = f;  // keep the conversion at run time
    const _Float16 h = static_cast<_Float16>(vf);
    const uint16_t want = std::bit_cast<uint16_t>(h);
    const uint16_t got = F32ToF16(f);
    if (std::isnan(f)) {
      if ((!IsF16NaN(got) || (got & 0x8000u) != (want & 0x8000u)) && ++failures <= 5)
        ADD_FAILURE() << "NaN 0x" << std::hex << u << " -> 0x" << got;
      return;
    }
    if (got != want && ++failures <= 5) ADD_FAILURE() << "f=" << f << " (0x" << std::hex << u << ") got 0x" << got << " _Float16 0x" << want;
  };
  // Every fp32 whose magnitude lies in fp16's range with the low 13 bits at the interesting
  // positions (0, just below/at/above the half-way bit, all ones), both signs; then a sweep.
  for (uint32_t hi = 0; hi < (0x47800000u >> 13); ++hi) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu}) {
      check((hi << 13) | low);
      check(0x80000000u | (hi << 13) | low);
    }
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 65521) check(static_cast<uint32_t>(u));
  EXPECT_EQ(failures, 0);
}
#endif

TEST(HalfTest, Bf16ToF32IsExactShift) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    ASSERT_EQ(Bits(Bf16ToF32(h)), i << 16) << std::hex << h;
  }
}

TEST(HalfTest, F32ToBf16RoundTripsEveryNonNaNBf16) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if (IsBf16NaN(h)) {
      const uint16_t back = F32ToBf16(Bf16ToF32(h));
      ASSERT_TRUE(IsBf16NaN(back)) << std::hex << h << " -> " << back;
      ASSERT_EQ(back & 0x8000u, h & 0x8000u);
      continue;
    }
    ASSERT_EQ(F32ToBf16(Bf16ToF32(h)), h) << std::hex << h;
  }
}

// Midpoint between every pair of adjacent bf16 codes: low half exactly 0x8000.
TEST(HalfTest, F32ToBf16TiesToEvenAtEveryMidpoint) {
  int failures = 0;
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t c = 0; c < 0x7f80u; ++c) {
      const uint32_t mid = ((sign | c) << 16) | 0x8000u;
      const uint16_t lo = static_cast<uint16_t>(sign | c), up = static_cast<uint16_t>(sign | (c + 1));
      const uint16_t even = (c & 1u) ? up : lo;
      const uint16_t got_mid = F32ToBf16(FromBits(mid));
      const uint16_t got_below = F32ToBf16(FromBits(mid - 1));
      const uint16_t got_above = F32ToBf16(FromBits(mid + 1));
      if ((got_mid != even || got_below != lo || got_above != up) && ++failures <= 5) {
        ADD_FAILURE() << "between 0x" << std::hex << lo << " and 0x" << up << ": mid->0x" << got_mid << " below->0x"
                      << got_below << " above->0x" << got_above;
      }
    }
  }
  EXPECT_EQ(failures, 0);
  // Named cases: 1 + 2^-8 lies half-way between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81).
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80u);
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82u);  // 0x3f81 odd -> up
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80u);  // rounds past 0x7f7f -> inf
}

TEST(HalfTest, F32ToBf16NaNInfAndSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(F32ToBf16(inf), 0x7f80u);
  EXPECT_EQ(F32ToBf16(-inf), 0xff80u);
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000u);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000u);
  // NaN payload only in the low 16 bits: plain truncation/rounding would give inf.
  for (uint32_t u : {0x7f800001u, 0xff800001u, 0x7f807fffu, 0x7f808000u, 0x7fc00000u, 0xffffffffu}) {
    const uint16_t h = F32ToBf16(FromBits(u));
    EXPECT_TRUE(IsBf16NaN(h)) << std::hex << u << " -> " << h;
    EXPECT_EQ(h & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
  }
  // fp32 subnormals map to bf16 subnormals (same exponent range), rounded to nearest even.
  EXPECT_EQ(F32ToBf16(FromBits(0x00010000u)), 0x0001u);
  EXPECT_EQ(F32ToBf16(FromBits(0x00008000u)), 0x0000u);  // tie -> even 0
  EXPECT_EQ(F32ToBf16(FromBits(0x00018000u)), 0x0002u);  // tie -> even 2
  EXPECT_EQ(F32ToBf16(FromBits(0x80008001u)), 0x8001u);
  EXPECT_EQ(F32ToBf16(FromBits(0x007fffffu)), 0x0080u);  // largest subnormal -> smallest normal
}

TEST(HalfTest, F32ToBf16MatchesReferenceOnSweep) {
  int failures = 0;
  auto check = [&](uint32_t u) {
    const float f = FromBits(u);
    const uint16_t got = F32ToBf16(f);
    if (std::isnan(f)) {
      if (!IsBf16NaN(got) && ++failures <= 5) ADD_FAILURE() << "NaN 0x" << std::hex << u << " -> 0x" << got;
      return;
    }
    const uint16_t want = RefF32ToBf16(f);
    if (got != want && ++failures <= 5) ADD_FAILURE() << "0x" << std::hex << u << " got 0x" << got << " want 0x" << want;
  };
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) check(static_cast<uint32_t>(u));
  std::mt19937 rng(54321);
  for (int i = 0; i < 200000; ++i) check(rng());
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace nibble
