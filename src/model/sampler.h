// Next-token sampling: greedy (temperature 0) or temperature + top-k + top-p (nucleus), in the
// order llama.cpp and HF apply them (top-k, then top-p over the renormalised survivors).
#pragma once

#include <cstdint>
#include <random>

namespace nibble {

struct SamplerOptions {
  float temperature = 0.8f;  // 0 = greedy
  int64_t top_k = 40;        // 0 = all
  float top_p = 0.95f;       // 1 = all
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}
  /// Picks a token id from logits[vocab]. Greedy ties go to the lowest id.
  int32_t Sample(const float* logits, int64_t vocab);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace nibble
