// StepBatch over BatchItems (continuous batching) on the embedded model: decode tokens of some
// sessions and prefill chunks of others in the same steps give each session the greedy tokens it
// gets alone, its logits within the documented tolerance, and bit for bit where the step's row
// count is the same; bad batches and a cancelled step change no session.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "test_paths.h"
#include "test_util.h"

namespace {

std::unique_ptr<nibble::Model> LoadEmbedded(nibble::KvDtype kv = nibble::KvDtype::kBf16, const std::string& dir = "",
                                            nibble::ActivationType act = nibble::ActivationType::kAuto) {
  nibble::LoadOptions o;
  o.kv_dtype = kv;
  o.activations = act;
  auto m = nibble::Model::Load(dir.empty() ? nibble_test::EmbeddedModel() : dir, o);
  if (!m.ok()) {
    ADD_FAILURE() << m.error().message;
    return nullptr;
  }
  return std::move(m).value();
}

const nibble::Model& BatchTestModel() {
  static std::unique_ptr<nibble::Model> model = LoadEmbedded();
  return *model;
}

std::unique_ptr<nibble::Session> NewBatchSession(const nibble::Model& m, int64_t context = 0) {
  nibble::SessionOptions o;
  o.context = context;
  auto s = nibble::Session::Create(m, o);
  if (!s.ok()) {
    ADD_FAILURE() << s.error().message;
    return nullptr;
  }
  return std::move(s).value();
}

int32_t GreedyNext(nibble::Session& s) {
  nibble::SamplingOptions o;
  o.temperature = 0;
  auto t = s.Sample(o);
  EXPECT_TRUE(t.ok()) << t.error().message;
  return t.ok() ? *t : -1;
}

// The greedy token of `batch` against that of `solo` (the same sequence run alone): equal, or a
// near tie the tolerance allows to flip: the lone run scores the batch's token within
// `tolerance` · max |logit| of its own (two logits 2e-4 apart, 5e-5 of their scale, flipped on a
// CPU with AMX tiles, whose batched rows sum in another order). Returns the batch's token.
int32_t ExpectSameGreedyOrNearTie(nibble::Session& batch, nibble::Session& solo, double tolerance, int* ties,
                                  const std::string& where) {
  const int32_t b = GreedyNext(batch), s = GreedyNext(solo);
  if (b == s || b < 0 || s < 0) {
    EXPECT_EQ(b, s) << where;
    return b;
  }
  const std::vector<float> l = solo.logits();
  double scale = 0;
  for (float v : l) scale = std::max(scale, static_cast<double>(std::abs(v)));
  EXPECT_LE(static_cast<double>(l[static_cast<size_t>(s)]) - l[static_cast<size_t>(b)], tolerance * scale)
      << where << ": batch token " << b << ", alone " << s << " (not a near tie)";
  ++*ties;
  return b;
}

// max |a - b| over max |b|: the logits' relative difference.
double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double scale = 0, diff = 0;
  for (size_t j = 0; j < a.size() && j < b.size(); ++j) {
    scale = std::max(scale, static_cast<double>(std::abs(b[j])));
    diff = std::max(diff, static_cast<double>(std::abs(a[j] - b[j])));
  }
  return diff / std::max(scale, 1e-30);
}

