// The arithmetic of the vectorised row ops (kernels/vec_ops.h), written once and included by each
// ISA's translation unit (kernels/vec_ops.cc, x86_avx2/, x86_avx512/), which compiles it with its
// own -m flags plus -ffp-contract=off (no FMA contraction, so every ISA rounds the same) and
// -fno-trapping-math (ExpF's clamps then if-convert and the loops vectorise); CMakeLists.txt sets
// both. Reductions are written on 16- / 8-lane GCC vectors, which each ISA splits into its own
// registers: the lane structure, and so the bits, do not depend on the vector width. Internal
// linkage, so each unit keeps its own copy built with its own flags.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/half.h"
#include "kernels/exp_f.h"
#include "kernels/vec_ops.h"

namespace nibble {
namespace {

void ExpShiftedImpl(float* row, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) row[i] = ExpF(row[i] + shift);
}

void ScaledSoftmaxRowImpl(float* row, int64_t valid, int64_t len, float scale) {
  // 16 lanes as one GCC vector: written as an array of 16 floats, GCC kept these reductions scalar.
  typedef float Lanes __attribute__((vector_size(64)));
  constexpr int kLanes = 16;
  for (int64_t i = 0; i < valid; ++i) row[i] *= scale;
  Lanes lane_max = Lanes{} - 3.0e38f;
  int64_t j = 0;
  for (; j + kLanes <= valid; j += kLanes) {
    Lanes v;
    __builtin_memcpy(&v, row + j, sizeof(v));
    lane_max = v > lane_max ? v : lane_max;
  }
  float mx = -3.0e38f;
  for (; j < valid; ++j) mx = row[j] > mx ? row[j] : mx;
  for (int l = 0; l < kLanes; ++l) mx = lane_max[l] > mx ? lane_max[l] : mx;
  ExpShiftedImpl(row, valid, -mx);
  Lanes lane_sum = Lanes{};
  j = 0;
  for (; j + kLanes <= valid; j += kLanes) {
    Lanes v;
    __builtin_memcpy(&v, row + j, sizeof(v));
    lane_sum += v;
  }
  float sum = 0.0f;
  for (; j < valid; ++j) sum += row[j];
  for (int l = 0; l < kLanes; ++l) sum += lane_sum[l];
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < valid; ++i) row[i] *= inv;
  for (int64_t i = valid; i < len; ++i) row[i] = 0.0f;
}

double SquaredErrorSumImpl(const float* a, const float* b, int64_t n) {
  typedef double Lanes __attribute__((vector_size(64)));
  typedef float Floats __attribute__((vector_size(32)));
  Lanes acc = Lanes{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Floats fa, fb;
    __builtin_memcpy(&fa, a + i, sizeof(fa));
    __builtin_memcpy(&fb, b + i, sizeof(fb));
    const Lanes d = __builtin_convertvector(fa, Lanes) - __builtin_convertvector(fb, Lanes);
    acc += d * d;
  }
  double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return s;
}

// RTN's row passes (kernels/vec_ops.h). Every lane operation is the IEEE operation the scalar
// reference performs (min/max, a product and a sum each rounded to fp32, round half to even,
// the int difference times the scale), so any vector width gives the reference's bits; the two
// error sums stay sequential scalar chains in column order.
typedef float RtnF __attribute__((vector_size(64)));
typedef int32_t RtnI __attribute__((vector_size(64)));
typedef uint32_t RtnU __attribute__((vector_size(64)));
typedef uint16_t RtnH __attribute__((vector_size(32)));
typedef uint8_t RtnB __attribute__((vector_size(16)));
typedef float RtnF8 __attribute__((vector_size(32)));
typedef double RtnD8 __attribute__((vector_size(64)));
constexpr int kRtnLanes = 16;

