// KL divergence and top-1 agreement (eval/kl_divergence.h) on known distributions, and the
// comparison protocol on a real model against itself.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "eval/kl_divergence.h"
#include "eval/perplexity.h"
#include "model/llama.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace {

TEST(KlDivergence, KnownDistributions) {
  // p = softmax([0, ln 2]) = [1/3, 2/3], q = uniform [1/2, 1/2].
  const float p[2] = {0.0f, static_cast<float>(std::log(2.0))};
  const float q[2] = {5.0f, 5.0f};  // any constant row is uniform
  const double expect = (1.0 / 3) * std::log((1.0 / 3) / 0.5) + (2.0 / 3) * std::log((2.0 / 3) / 0.5);
  EXPECT_NEAR(nibble::KlDivergenceFromLogits(p, q, 2), expect, 1e-6);
  // KL(q || p) differs (asymmetric).
  const double rev = 0.5 * std::log(0.5 / (1.0 / 3)) + 0.5 * std::log(0.5 / (2.0 / 3));
  EXPECT_NEAR(nibble::KlDivergenceFromLogits(q, p, 2), rev, 1e-6);
  // Identical and shifted logits: 0.
  const float a[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  const float b[4] = {11.0f, 8.0f, 10.5f, 13.0f};
  EXPECT_NEAR(nibble::KlDivergenceFromLogits(a, a, 4), 0.0, 1e-7);
  EXPECT_NEAR(nibble::KlDivergenceFromLogits(a, b, 4), 0.0, 1e-6);
  // A near-one-hot p against a uniform q: KL -> log(vocab).
  const float hot[4] = {100.0f, 0.0f, 0.0f, 0.0f};
  const float uni[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_NEAR(nibble::KlDivergenceFromLogits(hot, uni, 4), std::log(4.0), 1e-5);
  EXPECT_GE(nibble::KlDivergenceFromLogits(uni, hot, 4), 0.0);
}

TEST(KlDivergence, ArgMaxFirstOnTies) {
  const float r[5] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  EXPECT_EQ(nibble::ArgMax(r, 5), 1);
  EXPECT_EQ(nibble::ArgMax(r, 1), 0);
}

TEST(ComparePerplexity, ModelAgainstItselfHasZeroKldAndFullAgreement) {
  NIBBLE_NEEDS_SHARED("models/stories260K", "data/wikitext-2-raw-test.txt");
  const std::string dir = nibble_test::SharedModel("stories260K");
  auto m = nibble::LlamaModel::Load(dir);
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto tok = nibble::Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok());
  std::ifstream in(nibble_test::SharedData("wikitext-2-raw-test.txt"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto ids = (*tok)->Encode(ss.str().substr(0, 20000));
  ASSERT_TRUE(ids.ok());
  nibble::PerplexityProtocol p;
  p.seq_len = 256;
  p.max_windows = 3;
  auto c = nibble::ComparePerplexityTokens(**m, {m->get(), m->get()}, *ids, p);
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto ref = nibble::EvaluatePerplexityTokens(**m, *ids, p);
  ASSERT_TRUE(ref.ok());
  EXPECT_DOUBLE_EQ(c->base.ppl, ref->ppl);
  ASSERT_EQ(c->models.size(), 2u);
  for (const auto& r : c->models) {
    EXPECT_DOUBLE_EQ(r.perplexity.ppl, ref->ppl);
    EXPECT_NEAR(r.mean_kld, 0.0, 1e-9);
    EXPECT_DOUBLE_EQ(r.top1_agreement, 1.0);
    EXPECT_EQ(r.positions, 3 * 255);
  }
  // Errors are named: no models, too short a text.
  EXPECT_FALSE(nibble::ComparePerplexityTokens(**m, {}, *ids, p).ok());
  std::vector<int32_t> few(ids->begin(), ids->begin() + 10);
  auto e = nibble::ComparePerplexityTokens(**m, {m->get()}, few, p);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("fewer than one window"), std::string::npos);
}

}  // namespace