std::vector<int32_t> BatchTestIds(const nibble::Model& m, const std::string& text) {
  auto ids = m.Tokenize(text);
  EXPECT_TRUE(ids.ok());
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

const std::vector<std::string> kPrompts = {
    "In the beginning God created the heaven and the earth.",
    "And",
    "The king said unto his servants, Go ye and search the land, and bring me word again,",
    "And it came to pass",
    "Blessed are they that mourn: for they shall be comforted. Blessed are the meek: for they shall "
    "inherit the earth. Blessed are they which do hunger and thirst after righteousness",
    "Then Moses",
    "And the LORD spake unto Moses, saying, Speak unto the children of Israel,",
    "For God so loved the world",
};

// Eight sequences arriving one step apart (so at different positions), each prefilled in chunks
// of its own size (1 to 64 tokens) and then decoded greedily, all in the same steps: steps mix
// chunks and decode tokens, from 1 to over 100 rows (across the kernels' row thresholds). Each
// sequence run alone with the same chunks samples the same tokens (or, at a near tie, the other
// of the two: ExpectSameGreedyOrNearTie), with logits within
// `tolerance` of their scale: fp32 accumulation in another order (measured ~1e-6 with an fp32
// KV cache), which with a bf16 cache can also flip a K/V value's bf16 rounding, one bf16 ulp
// (2^-8 relative) of that value (measured 6e-5 here, up to 9e-4 on other schedules).
void CheckMixedSteps(const nibble::Model& m, double tolerance) {
  const size_t n = kPrompts.size();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<nibble::Session>> batch, solo;
  for (size_t i = 0; i < n; ++i) {
    std::string text = kPrompts[i];
    for (size_t r = 0; r < i; ++r) text += " " + kPrompts[(i + r + 1) % n];  // ~10 to ~150 tokens
    prompts.push_back(BatchTestIds(m, text));
    batch.push_back(NewBatchSession(m));
    solo.push_back(NewBatchSession(m));
  }
  std::vector<size_t> fed(n, 0);  // prompt tokens fed so far
  double worst = 0;
  int mixed_steps = 0, ties = 0;
  int64_t most_rows = 0;
  for (int step = 0; step < 24; ++step) {
    std::vector<nibble::BatchItem> items;
    int chunks = 0, decodes = 0;
    int64_t rows = 0;
    for (size_t i = 0; i < n && i <= static_cast<size_t>(step); ++i) {
      nibble::BatchItem item{batch[i].get(), {}};
      if (fed[i] < prompts[i].size()) {
        const size_t chunk = std::min<size_t>(1 + 9 * i, prompts[i].size() - fed[i]);
        item.tokens.assign(prompts[i].begin() + fed[i], prompts[i].begin() + fed[i] + chunk);
        fed[i] += chunk;
        ++chunks;
      } else {
        const std::string where = "sequence " + std::to_string(i) + " step " + std::to_string(step);
        item.tokens = {ExpectSameGreedyOrNearTie(*batch[i], *solo[i], tolerance, &ties, where)};
        ASSERT_FALSE(::testing::Test::HasFailure()) << where;
        ++decodes;
      }
      ASSERT_TRUE(solo[i]->Prefill(item.tokens).ok());
      rows += static_cast<int64_t>(item.tokens.size());
      items.push_back(std::move(item));
    }
    mixed_steps += chunks > 0 && decodes > 0;
    most_rows = std::max(most_rows, rows);
    const nibble::Status st = nibble::StepBatch(items);
    ASSERT_TRUE(st.ok()) << st.error().message;
    for (size_t i = 0; i < items.size(); ++i) {
      EXPECT_EQ(batch[i]->position(), solo[i]->position()) << "sequence " << i;
      const double d = RelDiff(batch[i]->logits(), solo[i]->logits());
      EXPECT_LE(d, tolerance) << "sequence " << i << " step " << step;
      worst = std::max(worst, d);
    }
  }
  EXPECT_GE(mixed_steps, 6) << "the schedule should mix prefill chunks and decode tokens";
  EXPECT_GE(most_rows, 100) << "the schedule should cross the kernels' row thresholds";
  for (size_t i = 0; i < n; ++i) ExpectSameGreedyOrNearTie(*batch[i], *solo[i], tolerance, &ties, "sequence " + std::to_string(i));
  EXPECT_LE(ties, 2) << "greedy tokens flipped at near ties";
  ::testing::Test::RecordProperty("worst_relative_logit_difference", std::to_string(worst));
  ::testing::Test::RecordProperty("most_rows", std::to_string(most_rows));
}

TEST(StepBatch, MixedPrefillChunksAndDecodeMatchEachSequenceAlone) { CheckMixedSteps(BatchTestModel(), 3e-3); }

TEST(StepBatch, MixedStepsWithAnFp32KvCacheDifferOnlyByFp32Rounding) {
  auto m = LoadEmbedded(nibble::KvDtype::kFp32);
  ASSERT_NE(m, nullptr);
  CheckMixedSteps(*m, 1e-5);
}

// The embedded model quantized (RTN uint4 g128): steps of 64 rows and more run the int4
// projections through dequantize + GEMM, fewer through the fused kernels. W4A32 with an fp32 cache
// differs from the lone runs by fp32 rounding only; the default bf16 activations and cache also
// round activations and K/V to bf16, where a rounding difference can flip one (measured 3e-3).
TEST(StepBatch, MixedStepsOnInt4WeightsMatchEachSequenceAlone) {
  nibble_test::TempDir tmp;
  const std::string q = nibble_test::QuantizedEmbeddedModel(tmp);
  auto w4a32 = LoadEmbedded(nibble::KvDtype::kFp32, q, nibble::ActivationType::kFp32);
  ASSERT_NE(w4a32, nullptr);
  ASSERT_GT(w4a32->info().int4_linears, 0);
  CheckMixedSteps(*w4a32, 1e-5);
  auto w4a16 = LoadEmbedded(nibble::KvDtype::kBf16, q);
  ASSERT_NE(w4a16, nullptr);
  CheckMixedSteps(*w4a16, 1e-2);
}

// What else is in the step changes nothing but the row count's summation order: at the same row
// count (and rows), a sequence's logits are bit-equal whichever other sequences share the step;
// a step of one item is Prefill / Step bit for bit.
TEST(StepBatch, SameRowCountGivesBitEqualLogitsWhateverElseIsInTheStep) {
  const nibble::Model& m = BatchTestModel();
  const std::vector<int32_t> prompt = BatchTestIds(m, kPrompts[0]), other = BatchTestIds(m, kPrompts[2]);
  auto a1 = NewBatchSession(m), a2 = NewBatchSession(m), a3 = NewBatchSession(m), b = NewBatchSession(m), c = NewBatchSession(m),
       d = NewBatchSession(m);
  for (auto* s : {a1.get(), a2.get(), a3.get()}) ASSERT_TRUE(s->Prefill(prompt).ok());
  ASSERT_TRUE(b->Prefill(other).ok());
  ASSERT_TRUE(c->Prefill({1, 40, 50}).ok());
  ASSERT_TRUE(d->Prefill({1}).ok());
  const std::vector<int32_t> chunk = {other[3], other[4], other[5], other[6]};
  // 8 rows each: A's 4 first, then 1 + 3 rows of B and C, or 4 rows of D.
  ASSERT_TRUE(nibble::StepBatch({{a1.get(), chunk}, {b.get(), {other[7]}}, {c.get(), {60, 70, 80}}}).ok());
  ASSERT_TRUE(nibble::StepBatch({{a2.get(), chunk}, {d.get(), {90, 91, 92, 93}}}).ok());
  ASSERT_TRUE(nibble::StepBatch({{a3.get(), chunk}}).ok());
  EXPECT_EQ(a1->logits(), a2->logits());
  auto alone = NewBatchSession(m);
  ASSERT_TRUE(alone->Prefill(prompt).ok());
  ASSERT_TRUE(alone->Prefill(chunk).ok());
  EXPECT_EQ(a3->logits(), alone->logits());
  // Decode: 3 rows each.
  const int32_t next = GreedyNext(*a1);
  ASSERT_TRUE(nibble::StepBatch({{a1.get(), {next}}, {b.get(), {5}}, {c.get(), {6}}}).ok());
  ASSERT_TRUE(nibble::StepBatch({{a2.get(), {next}}, {d.get(), {7, 8}}}).ok());
  ASSERT_TRUE(nibble::StepBatch({{a3.get(), {next}}}).ok());
  ASSERT_TRUE(alone->Step(next).ok());
  EXPECT_EQ(a1->logits(), a2->logits());
  EXPECT_EQ(a3->logits(), alone->logits());
  EXPECT_EQ(a1->position(), alone->position());
}

struct Snapshot {
  int64_t position;
  std::vector<float> logits;
};

Snapshot Take(const nibble::Session& s) { return {s.position(), s.logits()}; }

// Every refused batch names its fault (by item index where there is one) and leaves every
// session as it was: position, logits and the tokens the next step continues from.
TEST(StepBatch, RefusedBatchesChangeNoSession) {
  const nibble::Model& m = BatchTestModel();
  auto other_model = LoadEmbedded();
  ASSERT_NE(other_model, nullptr);
  auto a = NewBatchSession(m), b = NewBatchSession(m), c = NewBatchSession(m, 8), stranger = NewBatchSession(*other_model);
  ASSERT_TRUE(a->Prefill({1, 100}).ok());
  ASSERT_TRUE(b->Prefill({1}).ok());
  ASSERT_TRUE(c->Prefill({1, 2, 3, 4, 5, 6}).ok());
  ASSERT_TRUE(stranger->Prefill({1}).ok());
  const std::vector<Snapshot> before = {Take(*a), Take(*b), Take(*c)};
  const int32_t vocab = static_cast<int32_t>(m.info().vocab_size);
  struct Case {
    std::vector<nibble::BatchItem> items;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{}, "StepBatch: no sequences"},
      {{{a.get(), {5}}, {nullptr, {5}}}, "sequence 1: the session is null"},
      {{{a.get(), {5}}, {b.get(), {6}}, {a.get(), {7}}}, "sequences 0 and 2 list the same session"},
      {{{a.get(), {5}}, {stranger.get(), {6}}}, "sequence 1 runs another model than sequence 0"},
      {{{a.get(), {5, 6}}, {b.get(), {}}}, "sequence 1: no tokens"},
      {{{a.get(), {5, 6}}, {b.get(), {7, vocab}}}, "sequence 1: token id " + std::to_string(vocab)},
      {{{a.get(), {5}}, {b.get(), {-1}}}, "sequence 1: token id -1"},
      {{{a.get(), {5}}, {b.get(), {6}}, {c.get(), {7, 8, 9}}}, "sequence 2: sequence of 9 tokens exceeds the context limit of 8"},
  };
  for (const Case& k : cases) {
    const nibble::Status st = nibble::StepBatch(k.items);
    ASSERT_FALSE(st.ok()) << k.expect;
    EXPECT_EQ(st.error().code, nibble::ErrorCode::kInvalidArgument) << st.error().message;
    EXPECT_NE(st.error().message.find(k.expect), std::string::npos) << st.error().message;
    const std::vector<Snapshot> after = {Take(*a), Take(*b), Take(*c)};
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].position, before[i].position) << k.expect << ": session " << i;
      EXPECT_EQ(after[i].logits, before[i].logits) << k.expect << ": session " << i;
    }
  }
  // The sessions continue as twins never refused do.
  auto a2 = NewBatchSession(m), c2 = NewBatchSession(m, 8);
  ASSERT_TRUE(a2->Prefill({1, 100}).ok());
  ASSERT_TRUE(c2->Prefill({1, 2, 3, 4, 5, 6}).ok());
  ASSERT_TRUE(nibble::StepBatch({{a.get(), {5}}, {c.get(), {7, 8}}}).ok());
  ASSERT_TRUE(nibble::StepBatch({{a2.get(), {5}}, {c2.get(), {7, 8}}}).ok());
  EXPECT_EQ(a->logits(), a2->logits());
  EXPECT_EQ(c->logits(), c2->logits());
  EXPECT_EQ(c->position(), 8);
}

