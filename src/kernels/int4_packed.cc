// Packing to / from the W4P layout and the scalar kernels on it (see int4_packed.h).
#include "kernels/int4_packed.h"

#include <cstring>
#include <numeric>

#include "base/check.h"

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
  std::memset(out, 0, static_cast<size_t>(n * w.row_bytes));
  const int64_t groups = k / g;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t ri = 0; ri < w.recs; ++ri) {
      uint8_t* rec = out + r * w.row_bytes + ri * w.rec_bytes;
      const int64_t k0 = ri * w.rec_weights;
      for (int64_t gi = 0; gi < w.rec_groups && k0 / g + gi < groups; ++gi) {
        const int64_t G = k0 / g + gi;
        std::memcpy(rec + 4 * gi, &scales[r * groups + G], 4);
        if (!symmetric) {
          NIBBLE_CHECK(zero_points[r * groups + G] <= 15);
          rec[4 * w.rec_groups + gi] = zero_points[r * groups + G];
        }
      }
      for (int64_t o = 0; o < w.rec_weights && k0 + o < k; ++o) {
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

uint64_t StreamReadScalar(const uint64_t* p, int64_t words) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < words; ++i) sum += p[i];
  return sum;
}

}  // namespace nibble
