#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace nibble {

int32_t Sampler::Sample(const float* logits, int64_t vocab) {
  if (options_.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = options_.top_k > 0 ? std::min(options_.top_k, vocab) : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  idx.resize(static_cast<size_t>(k));
  std::vector<double> p(idx.size());
  const double mx = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    p[i] = std::exp((logits[idx[i]] - mx) / options_.temperature);
    sum += p[i];
  }
  size_t keep = idx.size();
  if (options_.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      cum += p[i] / sum;
      if (cum >= options_.top_p) { keep = i + 1; break; }
    }
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i];
  std::uniform_real_distribution<double> dist(0.0, total);
  double r = dist(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace nibble
