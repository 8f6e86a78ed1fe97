#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace nibble {

namespace {

// llama.cpp's repetition penalty: each distinct token among the last repeat_last_n of `recent`
// (all of it for -1) has its logit divided by the penalty when positive and multiplied when not,
// so a penalty above 1 always makes it less likely. Then OpenAI's: each distinct token of
// `output`, seen count times, loses presence_penalty + frequency_penalty · count (vLLM and
// llama.cpp apply them in this order too). Empty when no penalty applies.
std::vector<float> Penalised(const float* logits, int64_t vocab, const SamplingOptions& o, std::span<const int32_t> recent,
                             std::span<const int32_t> output) {
  const bool repeat = o.repeat_penalty != 1.0f && o.repeat_last_n != 0 && !recent.empty();
  const bool openai = (o.presence_penalty != 0.0f || o.frequency_penalty != 0.0f) && !output.empty();
  if (!repeat && !openai) return {};
  std::vector<float> l(logits, logits + vocab);
  if (repeat) {
    const size_t n = o.repeat_last_n < 0 ? recent.size() : std::min(recent.size(), static_cast<size_t>(o.repeat_last_n));
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    for (const int32_t id : recent.subspan(recent.size() - n)) {
      if (id < 0 || id >= vocab || seen[id]) continue;
      seen[id] = true;
      l[id] = l[id] <= 0 ? l[id] * o.repeat_penalty : l[id] / o.repeat_penalty;
    }
  }
  if (openai) {  // counts from runs of equal ids in a sorted copy: O(n log n) in the output, not the vocabulary
    std::vector<int32_t> sorted(output.begin(), output.end());
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i;
      while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
      const int32_t id = sorted[i];
      if (id >= 0 && id < vocab) l[id] -= o.presence_penalty + o.frequency_penalty * static_cast<float>(j - i);
      i = j;
    }
  }
  return l;
}

int32_t ArgMax(const float* l, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (l[i] > l[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

std::vector<TokenProb> Sampler::Weights(const float* logits, int64_t vocab, std::span<const int32_t> recent,
                                        std::span<const int32_t> output) const {
  const std::vector<float> penalised = Penalised(logits, vocab, options_, recent, output);
  const float* l = penalised.empty() ? logits : penalised.data();
  if (options_.temperature <= 0.0f) return {{ArgMax(l, vocab), 1.0}};
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = options_.top_k > 0 ? std::min(options_.top_k, vocab) : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  idx.resize(static_cast<size_t>(k));
  // Tempered weights exp((l - l_max) / T): the top-p and min-p cuts see the tempered distribution.
  const double mx = l[idx[0]];
  std::vector<TokenProb> out(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (out[i] = {idx[i], std::exp((l[idx[i]] - mx) / options_.temperature)}).p;
  size_t keep = out.size();
  if (options_.top_p < 1.0f) {  // the smallest prefix whose probability mass reaches top_p
    double cum = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      cum += out[i].p / sum;
      if (cum >= options_.top_p) { keep = i + 1; break; }
    }
  }
  if (options_.min_p > 0.0f) {  // p >= min_p · p_max; the most likely token has weight 1
    size_t m = 1;
    while (m < keep && out[m].p >= static_cast<double>(options_.min_p)) ++m;
    keep = m;
  }
  out.resize(keep);
  return out;
}

std::vector<TokenProb> Sampler::Distribution(const float* logits, int64_t vocab, std::span<const int32_t> recent,
                                             std::span<const int32_t> output) const {
  std::vector<TokenProb> d = Weights(logits, vocab, recent, output);
  double total = 0;
  for (const TokenProb& t : d) total += t.p;
  for (TokenProb& t : d) t.p /= total;
  return d;
}

int32_t Sampler::Sample(const float* logits, int64_t vocab, std::span<const int32_t> recent,
                        std::span<const int32_t> output) {
  const std::vector<TokenProb> w = Weights(logits, vocab, recent, output);
  if (options_.temperature <= 0.0f) return w[0].id;
  double total = 0;
  for (const TokenProb& t : w) total += t.p;
  std::uniform_real_distribution<double> dist(0.0, total);
  double r = dist(rng_);
  for (const TokenProb& t : w) {
    r -= t.p;
    if (r <= 0) return t.id;
  }
  return w.back().id;
}

}  // namespace nibble
