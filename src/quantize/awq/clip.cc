#include "quantize/awq/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/dense_gemm.h"

namespace nibble {

namespace {
constexpr int64_t kClipTokens = 512;  // AutoAWQ n_sample_token
}  // namespace

Status ClipLinear(CalibLayer& L, int i, const float* x, int64_t rows) {
  const int64_t n = L.n[i], k = L.k[i];
  const int64_t g = L.spec[i]->EffectiveGroupSize(k), groups = k / g;
  const int64_t step = std::max<int64_t>(1, rows / kClipTokens);
  std::vector<float> xs;
  for (int64_t r = 0; r < rows; r += step) xs.insert(xs.end(), x + r * k, x + (r + 1) * k);
  const int64_t ts = static_cast<int64_t>(xs.size()) / k;
  const std::vector<float> w = *L.w[i];
  std::vector<float> org_max(static_cast<size_t>(n * groups)), best_max(org_max.size());
  std::vector<double> best_err(org_max.size(), std::numeric_limits<double>::infinity());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < groups; ++gi) {
      float m = 0;
      for (int64_t c = gi * g; c < (gi + 1) * g; ++c) m = std::max(m, std::fabs(w[r * k + c]));
      org_max[r * groups + gi] = m;
    }
  std::vector<float> wc(w.size()), e(static_cast<size_t>(ts * n));
  for (int64_t is = 0; is < 10; ++is) {  // int(max_shrink 0.5 · n_grid 20)
    const float f = 1.0f - static_cast<float>(is) / 20.0f;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float mv = org_max[r * groups + gi] * f;
        for (int64_t c = gi * g; c < (gi + 1) * g; ++c) wc[r * k + c] = std::clamp(w[r * k + c], -mv, mv);
      }
    auto dq = RtnDequant(wc, n, k, *L.spec[i], L.dtype[i]);
    if (!dq.ok()) continue;
    for (size_t j = 0; j < w.size(); ++j) (*dq)[j] -= w[j];
    for (int64_t gi = 0; gi < groups; ++gi) {
      SgemmXWt(ts, n, g, xs.data() + gi * g, k, dq->data() + gi * g, k, 0.0f, e.data(), n);
      for (int64_t r = 0; r < n; ++r) {
        double s = 0;
        for (int64_t t = 0; t < ts; ++t) s += static_cast<double>(e[t * n + r]) * e[t * n + r];
        s /= static_cast<double>(ts);
        if (s < best_err[r * groups + gi]) {
          best_err[r * groups + gi] = s;
          best_max[r * groups + gi] = org_max[r * groups + gi] * f;
        }
      }
    }
  }
  auto& out = *L.w[i];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < groups; ++gi) {
      if (!std::isfinite(best_err[r * groups + gi])) continue;
      const float mv = best_max[r * groups + gi];
      for (int64_t c = gi * g; c < (gi + 1) * g; ++c) out[r * k + c] = std::clamp(out[r * k + c], -mv, mv);
    }
  return Status::Ok();
}

}  // namespace nibble
