// Next-token sampling: llama.cpp's repeat penalty on the logits of the recent tokens and OpenAI's
// presence / frequency penalties on those of the output so far, then temperature, top-k, top-p (over the renormalised survivors) and min-p, and a draw from what
// survives. The cuts see the tempered distribution (the order nibble has always used, as HF
// does; llama.cpp tempers last). Temperature 0 is greedy: the argmax of the penalised logits.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include <nibble/session.h>

namespace nibble {

struct TokenProb {
  int32_t id = 0;
  double p = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {}
  /// Picks a token id from logits[vocab]; `recent` is the context so far (oldest first), of which
  /// the last repeat_last_n (all for -1) get the repeat penalty; `output` is the generated tokens
  /// so far (any order), which the presence and frequency penalties count. Greedy ties go to the
  /// lowest id.
  int32_t Sample(const float* logits, int64_t vocab, std::span<const int32_t> recent,
                 std::span<const int32_t> output = {});
  /// The distribution Sample draws from: the surviving tokens, most likely first (ties: lower id),
  /// probabilities summing to 1; one token with p = 1 when greedy.
  std::vector<TokenProb> Distribution(const float* logits, int64_t vocab, std::span<const int32_t> recent,
                                      std::span<const int32_t> output = {}) const;

 private:
  // Survivors with unnormalised weights exp((l - l_max) / T), most likely first.
  std::vector<TokenProb> Weights(const float* logits, int64_t vocab, std::span<const int32_t> recent,
                                 std::span<const int32_t> output) const;

  SamplingOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace nibble