// Round half to even of each lane (the default rounding mode's nearbyint), in place (a 64-byte
// vector passed by value would change the ABI between the units' flags).
inline void RtnRoundEven(RtnF* v) {
#if defined(__AVX512F__)
  *v = reinterpret_cast<RtnF>(_mm512_roundscale_ps(reinterpret_cast<__m512>(*v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__AVX__)
  __m256 h[2];
  std::memcpy(h, v, sizeof(*v));
  h[0] = _mm256_round_ps(h[0], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  h[1] = _mm256_round_ps(h[1], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  std::memcpy(v, h, sizeof(*v));
#else
  for (int l = 0; l < kRtnLanes; ++l) (*v)[l] = std::nearbyint((*v)[l]);
#endif
}

// How far ahead of the bf16 row pass the weights are asked for: the hardware prefetchers stop at
// each 4 KiB page of the mapping, the pass reads whole pages in order (on into the next row).
constexpr int64_t kRtnPrefetchBytes = 2048;

bool RtnRowRangeImpl(const uint8_t* src, RowDType dtype, int64_t k, int64_t g, float* x, float* mn, float* mx) {
  int64_t i = 0;
  if (dtype == RowDType::kF32) {
    std::memcpy(x, src, static_cast<size_t>(k) * 4);
  } else if (dtype == RowDType::kBF16) {
    for (; i + kRtnLanes <= k; i += kRtnLanes) {
      if (i % 32 == 0) __builtin_prefetch(src + 2 * i + kRtnPrefetchBytes);  // one cache line per two steps
      RtnH h;
      std::memcpy(&h, src + 2 * i, sizeof(h));
      const RtnU u = __builtin_convertvector(h, RtnU) << 16;
      std::memcpy(x + i, &u, sizeof(u));
    }
    for (; i < k; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      x[i] = Bf16ToF32(h);
    }
  } else {
    for (; i < k; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      x[i] = F16ToF32(h);
    }
  }
  // inf / nan: exponent bits all set.
  RtnU bad = RtnU{};
  const RtnU exp_mask = RtnU{} + 0x7f800000u;
  for (int64_t j = 0; j < k / g; ++j) {
    const float* xg = x + j * g;
    RtnF lmn = RtnF{}, lmx = RtnF{};
    int64_t c = 0;
    for (; c + kRtnLanes <= g; c += kRtnLanes) {
      RtnF v;
      std::memcpy(&v, xg + c, sizeof(v));
      RtnU u;
      std::memcpy(&u, &v, sizeof(u));
      bad |= reinterpret_cast<RtnU>((u & exp_mask) == exp_mask);
      lmn = v < lmn ? v : lmn;
      lmx = lmx < v ? v : lmx;
    }
    float gmn = 0.f, gmx = 0.f;
    for (int l = 0; l < kRtnLanes; ++l) {
      gmn = lmn[l] < gmn ? lmn[l] : gmn;
      gmx = gmx < lmx[l] ? lmx[l] : gmx;
    }
    for (; c < g; ++c) {
      const float v = xg[c];
      if (!std::isfinite(v)) return false;
      gmn = v < gmn ? v : gmn;
      gmx = gmx < v ? v : gmx;
    }
    mn[j] = gmn;
    mx[j] = gmx;
  }
  for (int l = 0; l < kRtnLanes; ++l)
    if (bad[l] != 0) return false;
  return true;
}

void RtnRowCodesImpl(const float* x, int64_t k, int64_t g, const float* s, const float* inv, const float* z, bool symmetric,
                     uint8_t* codes, double* num_out, double* den_out) {
  const float lo = symmetric ? -8.f : 0.f, hi = symmetric ? 7.f : 15.f;
  const int32_t code_bias = symmetric ? 8 : 0;
  double num = *num_out, den = *den_out;
  for (int64_t j = 0; j < k / g; ++j) {
    const float* xg = x + j * g;
    uint8_t* cg = codes + j * g;
    const float gs = s[j], ginv = inv[j], gz = z[j];
    const int32_t zp = symmetric ? 0 : static_cast<int32_t>(gz);  // code - zero point = q - zp
    int64_t c = 0;
    for (; c + kRtnLanes <= g; c += kRtnLanes) {
      RtnF v;
      std::memcpy(&v, xg + c, sizeof(v));
      const RtnF p = v * ginv;  // rounded to fp32 on its own: no contraction in these units
      RtnF q = p + gz;
      RtnRoundEven(&q);
      q = q < lo ? RtnF{} + lo : q;
      q = hi < q ? RtnF{} + hi : q;
      const RtnI qi = __builtin_convertvector(q, RtnI);
      const RtnB code = __builtin_convertvector(qi + code_bias, RtnB);
      std::memcpy(cg + c, &code, sizeof(code));
      const RtnF deq = __builtin_convertvector(qi - zp, RtnF) * gs;
      for (int h = 0; h < 2; ++h) {
        RtnF8 xv, dv;
        std::memcpy(&xv, reinterpret_cast<const float*>(&v) + 8 * h, sizeof(xv));
        std::memcpy(&dv, reinterpret_cast<const float*>(&deq) + 8 * h, sizeof(dv));
        const RtnD8 xd = __builtin_convertvector(xv, RtnD8);
        const RtnD8 d = xd - __builtin_convertvector(dv, RtnD8);
        const RtnD8 dd = d * d, ww = xd * xd;
        for (int l = 0; l < 8; ++l) {
          num += dd[l];
          den += ww[l];
        }
      }
    }
    for (; c < g; ++c) {
      const float p = xg[c] * ginv;
      float q = std::nearbyint(p + gz);
      q = q < lo ? lo : q;
      q = hi < q ? hi : q;
      const int32_t qi = static_cast<int32_t>(q);
      cg[c] = static_cast<uint8_t>(qi + code_bias);
      const float deq = static_cast<float>(qi - zp) * gs;
      const double d = static_cast<double>(xg[c]) - deq;
      num += d * d;
      den += static_cast<double>(xg[c]) * xg[c];
    }
  }
  *num_out = num;
  *den_out = den;
}

void RtnRowDequantDivImpl(const uint8_t* codes, int64_t k, int64_t g, const float* s, const int32_t* zp, const float* d,
                          float* out) {
  for (int64_t j = 0; j < k / g; ++j) {
    const uint8_t* cg = codes + j * g;
    const float* dg = d + j * g;
    float* og = out + j * g;
    const float gs = s[j];
    const int32_t gz = zp[j];
    // A plain loop: GCC vectorises it at the unit's width with zero-extending loads, where
    // 16-lane GCC vectors of bytes were widened lane by lane through scalar registers.
    for (int64_t c = 0; c < g; ++c) og[c] = static_cast<float>(int32_t{cg[c]} - gz) * gs / dg[c];
  }
}

// base/half.h F32ToBf16 (round to nearest even, NaN kept and made quiet), branch-free so the
// loop vectorises at this unit's width (16-lane GCC vectors here were split into slow code
// without AVX-512); widened back to fp32 values with `widen` (RoundToBf16), else bf16 bits.
template <bool widen, typename Out>
void Bf16RoundImpl(const float* x, int64_t n, Out* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, sizeof(u));
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t h = (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded;
    if constexpr (widen) {
      const uint32_t f = h << 16;
      std::memcpy(out + i, &f, sizeof(f));
    } else {
      out[i] = static_cast<uint16_t>(h);
    }
  }
}

void ToBf16BitsImpl(const float* x, int64_t n, uint16_t* out) { Bf16RoundImpl<false>(x, n, out); }
void RoundToBf16Impl(const float* x, int64_t n, float* out) { Bf16RoundImpl<true>(x, n, out); }

// PrepareActsBf16's per-value work (VecKernels::bf16_acts) in blocks of up to 128 values
// (one superblock): the block rounded once into b, then each layout written from b through a
// dword temp (whole-vector stores; the words of one dword are two values 16 positions apart).
// σ is the only sequential part: fp32 adds in K order, so its bits are the scalar loop's.
void Bf16ActsImpl(const float* x, int64_t k, int64_t g, uint16_t* xb, float* xf, uint16_t* xs, float* sigma) {
  for (int64_t gi = 0; gi < k / g; ++gi) sigma[gi] = 0.f;
  for (int64_t u0 = 0; u0 < k; u0 += 128) {
    const int64_t len = k - u0 < 128 ? k - u0 : 128;  // a multiple of 32 (k % g == 0, g % 32 == 0)
    uint32_t b[128], pair[64], daz[128];
    Bf16RoundImpl<false>(x + u0, len, b);
    for (int64_t r = 0; r < len / 32; ++r)  // run r: word 2l <- 32r + l, word 2l + 1 <- 32r + 16 + l
      for (int64_t l = 0; l < 16; ++l) pair[16 * r + l] = b[32 * r + l] | b[32 * r + 16 + l] << 16;
    std::memcpy(xb + u0, pair, static_cast<size_t>(len) * 2);
    for (int64_t i = 0; i < len; ++i)  // vdpbf16ps reads a subnormal as zero of its sign (DAZ)
      daz[i] = ((b[i] & 0x7F80u) != 0 ? b[i] : b[i] & 0x8000u) << 16;
    std::memcpy(xf + u0, daz, static_cast<size_t>(len) * 4);
    if (xs != nullptr) {  // g = 128, len = 128: word 32c + 2l <- 16c + l, word 32c + 2l + 1 <- 64 + 16c + l
      for (int64_t c = 0; c < 4; ++c)
        for (int64_t l = 0; l < 16; ++l) pair[16 * c + l] = b[16 * c + l] | b[64 + 16 * c + l] << 16;
      std::memcpy(xs + u0, pair, 256);
    }
    for (int64_t i = 0; i < len;) {  // the groups this block touches, each summed on in order
      const int64_t gi = (u0 + i) / g, end = (gi + 1) * g - u0 < len ? (gi + 1) * g - u0 : len;
      float s = sigma[gi];
      for (; i < end; ++i) {
        const uint32_t w = b[i] << 16;
        float v;
        std::memcpy(&v, &w, sizeof(v));
        s += v;
      }
      sigma[gi] = s;
    }
  }
}

// This unit's table; `name` is its ISA.
VecKernels VecKernelsOfThisUnit(const char* name) {
  VecKernels k;
  k.name = name;
  k.exp_shifted = ExpShiftedImpl;
  k.scaled_softmax_row = ScaledSoftmaxRowImpl;
  k.squared_error_sum = SquaredErrorSumImpl;
  k.rtn_row_range = RtnRowRangeImpl;
  k.rtn_row_codes = RtnRowCodesImpl;
  k.rtn_row_dequant_div = RtnRowDequantDivImpl;
  k.to_bf16_bits = ToBf16BitsImpl;
  k.round_to_bf16 = RoundToBf16Impl;
  k.bf16_acts = Bf16ActsImpl;
  return k;
}

}  // namespace
}  // namespace nibble