// A cancelled step returns kCancelled and leaves every session at its last complete position
// with its logits; the same step run again gives what a step never cancelled gives.
TEST(StepBatch, CancelledStepKeepsEverySessionAtItsLastCompletePosition) {
  const nibble::Model& m = BatchTestModel();
  std::vector<std::unique_ptr<nibble::Session>> s, twin;
  for (size_t i = 0; i < 3; ++i) {
    s.push_back(NewBatchSession(m));
    twin.push_back(NewBatchSession(m));
    ASSERT_TRUE(s[i]->Prefill(BatchTestIds(m, kPrompts[i])).ok());
    ASSERT_TRUE(twin[i]->Prefill(BatchTestIds(m, kPrompts[i])).ok());
  }
  const auto items = [&](std::vector<std::unique_ptr<nibble::Session>>& v) {
    return std::vector<nibble::BatchItem>{{v[0].get(), {11}}, {v[1].get(), {12, 13, 14, 15}}, {v[2].get(), {16}}};
  };
  std::vector<Snapshot> before;
  for (auto& x : s) before.push_back(Take(*x));
  nibble::CancellationToken cancel;
  cancel.Cancel();
  const nibble::Status st = nibble::StepBatch(items(s), &cancel);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, nibble::ErrorCode::kCancelled) << st.error().message;
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i]->position(), before[i].position);
    EXPECT_EQ(s[i]->logits(), before[i].logits);
  }
  nibble::CancellationToken live;
  ASSERT_TRUE(nibble::StepBatch(items(s), &live).ok());
  ASSERT_TRUE(nibble::StepBatch(items(twin)).ok());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i]->position(), twin[i]->position());
    EXPECT_EQ(s[i]->logits(), twin[i]->logits()) << "session " << i;
  }
}

}  // namespace
