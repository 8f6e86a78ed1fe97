#include "model/ops.h"

#include <cmath>

#include "base/parallel.h"

namespace nibble {

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, double eps, float* y) {
  ParallelFor(rows, rows > 1, [&](int64_t r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv);
  });
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    // HF: 1.0 / (base ** (arange(0, dim, 2) / dim)), computed in float32.
    float expo = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    float p = std::pow(static_cast<float>(c.rope_theta), expo);
    inv[i] = 1.0f / p;
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    for (auto& f : inv) f = static_cast<float>(f / rs.factor);
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rs.factor);
      } else {
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / rs.factor + smooth * f);
      }
    }
  }
  return inv;
}

void ApplyRope(float* x, int64_t heads, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void Add(const float* a, const float* b, int64_t n, float* out) {
  ParallelFor(n, n >= kTeamMinWork, [&](int64_t i) { out[i] = a[i] + b[i]; });
}

void ExpInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = ExpF(x[i]);
}

void SoftmaxRow(float* row, int64_t n) {
  float mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = row[i] > mx ? row[i] : mx;
  ExpShiftedInPlace(row, n, -mx);  // row[i] + (−mx) is row[i] − mx exactly
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += row[i];
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) row[i] *= inv;
}

void SiluMul(const float* g, const float* u, int64_t n, float* a) {
  // Through ExpShiftedInPlace in chunks (a may alias g: each element is read before it is written).
  constexpr int64_t kChunk = 256;
  float e[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = n - i0 < kChunk ? n - i0 : kChunk;
    for (int64_t j = 0; j < len; ++j) e[j] = -g[i0 + j];
    ExpShiftedInPlace(e, len, 0.0f);
    for (int64_t j = 0; j < len; ++j) a[i0 + j] = g[i0 + j] / (1.0f + e[j]) * u[i0 + j];
  }
}

}  // namespace nibble
