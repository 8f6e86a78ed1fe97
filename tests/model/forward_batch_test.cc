// LlamaModel::ForwardBatch (ragged steps: each sequence its own cache, position and token count)
// on the embedded model: a step cancelled between two layers, after earlier layers wrote K/V rows,
// leaves every cache at its length, and the step run again gives the logits of one never
// cancelled; each sequence's logits of all positions match its lone Forward; refused steps
// append nothing. Its results against the double-precision oracle are in
// reference_forward_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"
#include "test_paths.h"

namespace nibble {
namespace {

// Runs `inner`, then cancels the token `token` holds at that time: a step is cancelled at the
// check before the next layer.
class CancellingLinear final : public Linear {
 public:
  CancellingLinear(std::unique_ptr<Linear> inner, std::shared_ptr<CancellationToken> token)
      : inner_(std::move(inner)), token_(std::move(token)) {}
  int64_t in_features() const override { return inner_->in_features(); }
  int64_t out_features() const override { return inner_->out_features(); }
  using Linear::Forward;
  void Forward(const float* x, int64_t m, float* y, Workspace* ws) const override {
    inner_->Forward(x, m, y, ws);
    token_->Cancel();
  }
  std::string Describe() const override { return inner_->Describe(); }
  int64_t WeightBytes() const override { return inner_->WeightBytes(); }

 private:
  std::unique_ptr<Linear> inner_;
  std::shared_ptr<CancellationToken> token_;
};

// The embedded model with layer `layer`'s down_proj cancelling `token` whenever it runs.
std::unique_ptr<LlamaModel> LoadCancellingAt(int64_t layer, const std::shared_ptr<CancellationToken>& token) {
  const std::string dir = nibble_test::EmbeddedModel();
  auto config = LoadModelConfig(dir);
  auto store = TensorStore::OpenDir(dir);
  if (!config.ok() || !store.ok()) return nullptr;
  const std::string target = "model.layers." + std::to_string(layer) + ".mlp.down_proj";
  const LinearLoader loader = [&](const TensorStore& s, const std::string& prefix, int64_t n, int64_t k,
                                  bool bias) -> Result<std::unique_ptr<Linear>> {
    NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<Linear> l, LoadDenseLinear(s, prefix, n, k, bias));
    if (prefix != target) return l;
    return std::unique_ptr<Linear>(new CancellingLinear(std::move(l), token));
  };
  auto m = LlamaModel::FromStore(*config, *store, loader);
  return m.ok() ? std::move(m).value() : nullptr;
}

struct RaggedStep {
  std::vector<int32_t> tokens;
  std::vector<int64_t> query_start_loc;
};

// Three sequences: a decode token, a 5-token chunk, a decode token (7 rows).
RaggedStep MixedStep() { return {{11, 20, 21, 22, 23, 24, 30}, {0, 1, 6, 7}}; }

std::vector<KvCache> Prefilled(const LlamaModel& m) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 5, 6, 7}, {1, 8}, {1, 9, 10, 11, 12, 13, 14}};
  std::vector<KvCache> caches;
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  for (const auto& p : prompts) {
    caches.push_back(m.NewCache(64).value());
    EXPECT_TRUE(m.Forward(p.data(), static_cast<int64_t>(p.size()), caches.back(), logits.data(), false).ok());
  }
  return caches;
}

TEST(ForwardBatch, CancelledBetweenLayersKeepsEveryCacheAtItsLength) {
  auto token = std::make_shared<CancellationToken>();
  auto loaded = LoadCancellingAt(2, token);
  ASSERT_NE(loaded, nullptr);
  const LlamaModel& m = *loaded;
  const int64_t vocab = m.config().vocab_size;
  std::vector<KvCache> caches = Prefilled(m), twins = Prefilled(m);
  *token = CancellationToken();  // the prefills cancelled the old one (unchecked there)
  KvCache* cp[3] = {&caches[0], &caches[1], &caches[2]};
  KvCache* tp[3] = {&twins[0], &twins[1], &twins[2]};
  const RaggedStep s = MixedStep();
  std::vector<float> got(static_cast<size_t>(3 * vocab)), want(got.size());
  const Status st = m.ForwardBatch(s.tokens.data(), s.query_start_loc.data(), 3, cp, got.data(), false, token.get());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kCancelled);
  EXPECT_NE(st.error().message.find("before layer 3"), std::string::npos) << st.error().message;
  EXPECT_EQ(caches[0].length, 4);
  EXPECT_EQ(caches[1].length, 2);
  EXPECT_EQ(caches[2].length, 7);
  ASSERT_TRUE(m.ForwardBatch(s.tokens.data(), s.query_start_loc.data(), 3, cp, got.data(), false).ok());
  ASSERT_TRUE(m.ForwardBatch(s.tokens.data(), s.query_start_loc.data(), 3, tp, want.data(), false).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(caches[1].length, 7);
}

