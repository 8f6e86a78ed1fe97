// Packing to / from the W4P layout and the scalar kernels on it (see int4_packed.h).
#include "kernels/int4_packed.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/check.h"
#include "base/half.h"
#include "kernels/int4_dispatch.h"

#include <unistd.h>

namespace nibble {

W4PackedWeight W4PackedGeometry(int64_t n, int64_t k, int64_t g, bool symmetric) {
  NIBBLE_CHECK_MSG(n >= 1 && k >= 1 && g >= 1 && k % g == 0, "n=%lld k=%lld g=%lld", static_cast<long long>(n),
                   static_cast<long long>(k), static_cast<long long>(g));
  W4PackedWeight w;
  w.n = n;
  w.k = k;
  w.group_size = g;
  w.symmetric = symmetric;
  w.rec_weights = g % 16 == 0 ? std::lcm(g, int64_t{128}) : g;
  w.rec_groups = w.rec_weights / g;
  w.rec_header = w.rec_groups * (symmetric ? 4 : 5);
  w.rec_bytes = w.rec_header + 64 * ((w.rec_weights + 127) / 128);
  w.recs = (k + w.rec_weights - 1) / w.rec_weights;
  w.row_bytes = w.recs * w.rec_bytes;
  return w;
}

int64_t W4PackedBytes(int64_t n, int64_t k, int64_t g, bool symmetric) {
  return n * W4PackedGeometry(n, k, g, symmetric).row_bytes;
}

W4PackedWeight PackW4(int64_t n, int64_t k, int64_t g, bool symmetric, const uint8_t* codes, const float* scales,
                      const uint8_t* zero_points, uint8_t* out) {
  W4PackedWeight w = W4PackedGeometry(n, k, g, symmetric);
  w.data = out;
  const int64_t groups = k / g;
  // Rows are independent (disjoint output bytes); threads only shorten a model's load.
#pragma omp parallel for schedule(static) if (n * k >= (int64_t{1} << 20))
  for (int64_t r = 0; r < n; ++r)
    for (int64_t ri = 0; ri < w.recs; ++ri) {
      uint8_t* rec = out + r * w.row_bytes + ri * w.rec_bytes;
      std::memset(rec, 0, static_cast<size_t>(w.rec_bytes));
      const int64_t k0 = ri * w.rec_weights;
      for (int64_t gi = 0; gi < w.rec_groups && k0 / g + gi < groups; ++gi) {
        const int64_t G = k0 / g + gi;
        std::memcpy(rec + 4 * gi, &scales[r * groups + G], 4);
        if (!symmetric) {
          NIBBLE_CHECK(zero_points[r * groups + G] <= 15);
          rec[4 * w.rec_groups + gi] = zero_points[r * groups + G];
        }
      }
      // Whole superblocks: dword lane l gathers codes 16j + l (j = 0..7) as its nibbles j.
      int64_t o = 0;
      for (; o + 128 <= w.rec_weights && k0 + o + 128 <= k; o += 128) {
        const uint8_t* q = codes + r * k + k0 + o;
        uint8_t* sb = rec + w.rec_header + o / 2;
        unsigned any = 0;
        for (int l = 0; l < 16; ++l) {
          uint32_t d = 0;
          for (int j = 0; j < 8; ++j) {
            any |= q[16 * j + l];
            d |= static_cast<uint32_t>(q[16 * j + l]) << (4 * j);
          }
          std::memcpy(sb + 4 * l, &d, 4);
        }
        NIBBLE_CHECK(any <= 15);
      }
      for (; o < w.rec_weights && k0 + o < k; ++o) {
        const uint8_t q = codes[r * k + k0 + o];
        NIBBLE_CHECK(q <= 15);
        const int64_t b = o / 128, j = (o % 128) / 16, l = o % 16;
        rec[w.rec_header + 64 * b + 4 * l + j / 2] |= static_cast<uint8_t>((j & 1) ? q << 4 : q);
      }
    }
  return w;
}

void UnpackW4(const W4PackedWeight& w, uint8_t* codes, float* scales, uint8_t* zero_points) {
  const int64_t g = w.group_size, groups = w.k / g;
  for (int64_t r = 0; r < w.n; ++r)
    for (int64_t ri = 0; ri < w.recs; ++ri) {
      const uint8_t* rec = w.data + r * w.row_bytes + ri * w.rec_bytes;
      const int64_t k0 = ri * w.rec_weights;
      for (int64_t gi = 0; gi < w.rec_groups && k0 / g + gi < groups; ++gi) {
        scales[r * groups + k0 / g + gi] = w4p::Scale(rec, gi);
        zero_points[r * groups + k0 / g + gi] = static_cast<uint8_t>(w4p::Zero(w, rec, gi));
      }
      for (int64_t o = 0; o < w.rec_weights && k0 + o < w.k; ++o)
        codes[r * w.k + k0 + o] = static_cast<uint8_t>(w4p::CodeAt(w, rec, o));
    }
}

void GemmW4A32PackedScalar(const W4PackedGemmArgs& a, int64_t n0, int64_t n1) {
  const W4PackedWeight& w = *a.w;
  const int64_t g = w.group_size;
  for (int64_t i = 0; i < a.m; ++i) {
    const float* x = a.x + i * w.k;
    for (int64_t r = n0; r < n1; ++r) {
      float acc = 0.f;
      for (int64_t ri = 0; ri < w.recs; ++ri) {
        const uint8_t* rec = w.data + r * w.row_bytes + ri * w.rec_bytes;
        const int64_t k0 = ri * w.rec_weights;
        for (int64_t gi = 0; gi < w.rec_groups && k0 + gi * g < w.k; ++gi) {
          const float scale = w4p::Scale(rec, gi);
          const int zero = w4p::Zero(w, rec, gi);
          for (int64_t o = gi * g; o < (gi + 1) * g; ++o) {
            const float wv = static_cast<float>(w4p::CodeAt(w, rec, o) - zero) * scale;
            acc += x[k0 + o] * wv;
          }
        }
      }
      a.y[i * w.n + r] = a.bias != nullptr ? acc + a.bias[r] : acc;
    }
  }
}

void DequantW4PackedScalar(const W4PackedWeight& w, int64_t n0, int64_t n1, float* out) {
  const int64_t g = w.group_size;
  for (int64_t r = n0; r < n1; ++r)
    for (int64_t ri = 0; ri < w.recs; ++ri) {
      const uint8_t* rec = w.data + r * w.row_bytes + ri * w.rec_bytes;
      const int64_t k0 = ri * w.rec_weights;
      for (int64_t gi = 0; gi < w.rec_groups && k0 + gi * g < w.k; ++gi) {
        const float scale = w4p::Scale(rec, gi);
        const int zero = w4p::Zero(w, rec, gi);
        for (int64_t o = gi * g; o < (gi + 1) * g; ++o)
          out[(r - n0) * w.k + k0 + o] = static_cast<float>(w4p::CodeAt(w, rec, o) - zero) * scale;
      }
    }
}

void DequantW4PackedBf16Scalar(const W4PackedWeight& w, int64_t n0, int64_t n1, uint16_t* out) {
  std::vector<float> row(static_cast<size_t>(w.k));
  for (int64_t r = n0; r < n1; ++r) {
    DequantW4PackedScalar(w, r, r + 1, row.data());
    ToBf16Bits(row.data(), w.k, out + (r - n0) * w.k);
  }
}

bool W4Int8ServesGroupSize(int64_t group_size) {
  return group_size == 32 || group_size == 64 || (group_size > 0 && group_size % 128 == 0);
}

bool W4Int8Supported(const W4PackedWeight& w) { return W4Int8ServesGroupSize(w.group_size); }

int64_t W4Int8Parts(int64_t group_size) { return group_size < 128 ? 128 / group_size : 1; }

namespace {

struct ActsLayout {
  size_t x8 = 0, xs = 0, sx = 0, total = 0;  // byte offsets
};

size_t Align64(size_t v) { return (v + 63) / 64 * 64; }

ActsLayout ActsLayoutFor(int64_t k, int64_t parts) {
  const size_t blocks = static_cast<size_t>((k + 127) / 128), p = static_cast<size_t>(parts);
  ActsLayout l;
  l.x8 = 0;
  l.xs = Align64(blocks * 128);
  l.sx = l.xs + Align64(blocks * 4);
  l.total = l.sx + Align64(blocks * p * 4);
  return l;
}

}  // namespace

size_t W4Int8ActsBytes(int64_t k, int64_t parts) { return ActsLayoutFor(k, parts).total; }

W4Int8Acts QuantizeActsInt8(const float* x, int64_t k, int64_t parts, uint8_t* scratch) {
  NIBBLE_CHECK(k >= 1 && (parts == 1 || parts == 2 || parts == 4));
  const ActsLayout l = ActsLayoutFor(k, parts);
  W4Int8Acts a;
  a.k = k;
  a.blocks = (k + 127) / 128;
  a.parts = parts;
  int8_t* x8 = reinterpret_cast<int8_t*>(scratch + l.x8);
  float* xs = reinterpret_cast<float*>(scratch + l.xs);
  int32_t* sx = reinterpret_cast<int32_t*>(scratch + l.sx);
  for (int64_t t = 0; t < a.blocks; ++t) {
    const int64_t k0 = 128 * t, len = std::min<int64_t>(128, k - k0);
    float amax = 0.f;
    for (int64_t o = 0; o < len; ++o) amax = std::max(amax, std::fabs(x[k0 + o]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    xs[t] = amax / 127.f;
    int8_t q[128] = {};
    // Round half to even by the 1.5·2^23 trick: for |v| < 2^22, (v + 1.5·2^23) − 1.5·2^23 is v
    // rounded to an integer in the current rounding mode, exactly std::nearbyint(v) — without a
    // libm call per value, so the loop vectorises (|v| <= 127 here; NaN stays NaN and maps to 0).
    constexpr float kRound = 12582912.0f;
    for (int64_t o = 0; o < len; ++o) {
      const float v = (x[k0 + o] * inv + kRound) - kRound;
      q[o] = static_cast<int8_t>(v > 127.f ? 127 : (v < -127.f ? -127 : (v == v ? static_cast<int>(v) : 0)));
    }
    // A: byte i of dword lane l = code at 32i + l; B: 32i + 16 + l. Byte i lies in part
    // i · parts / 4 (parts of 128 / parts values: 32i + l and 32i + 16 + l share a part).
    int8_t* A = x8 + t * 128;
    int8_t* B = A + 64;
    for (int64_t p = 0; p < parts; ++p) sx[t * parts + p] = 0;
    for (int l2 = 0; l2 < 16; ++l2)
      for (int i = 0; i < 4; ++i) {
        A[4 * l2 + i] = q[32 * i + l2];
        B[4 * l2 + i] = q[32 * i + 16 + l2];
        sx[t * parts + i * parts / 4] += q[32 * i + l2] + q[32 * i + 16 + l2];
      }
  }
  a.x8 = x8;
  a.xs = xs;
  a.sx = sx;
  return a;
}

void GemmW4A8PackedScalar(const W4PackedWeight& w, const W4Int8Acts* acts, int64_t m, const float* bias, float* y,
                          int64_t n0, int64_t n1) {
  const int64_t g = w.group_size, sb_per_rec = w.rec_weights / 128;
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t r = n0; r < n1; ++r) {
      const W4Int8Acts& a = acts[row];
      const int64_t part_len = 128 / a.parts;
      float acc[16] = {};
      for (int64_t t = 0; t < a.blocks; ++t) {
        const uint8_t* rec = w.data + r * w.row_bytes + (t / sb_per_rec) * w.rec_bytes;
        const int64_t b = t % sb_per_rec;
        const uint8_t* sb = rec + w.rec_header + 64 * b;
        for (int64_t p = 0; p < a.parts; ++p) {
          if (128 * t + p * part_len >= w.k) break;
          const int64_t gi = a.parts > 1 ? p : (128 * b) / g;
          const int8_t* A = a.x8 + t * 128;
          const int8_t* B = A + 64;
          const float fs = w4p::Scale(rec, gi) * a.xs[t];
          for (int l = 0; l < 16; ++l) {
            // Lane 0 starts at the part's zero-point term −z·Σx8, so the subtraction is exact.
            int32_t v = l == 0 ? -w4p::Zero(w, rec, gi) * a.sx[t * a.parts + p] : 0;
            for (int i = 0; i < 4; ++i)
              if (i * a.parts / 4 == p) v += (sb[4 * l + i] & 15) * A[4 * l + i] + (sb[4 * l + i] >> 4) * B[4 * l + i];
            acc[l] = std::fma(fs, static_cast<float>(v), acc[l]);
          }
        }
      }
      for (int h = 8; h >= 1; h /= 2)
        for (int l = 0; l < h; ++l) acc[l] = acc[l] + acc[l + h];
      y[row * w.n + r] = bias != nullptr ? acc[0] + bias[r] : acc[0];
    }
  }
}

int64_t L1DataCacheBytes() {
#if defined(_SC_LEVEL1_DCACHE_SIZE)  // glibc
  const long b = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#else
  const long b = 0;
#endif
  return b > 0 ? static_cast<int64_t>(b) : 32 * 1024;
}

int64_t W4DecodeChunkMinK(int64_t l1d_bytes, int64_t act_bytes_per_group) {
  const int64_t budget = 3 * l1d_bytes / 4;
  return (budget + act_bytes_per_group - 1) / act_bytes_per_group * 128;
}

bool W4Bf16ServesGroupSize(int64_t group_size) { return group_size >= 32 && group_size % 32 == 0; }

bool W4Bf16Supported(const W4PackedWeight& w) { return W4Bf16ServesGroupSize(w.group_size); }

namespace {

struct Bf16Layout {
  size_t xb = 0, c0 = 0, c1 = 0, zc = 0, xf = 0, xs = 0, total = 0;  // byte offsets; xs 0: none
};

Bf16Layout Bf16LayoutFor(int64_t k, int64_t group_size) {
  const size_t runs = static_cast<size_t>((k + 31) / 32), groups = static_cast<size_t>(k / group_size);
  Bf16Layout l;
  l.xb = 0;
  l.c0 = Align64(runs * 64);
  l.c1 = l.c0 + Align64(groups * 4);
  l.zc = l.c1 + Align64(groups * 4);
  l.xf = l.zc + groups * 64;
  l.total = l.xf + runs * 128;
  if (group_size == 128) {
    l.xs = l.total;
    l.total += runs * 64;
  }
  return l;
}

}  // namespace

size_t W4Bf16ActsBytes(int64_t k, int64_t group_size) { return Bf16LayoutFor(k, group_size).total; }

W4Bf16Acts PrepareActsBf16(const float* x, int64_t k, int64_t group_size, uint8_t* scratch) {
  NIBBLE_CHECK(k >= 1 && group_size >= 32 && group_size % 32 == 0 && k % group_size == 0);
  const Bf16Layout l = Bf16LayoutFor(k, group_size);
  W4Bf16Acts a;
  a.k = k;
  a.group_size = group_size;
  a.runs = (k + 31) / 32;
  uint16_t* xb = reinterpret_cast<uint16_t*>(scratch + l.xb);
  float* c0 = reinterpret_cast<float*>(scratch + l.c0);
  float* c1 = reinterpret_cast<float*>(scratch + l.c1);
  float* zc = reinterpret_cast<float*>(scratch + l.zc);
  float* xf = reinterpret_cast<float*>(scratch + l.xf);
  uint16_t* xs = l.xs != 0 ? reinterpret_cast<uint16_t*>(scratch + l.xs) : nullptr;
  // Each value rounded once, stored at its words and added to its group's σ in k order (the active
  // ISA's row op; every ISA gives the same bits). k % g == 0 and g % 32 == 0, so the runs cover K.
  ActiveW4Dispatch().kernels.vec.bf16_acts(x, k, group_size, xb, xf, xs, c0);
  for (int64_t gi = 0; gi < k / group_size; ++gi) {
    const float sigma = c0[gi];
    c0[gi] = -8.f * sigma;
    c1[gi] = sigma * (-1.f / 16.f);
    // fma(z, c1, c0) without a libm call: z·c1 + c0 is exact in double (a 4-bit by 24-bit product
    // beside a 24-bit term), so the one rounding to float is the fma's.
    const double d0 = c0[gi], d1 = c1[gi];
    for (int z = 0; z < 16; ++z) zc[16 * gi + z] = static_cast<float>(z * d1 + d0);
  }
  a.xb = xb;
  a.c0 = c0;
  a.c1 = c1;
  a.zc = zc;
  a.xf = xf;
  a.xs = xs;
  return a;
}

size_t W4Bf16BatchBytes(int64_t k, int64_t group_size) {
  NIBBLE_CHECK(k >= 1 && group_size >= 32 && k % group_size == 0);
  const size_t runs = static_cast<size_t>((k + 31) / 32), groups = static_cast<size_t>(k / group_size);
  return runs * 1024 + 2 * groups * 64;
}

W4Bf16Batch PrepareBf16Batch(const W4Bf16Acts* a, int64_t m, uint8_t* scratch) {
  NIBBLE_CHECK(m >= 1 && m <= kW4Bf16BatchMaxRows && a != nullptr && scratch != nullptr);
  W4Bf16Batch b;
  b.m = m;
  b.k = a[0].k;
  b.group_size = a[0].group_size;
  b.runs = a[0].runs;
  for (int64_t i = 1; i < m; ++i) NIBBLE_CHECK(a[i].k == b.k && a[i].group_size == b.group_size);
  const int64_t groups = b.k / b.group_size;
  uint32_t* pairs = reinterpret_cast<uint32_t*>(scratch);
  float* c0 = reinterpret_cast<float*>(scratch + b.runs * 1024);
  float* c1 = c0 + groups * 16;
  for (int64_t u = 0; u < b.runs; ++u)
    for (int64_t l = 0; l < 16; ++l) {
      uint32_t* dst = pairs + 256 * u + 16 * l;
      for (int64_t i = 0; i < m; ++i) std::memcpy(dst + i, a[i].xb + 32 * u + 2 * l, 4);
      std::fill(dst + m, dst + 16, 0u);
    }
  for (int64_t gi = 0; gi < groups; ++gi)
    for (int64_t i = 0; i < 16; ++i) {
      c0[16 * gi + i] = i < m ? 16.f * a[i].c0[gi] : 0.f;
      c1[16 * gi + i] = i < m ? 16.f * a[i].c1[gi] : 0.f;
    }
  b.pairs = pairs;
  b.c0 = c0;
  b.c1 = c1;
  return b;
}

void RoundToBf16(const float* x, int64_t n, float* out) { ActiveW4Dispatch().kernels.vec.round_to_bf16(x, n, out); }

void ToBf16Bits(const float* x, int64_t n, uint16_t* out) {
  // Elementwise, so any split gives the same bits; threaded in blocks where a call is large
  // (inside a parallel region the team is one thread).
  const auto convert = ActiveW4Dispatch().kernels.vec.to_bf16_bits;
  constexpr int64_t kBlock = int64_t{1} << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 20))
  for (int64_t b = 0; b < blocks; ++b) convert(x + b * kBlock, std::min(kBlock, n - b * kBlock), out + b * kBlock);
}

uint64_t StreamReadScalar(const uint64_t* p, int64_t words) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < words; ++i) sum += p[i];
  return sum;
}

}  // namespace nibble
