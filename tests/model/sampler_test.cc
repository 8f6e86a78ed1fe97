// The sampler against distributions computed here by hand: llama.cpp's repeat penalty (divide a
// positive logit, multiply a negative one, once per distinct recent token), then temperature, and
// top-k, top-p and min-p on the tempered probabilities; greedy after the penalty.
#include "model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace nibble {
namespace {

SamplingOptions Plain() {  // every cut off, T = 1
  SamplingOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  return o;
}

std::vector<float> Logs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

void ExpectDistribution(const std::vector<TokenProb>& got, const std::vector<TokenProb>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].id, want[i].id) << "rank " << i;
    EXPECT_NEAR(got[i].p, want[i].p, 1e-6) << "rank " << i;
  }
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingOptions o = Plain();
  o.repeat_penalty = 2.0f;
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.5f};
  const std::vector<int32_t> recent = {0, 2, 2};  // id 2 twice: penalised once
  // Penalised logits {1, 1, -2, 0.5}: softmax e^1, e^1, e^-2, e^0.5 over 7.2206.
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 4, recent),
                     {{0, 0.37646099}, {1, 0.37646099}, {3, 0.22833513}, {2, 0.01874289}});
}

TEST(Sampler, RepeatPenaltyLooksBackRepeatLastNTokens) {
  SamplingOptions o = Plain();
  o.repeat_penalty = 2.0f;
  o.repeat_last_n = 2;
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f};
  const std::vector<int32_t> recent = {0, 1, 1};  // the window {1, 1}: id 0 is not penalised
  // {2, 0.5, -1}: e^2, e^0.5, e^-1 over 9.4057.
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 3, recent), {{0, 0.78559703}, {1, 0.17529039}, {2, 0.03911257}});
  o.repeat_last_n = 0;  // off
  const std::vector<TokenProb> off = Sampler(o).Distribution(logits.data(), 3, recent);
  EXPECT_NEAR(off[1].p, std::exp(1.0) / (std::exp(2.0) + std::exp(1.0) + std::exp(-1.0)), 1e-6);
  o.repeat_last_n = -1;  // the whole context: id 0 too
  const std::vector<TokenProb> all = Sampler(o).Distribution(logits.data(), 3, recent);  // {1, 0.5, -1}
  EXPECT_NEAR(all[0].p, std::exp(1.0) / (std::exp(1.0) + std::exp(0.5) + std::exp(-1.0)), 1e-6);
}

TEST(Sampler, GreedyTakesTheArgmaxAfterThePenalty) {
  SamplingOptions o = Plain();
  o.temperature = 0;
  const std::vector<float> logits = {2.0f, 1.5f, -3.0f};
  const std::vector<int32_t> recent = {0};
  EXPECT_EQ(Sampler(o).Sample(logits.data(), 3, recent), 0);
  o.repeat_penalty = 2.0f;  // {1, 1.5, -3}
  EXPECT_EQ(Sampler(o).Sample(logits.data(), 3, recent), 1);
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 3, recent), {{1, 1.0}});
}

TEST(Sampler, MinPKeepsTokensAboveAFractionOfTheMostLikely) {
  SamplingOptions o = Plain();
  o.min_p = 0.2f;  // keep p >= 0.1
  const std::vector<float> logits = Logs({0.5, 0.3, 0.15, 0.05});
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 4, {}), {{0, 0.5 / 0.95}, {1, 0.3 / 0.95}, {2, 0.15 / 0.95}});
  // At T = 2 the tempered weights are sqrt(p); min_p 0.5 keeps sqrt(p) >= 0.5 · sqrt(0.5), i.e.
  // p >= 0.125: three tokens (on the untempered p >= 0.25 it would be two).
  o.temperature = 2.0f;
  o.min_p = 0.5f;
  const double w0 = std::sqrt(0.5), w1 = std::sqrt(0.3), w2 = std::sqrt(0.15), sum = w0 + w1 + w2;
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 4, {}), {{0, w0 / sum}, {1, w1 / sum}, {2, w2 / sum}});
  o.min_p = 0;
  EXPECT_EQ(Sampler(o).Distribution(logits.data(), 4, {}).size(), 4u);
}

TEST(Sampler, TopPIsCutOnTheTemperedProbabilities) {
  SamplingOptions o = Plain();
  o.top_p = 0.6f;
  o.temperature = 0.5f;
  const std::vector<float> logits = Logs({0.5, 0.3, 0.15, 0.05});
  // Tempered, p^2 renormalised: 0.25 / 0.365 = 0.685 >= 0.6 alone (untempered, 0.5 would not be).
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 4, {}), {{0, 1.0}});
  o.top_p = 0.9f;  // 0.685 + 0.09 / 0.365 = 0.932: two, renormalised
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 4, {}), {{0, 0.25 / 0.34}, {1, 0.09 / 0.34}});
}

TEST(Sampler, ChainOrderTopKTopPMinP) {
  SamplingOptions o = Plain();
  o.top_k = 3;      // drops 0.05
  o.top_p = 0.97f;  // over the renormalised three (0.526, 0.316, 0.158): all three needed
  o.min_p = 0.5f;   // then p >= 0.25: the first two
  const std::vector<float> logits = Logs({0.5, 0.3, 0.15, 0.05});
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 4, {}), {{0, 0.625}, {1, 0.375}});
}

TEST(Sampler, SampleDrawsOnlyFromTheDistribution) {
  SamplingOptions o = Plain();
  o.repeat_penalty = 100.0f;
  o.seed = 5;
  const std::vector<float> logits = {3.0f, 3.0f, 2.9f};
  const std::vector<int32_t> recent = {0, 1};  // {0.03, 0.03, 2.9}: id 2 has p = 0.895
  Sampler s(o);
  int twos = 0;
  for (int i = 0; i < 2000; ++i) twos += s.Sample(logits.data(), 3, recent) == 2;
  EXPECT_NEAR(twos / 2000.0, std::exp(2.9) / (std::exp(2.9) + 2 * std::exp(0.03)), 0.03);
}

}  // namespace
}  // namespace nibble