// all_logits: rows [query_start_loc[b], query_start_loc[b + 1]) are sequence b's positions, as
// its lone Forward gives them (within fp32 reordering: 1e-4 of the scale); the last-position mode
// gives the same rows.
TEST(ForwardBatch, AllLogitsAreEachSequencesPositions) {
  auto loaded = LlamaModel::Load(nibble_test::EmbeddedModel());
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const LlamaModel& m = **loaded;
  const int64_t vocab = m.config().vocab_size;
  std::vector<KvCache> caches = Prefilled(m), last = Prefilled(m), solo = Prefilled(m);
  KvCache* cp[3] = {&caches[0], &caches[1], &caches[2]};
  KvCache* lp[3] = {&last[0], &last[1], &last[2]};
  const RaggedStep s = MixedStep();
  std::vector<float> all(static_cast<size_t>(7 * vocab)), tail(static_cast<size_t>(3 * vocab));
  ASSERT_TRUE(m.ForwardBatch(s.tokens.data(), s.query_start_loc.data(), 3, cp, all.data(), true).ok());
  ASSERT_TRUE(m.ForwardBatch(s.tokens.data(), s.query_start_loc.data(), 3, lp, tail.data(), false).ok());
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t r0 = s.query_start_loc[b], t = s.query_start_loc[b + 1] - r0;
    std::vector<float> want(static_cast<size_t>(t * vocab));
    ASSERT_TRUE(m.Forward(s.tokens.data() + r0, t, solo[b], want.data(), true).ok());
    EXPECT_EQ(caches[b].length, solo[b].length);
    float scale = 0, diff = 0, diff_tail = 0;
    for (int64_t i = 0; i < t * vocab; ++i) {
      scale = std::max(scale, std::abs(want[i]));
      diff = std::max(diff, std::abs(all[r0 * vocab + i] - want[i]));
    }
    for (int64_t j = 0; j < vocab; ++j)
      diff_tail = std::max(diff_tail, std::abs(tail[b * vocab + j] - want[(t - 1) * vocab + j]));
    EXPECT_LE(diff, 1e-4f * scale) << "sequence " << b;
    EXPECT_LE(diff_tail, 1e-4f * scale) << "sequence " << b;
  }
}

TEST(ForwardBatch, RefusedStepsNameTheSequenceAndAppendNothing) {
  auto loaded = LlamaModel::Load(nibble_test::EmbeddedModel());
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const LlamaModel& m = **loaded;
  std::vector<KvCache> caches = Prefilled(m);
  std::vector<float> logits(static_cast<size_t>(3 * m.config().vocab_size));
  const auto expect_refused = [&](const std::vector<int32_t>& tokens, const std::vector<int64_t>& qsl,
                                  std::vector<KvCache*> cp, const std::string& what) {
    const Status st = m.ForwardBatch(tokens.data(), qsl.data(), static_cast<int64_t>(cp.size()), cp.data(), logits.data(), false);
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    EXPECT_EQ(caches[0].length, 4);
    EXPECT_EQ(caches[1].length, 2);
    EXPECT_EQ(caches[2].length, 7);
  };
  expect_refused({5, 6}, {0, 2, 2}, {&caches[0], &caches[1]}, "sequence 1: no tokens");
  expect_refused({5, 6}, {0, 1, 2}, {&caches[0], &caches[0]}, "sequences 0 and 1 share one KV cache");
  expect_refused({5, 6, -3}, {0, 1, 2, 3}, {&caches[0], &caches[1], &caches[2]}, "sequence 2: token id -3");
  const std::vector<int32_t> long_chunk(60, 5);
  expect_refused(long_chunk, {0, 1, 60}, {&caches[0], &caches[2]}, "sequence 1: sequence of 66 tokens exceeds");
}

}  // namespace
}  // namespace nibble
