// The sampler against distributions computed here by hand: llama.cpp's repeat penalty (divide a
// positive logit, multiply a negative one, once per distinct recent token), OpenAI's presence and
// frequency penalties over the output, then temperature, and top-k, top-p and min-p on the
// tempered probabilities; greedy after the penalties.
#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// OpenAI's formula, written out per token: logit[t] - presence · (count[t] > 0) - frequency ·
// count[t], count[t] = occurrences of t in the output (the context before it does not count).
std::vector<TokenProb> OpenAiPenalised(const std::vector<float>& logits, const std::vector<int32_t>& output,
                                       double presence, double frequency) {
  std::vector<double> l(logits.begin(), logits.end());
  for (size_t t = 0; t < l.size(); ++t) {
    int count = 0;
    for (const int32_t id : output) count += id == static_cast<int32_t>(t) ? 1 : 0;
    l[t] -= presence * (count > 0 ? 1 : 0) + frequency * count;
  }
  double sum = 0;
  for (const double x : l) sum += std::exp(x);
  std::vector<TokenProb> d;
  for (size_t t = 0; t < l.size(); ++t) d.push_back({static_cast<int32_t>(t), std::exp(l[t]) / sum});
  std::sort(d.begin(), d.end(), [](const TokenProb& a, const TokenProb& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); });
  return d;
}

TEST(Sampler, PresenceAndFrequencyPenaltiesFollowOpenAisFormula) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.25f};
  const std::vector<int32_t> context = {5, 5, 5, 0, 1, 4, 1, 1, 3};  // a prompt of 5 5 5 0, then the output
  const std::vector<int32_t> output(context.begin() + 4, context.end());  // 1 x3, 4 x1, 3 x1
  for (const auto& [presence, frequency] : {std::pair{0.7, 0.4}, {0.0, 1.3}, {-0.5, 0.0}, {2.0, -2.0}, {0.0, 0.0}}) {
    SamplingOptions o = Plain();
    o.presence_penalty = static_cast<float>(presence);
    o.frequency_penalty = static_cast<float>(frequency);
    SCOPED_TRACE(testing::Message() << "presence " << presence << ", frequency " << frequency);
    ExpectDistribution(Sampler(o).Distribution(logits.data(), 6, context, output),
                       OpenAiPenalised(logits, output, presence, frequency));
  }
}

TEST(Sampler, RepeatPenaltyThenOpenAiPenalties) {
  SamplingOptions o = Plain();
  o.repeat_penalty = 2.0f;
  o.repeat_last_n = -1;
  o.presence_penalty = 0.5f;
  o.frequency_penalty = 0.25f;
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.5f};
  const std::vector<int32_t> context = {2, 0, 0};
  const std::vector<int32_t> output = {0, 0};
  // Repeat penalty on ids 0 and 2: {1, 1, -2, 0.5}; then id 0 (count 2) loses 0.5 + 0.5: {0, 1, -2, 0.5}.
  ExpectDistribution(Sampler(o).Distribution(logits.data(), 4, context, output),
                     OpenAiPenalised({1.0f, 1.0f, -2.0f, 0.5f}, output, 0.5, 0.25));
}

TEST(Sampler, GreedyTakesTheArgmaxAfterOpenAiPenalties) {
  SamplingOptions o = Plain();
  o.temperature = 0;
  const std::vector<float> logits = {2.0f, 1.5f, -3.0f};
  const std::vector<int32_t> output = {0, 0};
  EXPECT_EQ(Sampler(o).Sample(logits.data(), 3, output, output), 0);
  o.frequency_penalty = 0.3f;  // {1.4, 1.5, -3}
  EXPECT_EQ(Sampler(o).Sample(logits.data(), 3, output, output), 1);
  o.frequency_penalty = 0.2f;  // {1.6, 1.5, -3}
  EXPECT_EQ(Sampler(o).Sample(logits.data(), 3, output, output), 0);
  o.presence_penalty = 0.2f;   // {1.4, 1.5, -3}
  EXPECT_EQ(Sampler(o).Sample(logits.data(), 3, output, output), 1);
  EXPECT_EQ(Sampler(o).Sample(logits.data(), 3, output, {}), 0);  // the context alone is not penalised
}

}  // namespace
}  // namespace nibble
