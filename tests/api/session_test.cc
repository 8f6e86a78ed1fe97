// The public Session API over the embedded default model: prefill / step / sample against
// Generate, several sessions over one model at once, a callback that stops generation, a session
// continued over two calls, per-session thread counts, and error codes.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "api/load_or_fail.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

const nibble::Model& EmbeddedModel() {
  static std::unique_ptr<nibble::Model> model = [] {
    auto m = nibble::Model::Load(nibble_test::EmbeddedModel());
    if (!m.ok()) {
      ADD_FAILURE() << m.error().message;
      return std::unique_ptr<nibble::Model>();
    }
    return std::move(m).value();
  }();
  return *model;
}

std::string GenerateText(const nibble::Model& m, const nibble::GenerateOptions& o, nibble::GenerateStats* stats = nullptr) {
  std::string text;
  auto s = nibble::Generate(m, o, [&](std::string_view piece) {
    text += piece;
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.error().message;
  if (stats != nullptr && s.ok()) *stats = *s;
  return text;
}

TEST(Session, PrefillStepSampleGiveGeneratesTokens) {
  const nibble::Model& m = EmbeddedModel();
  const auto o = nibble_test::GreedyOptions("And God said", 12);
  const std::string want = GenerateText(m, o);
  auto session = nibble::Session::Create(m);
  ASSERT_TRUE(session.ok()) << session.error().message;
  auto prompt = m.Tokenize(o.prompt);
  ASSERT_TRUE(prompt.ok());
  ASSERT_TRUE((*session)->Prefill(*prompt).ok());
  std::vector<int32_t> out;
  for (int i = 0; i < 12; ++i) {
    auto next = (*session)->Sample(o.sampling);
    ASSERT_TRUE(next.ok()) << next.error().message;
    out.push_back(*next);
    ASSERT_TRUE((*session)->Step(*next).ok());
  }
  EXPECT_EQ((*session)->position(), static_cast<int64_t>(prompt->size()) + 12);
  std::vector<int32_t> all = *prompt;
  all.insert(all.end(), out.begin(), out.end());
  EXPECT_EQ(m.Detokenize(all), m.Detokenize(*prompt) + want);
}

// The argmax of `logits` after llama.cpp's repeat penalty over every distinct id of `history`.
int32_t PenalisedArgmax(std::vector<float> logits, const std::vector<int32_t>& history, float penalty) {
  std::vector<int32_t> ids = history;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int32_t id : ids) logits[id] = logits[id] > 0 ? logits[id] / penalty : logits[id] * penalty;
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The repeat penalty looks back over what the context holds: the prompt, every step, and no more
// after a Truncate.
TEST(Session, RepeatPenaltySeesTheTokensInTheContext) {
  const nibble::Model& m = EmbeddedModel();
  auto session = nibble::Session::Create(m);
  ASSERT_TRUE(session.ok()) << session.error().message;
  nibble::Session& s = **session;
  auto prompt = m.Tokenize("And God said unto Moses, and God said");
  ASSERT_TRUE(prompt.ok());
  nibble::SamplingOptions o;
  o.temperature = 0;
  o.repeat_penalty = 1.8f;
  o.repeat_last_n = -1;
  std::vector<int32_t> history = *prompt;
  ASSERT_TRUE(s.Prefill(*prompt).ok());
  int changed = 0;
  for (int i = 0; i < 16; ++i) {
    auto next = s.Sample(o);
    ASSERT_TRUE(next.ok()) << next.error().message;
    ASSERT_EQ(*next, PenalisedArgmax(s.logits(), history, o.repeat_penalty)) << "step " << i;
    changed += *next != PenalisedArgmax(s.logits(), {}, 1.0f);
    history.push_back(*next);
    ASSERT_TRUE(s.Step(*next).ok());
  }
  EXPECT_GT(changed, 0) << "the penalty never changed the greedy choice: the check above proves nothing";
  ASSERT_TRUE(s.Truncate(3).ok());
  history.resize(3);
  const std::vector<int32_t> more = {(*prompt)[3], (*prompt)[4]};
  ASSERT_TRUE(s.Prefill(more).ok());
  history.insert(history.end(), more.begin(), more.end());
  auto next = s.Sample(o);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, PenalisedArgmax(s.logits(), history, o.repeat_penalty));
}

// The argmax of `logits` after OpenAI's penalties over `output`, written out per token.
int32_t OpenAiArgmax(std::vector<float> logits, const std::vector<int32_t>& output, float presence, float frequency) {
  for (size_t t = 0; t < logits.size(); ++t) {
    const auto count = static_cast<float>(std::count(output.begin(), output.end(), static_cast<int32_t>(t)));
    logits[t] -= presence * (count > 0 ? 1.0f : 0.0f) + frequency * count;
  }
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Up to n greedy tokens after `context` on a fresh session, the penalties counting only these
// tokens (stops at EOS); `changed` counts the steps where the penalties changed the argmax.
std::vector<int32_t> PenalisedReference(const nibble::Model& m, const std::vector<int32_t>& context, int n, float presence,
                                        float frequency, int* changed) {
  auto session = nibble::Session::Create(m);
  EXPECT_TRUE(session.ok() && (*session)->Prefill(context).ok());
  if (!session.ok()) return {};
  const std::vector<int32_t>& eos = m.special_tokens().eos_ids;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& l = (*session)->logits();
    const int32_t next = OpenAiArgmax(l, out, presence, frequency);
    *changed += next != OpenAiArgmax(l, {}, 0, 0);
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    out.push_back(next);
    EXPECT_TRUE((*session)->Step(next).ok());
  }
  return out;
}

// OpenAI's presence / frequency penalties count a Generate's own tokens: not the prompt, not an
// earlier Generate's on the same session.
TEST(SessionSampling, OpenAiPenaltiesCountOnlyThisGenerationsOutput) {
  const nibble::Model& m = EmbeddedModel();
  auto session = nibble::Session::Create(m);
  ASSERT_TRUE(session.ok()) << session.error().message;
  nibble::GenerateOptions o = nibble_test::GreedyOptions("", 24);
  o.sampling.presence_penalty = 0.5f;
  o.sampling.frequency_penalty = 1.5f;
  std::vector<int32_t> context;  // what the session holds (and the token Generate left to run)
  for (const char* prompt : {"And God said unto Moses, and God said", " and the king said"}) {
    auto ids = m.Tokenize(prompt, context.empty());
    ASSERT_TRUE(ids.ok());
    context.insert(context.end(), ids->begin(), ids->end());
    o.prompt = prompt;
    std::vector<int32_t> got;
    auto st = nibble::Generate(**session, o, [&got](const nibble::TokenEvent& ev) {
      if (ev.id != nibble::TokenEvent::kNoToken) got.push_back(ev.id);
      return true;
    });
    ASSERT_TRUE(st.ok()) << st.error().message;
    int changed = 0;
    const std::vector<int32_t> want =
        PenalisedReference(m, context, 24, o.sampling.presence_penalty, o.sampling.frequency_penalty, &changed);
    EXPECT_EQ(got, want) << prompt;
    EXPECT_GT(changed, 0) << "the penalties never changed the greedy choice: the check above proves nothing";
    context.insert(context.end(), got.begin(), got.end());
  }
}

TEST(Session, SessionsOverOneModelRunAtOnceWithTheSameResults) {
  const nibble::Model& m = EmbeddedModel();
  const auto a = nibble_test::GreedyOptions("In the beginning", 24), b = nibble_test::GreedyOptions("The king", 24);
  const std::string want_a = GenerateText(m, a), want_b = GenerateText(m, b);
  std::string got_a, got_b;
  std::thread ta([&] { got_a = GenerateText(m, a); });
  std::thread tb([&] { got_b = GenerateText(m, b); });
  ta.join();
  tb.join();
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
}

// Batched decode: three sessions at different positions stepped together give each the logits
// and the greedy continuation it gets alone (summation order may differ for M rows: a bound, and
// the same argmax).
TEST(Session, StepBatchMatchesEachSessionStepAlone) {
  const nibble::Model& m = EmbeddedModel();
  const std::vector<std::string> prompts = {"In the beginning", "The king said unto", "And"};
  std::vector<std::unique_ptr<nibble::Session>> solo, batch;
  for (const std::string& p : prompts) {
    auto ids = m.Tokenize(p);
    ASSERT_TRUE(ids.ok());
    for (auto* v : {&solo, &batch}) {
      auto s = nibble::Session::Create(m);
      ASSERT_TRUE(s.ok());
      ASSERT_TRUE((*s)->Prefill(*ids).ok());
      v->push_back(std::move(s).value());
    }
  }
  nibble::SamplingOptions greedy;
  greedy.temperature = 0;
  for (int step = 0; step < 8; ++step) {
    std::vector<nibble::Session*> ptrs;
    std::vector<int32_t> tokens;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto t = batch[i]->Sample(greedy);
      auto want = solo[i]->Sample(greedy);
      ASSERT_TRUE(t.ok() && want.ok());
      ASSERT_EQ(*t, *want) << "sequence " << i << " step " << step;
      ASSERT_TRUE(solo[i]->Step(*want).ok());
      ptrs.push_back(batch[i].get());
      tokens.push_back(*t);
    }
    ASSERT_TRUE(nibble::StepBatch(ptrs, tokens).ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<float>& a = batch[i]->logits();
      const std::vector<float>& b = solo[i]->logits();
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(batch[i]->position(), solo[i]->position());
      float scale = 0, diff = 0;
      for (size_t j = 0; j < a.size(); ++j) {
        scale = std::max(scale, std::abs(b[j]));
        diff = std::max(diff, std::abs(a[j] - b[j]));
      }
      EXPECT_LE(diff, 1e-4f * scale) << "sequence " << i << " step " << step;
    }
  }
}

TEST(Session, StepBatchRefusesBadBatchesAndChangesNothing) {
  const nibble::Model& m = EmbeddedModel();
  auto a = nibble::Session::Create(m);
  auto b = nibble::Session::Create(m);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Prefill({1, 100}).ok());
  ASSERT_TRUE((*b)->Prefill({1}).ok());
  auto expect_error = [&](const std::vector<nibble::Session*>& s, const std::vector<int32_t>& t, const char* what) {
    const nibble::Status st = nibble::StepBatch(s, t);
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    EXPECT_EQ((*a)->position(), 2);
    EXPECT_EQ((*b)->position(), 1);
  };
  expect_error({}, {}, "no sessions");
  expect_error({a->get(), b->get()}, {5}, "2 sessions but 1 tokens");
  expect_error({a->get(), a->get()}, {5, 6}, "share one KV cache");
  expect_error({a->get(), b->get()}, {5, static_cast<int32_t>(m.info().vocab_size)}, "sequence 1: token id");
}

TEST(Session, CallbackReturningFalseStopsGeneration) {
  const nibble::Model& m = EmbeddedModel();
  int calls = 0;
  auto s = nibble::Generate(m, nibble_test::GreedyOptions("And God said", 40), [&](std::string_view) { return ++calls < 3; });
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(s->stop_reason, nibble::StopReason::kCallback);
  EXPECT_LT(s->generated_tokens, 40);
}

// A stop id ends generation where EOS would: the tokens before it are shown, it is not run.
TEST(Session, StopIdsEndGenerationLikeEos) {
  const nibble::Model& m = EmbeddedModel();
  auto session = nibble::Session::Create(m);
  ASSERT_TRUE(session.ok());
  auto prompt = m.Tokenize("And God said");
  ASSERT_TRUE(prompt.ok());
  ASSERT_TRUE((*session)->Prefill(*prompt).ok());
  std::vector<int32_t> greedy;
  for (int i = 0; i < 6; ++i) {
    auto next = (*session)->Sample(nibble_test::GreedyOptions("", 1).sampling);
    ASSERT_TRUE(next.ok());
    greedy.push_back(*next);
    ASSERT_TRUE((*session)->Step(*next).ok());
  }
  // The first position whose id did not occur before it: generation stops right there.
  size_t at = 1;
  while (at < greedy.size() && std::find(greedy.begin(), greedy.begin() + at, greedy[at]) != greedy.begin() + at) ++at;
  ASSERT_LT(at, greedy.size());
  auto o = nibble_test::GreedyOptions("And God said", 6);
  o.stop_ids = {greedy[at]};
  nibble::GenerateStats stats;
  const std::string text = GenerateText(m, o, &stats);
  EXPECT_EQ(stats.stop_reason, nibble::StopReason::kStopToken);
  EXPECT_EQ(stats.stop_token, greedy[at]);
  EXPECT_EQ(stats.generated_tokens, static_cast<int64_t>(at));
  std::vector<int32_t> shown = *prompt;
  shown.insert(shown.end(), greedy.begin(), greedy.begin() + static_cast<std::ptrdiff_t>(at));
  EXPECT_EQ(m.Detokenize(*prompt) + text, m.Detokenize(shown));
}

TEST(Session, AContinuedSessionKeepsItsContextAndAddsNoSecondBos) {
  const nibble::Model& m = EmbeddedModel();
  auto session = nibble::Session::Create(m);
  ASSERT_TRUE(session.ok());
  std::string first, second;
  auto collect = [](std::string* out) {
    return [out](std::string_view p) {
      *out += p;
      return true;
    };
  };
  auto s1 = nibble::Generate(**session, nibble_test::GreedyOptions("And God said", 8), collect(&first));
  ASSERT_TRUE(s1.ok()) << s1.error().message;
  const int64_t after_first = (*session)->position();
  auto s2 = nibble::Generate(**session, nibble_test::GreedyOptions(" and", 8), collect(&second));
  ASSERT_TRUE(s2.ok()) << s2.error().message;
  auto cont = m.Tokenize(" and");
  ASSERT_TRUE(cont.ok());
  // The second prompt adds no BOS; the last token of the first call is run before it.
  EXPECT_EQ(s2->prompt_tokens, static_cast<int64_t>(cont->size()) - 1);
  EXPECT_GT((*session)->position(), after_first + s2->prompt_tokens);
  EXPECT_FALSE(second.empty());
  ASSERT_TRUE((*session)->Truncate(0).ok());
  EXPECT_EQ((*session)->position(), 0);
  EXPECT_TRUE((*session)->logits().empty());
}

TEST(Session, PerSessionThreadsLeaveTheCallersSetting) {
  const nibble::Model& m = EmbeddedModel();
  nibble::SetNumThreads(2);
  const auto o = nibble_test::GreedyOptions("The king", 16);
  const std::string want = GenerateText(m, o);
  nibble::SessionOptions so;
  so.threads = 1;
  auto session = nibble::Session::Create(m, so);
  ASSERT_TRUE(session.ok());
  std::string got;
  auto s = nibble::Generate(**session, o, [&](std::string_view p) {
    got += p;
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(got, want);  // results do not depend on the thread count
  EXPECT_EQ(nibble::NumThreads(), 2);
}

// Every kernel's and the attention's arithmetic is fixed by the shapes, not by the threads that
// run it: the logits of a prefill long enough for several attention row blocks and of the decode
// steps after it are bit-identical at 1 and 2 threads (serial and parallel paths both run).
TEST(Session, LogitsDoNotDependOnTheThreadCount) {
  const nibble::Model& m = EmbeddedModel();
  std::string text;
  for (int i = 0; i < 12; ++i) text += "The king said unto the people of the land. ";
  auto ids = m.Tokenize(text);
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  ASSERT_GT(ids->size(), 100u);
  std::vector<std::vector<float>> logits[2];
  for (int threads : {1, 2}) {
    nibble::SessionOptions so;
    so.threads = threads;
    auto session = nibble::Session::Create(m, so);
    ASSERT_TRUE(session.ok());
    ASSERT_TRUE((*session)->Prefill(*ids).ok());
    logits[threads - 1].push_back((*session)->logits());
    for (int32_t t : {ids->at(1), ids->at(2), ids->at(3), ids->at(4)}) {
      ASSERT_TRUE((*session)->Step(t).ok());
      logits[threads - 1].push_back((*session)->logits());
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) EXPECT_EQ(logits[0][i], logits[1][i]) << "call " << i;
}

// The sampling rules a front end checks before it loads anything (the CLI's flags, a server's
// request fields): every field out of range is refused by name, with the prefix the caller gives.
TEST(Session, SamplingOptionsAreValidatedWithTheFieldNamed) {
  EXPECT_TRUE(nibble::ValidateSamplingOptions(nibble::SamplingOptions()).ok());
  EXPECT_TRUE(nibble::ValidateGenerateOptions(nibble::GenerateOptions()).ok());
  struct Case {
    std::function<void(nibble::GenerateOptions&)> set;
    std::string field;
  };
  const float nan = std::nanf("");
  const std::vector<Case> cases = {
      {[](auto& o) { o.sampling.temperature = -1; }, "temperature -1"},
      {[nan](auto& o) { o.sampling.temperature = nan; }, "temperature nan"},
      {[](auto& o) { o.sampling.temperature = INFINITY; }, "temperature inf"},
      {[](auto& o) { o.sampling.top_k = -1; }, "top_k -1"},
      {[](auto& o) { o.sampling.top_p = 0; }, "top_p 0"},
      {[](auto& o) { o.sampling.top_p = 1.5f; }, "top_p 1.5"},
      {[nan](auto& o) { o.sampling.top_p = nan; }, "top_p nan"},
      {[](auto& o) { o.sampling.min_p = -0.1f; }, "min_p -0.1"},
      {[](auto& o) { o.sampling.min_p = 2; }, "min_p 2"},
      {[](auto& o) { o.sampling.repeat_penalty = 0; }, "repeat_penalty 0"},
      {[](auto& o) { o.sampling.repeat_last_n = -2; }, "repeat_last_n -2"},
      {[](auto& o) { o.max_new_tokens = -1; }, "max_new_tokens -1"},
      {[](auto& o) { o.warmup = -1; }, "warmup -1"},
  };
  for (const Case& c : cases) {
    nibble::GenerateOptions o;
    c.set(o);
    const nibble::Status s = nibble::ValidateGenerateOptions(o, "--");
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.error().code, nibble::ErrorCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.error().message.rfind("--" + c.field, 0), 0u) << s.error().message;
    const nibble::Status bare = nibble::ValidateGenerateOptions(o);
    EXPECT_EQ(bare.error().message.rfind(c.field, 0), 0u) << bare.error().message;
  }
  // The boundaries themselves are valid.
  nibble::SamplingOptions edge;
  edge.temperature = 0;
  edge.top_k = 0;
  edge.top_p = 1;
  edge.min_p = 1;
  edge.repeat_last_n = -1;
  EXPECT_TRUE(nibble::ValidateSamplingOptions(edge).ok());
  // Session::Sample applies the same rules.
  auto session = nibble::Session::Create(EmbeddedModel());
  ASSERT_TRUE(session.ok());
  auto ids = EmbeddedModel().Tokenize("And");
  ASSERT_TRUE(ids.ok());
  ASSERT_TRUE((*session)->Prefill(*ids).ok());
  nibble::SamplingOptions bad;
  bad.top_p = 0;
  auto sampled = (*session)->Sample(bad);
  ASSERT_FALSE(sampled.ok());
  EXPECT_EQ(sampled.error().message.rfind("top_p 0", 0), 0u) << sampled.error().message;
}

TEST(Session, ErrorsCarryCodes) {
  const nibble::Model& m = EmbeddedModel();
  nibble::SessionOptions so;
  so.context = -1;
  auto bad = nibble::Session::Create(m, so);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, nibble::ErrorCode::kInvalidArgument);
  auto session = nibble::Session::Create(m);
  ASSERT_TRUE(session.ok());
  auto early = (*session)->Sample(nibble::SamplingOptions());
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.error().message.find("prefill"), std::string::npos) << early.error().message;
  so.context = 4;
  auto small = nibble::Session::Create(m, so);
  ASSERT_TRUE(small.ok());
  auto full = nibble::Generate(**small, nibble_test::GreedyOptions("And God said unto Moses and Aaron", 4), [](std::string_view) { return true; });
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().message.find("remaining context"), std::string::npos) << full.error().message;
}

// PromptPositions counts what Generate fills: BOS only on an empty session, and the last token
// of a reply cut by max_new_tokens, which the next Generate runs first.
TEST(Session, PromptPositionsAreWhatGenerateFills) {
  const nibble::Model& m = EmbeddedModel();
  auto session = nibble::Session::Create(m);
  ASSERT_TRUE(session.ok());
  const std::string text = "And God said unto Moses";
  auto with_bos = m.Tokenize(text);
  ASSERT_TRUE(with_bos.ok());
  auto first = (*session)->PromptPositions(text);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, static_cast<int64_t>(with_bos->size()));
  auto stats = nibble::Generate(**session, nibble_test::GreedyOptions(text, 3), [](std::string_view) { return true; });
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->stop_reason, nibble::StopReason::kLength);
  EXPECT_EQ(stats->prompt_tokens, *first);
  const int64_t p0 = (*session)->position();
  auto next = (*session)->PromptPositions(text);
  ASSERT_TRUE(next.ok());
  const int64_t bos = m.special_tokens().add_bos ? 1 : 0;
  EXPECT_EQ(*next, static_cast<int64_t>(with_bos->size()) - bos + 1);  // no BOS, one unfed token
  ASSERT_TRUE(nibble::Generate(**session, nibble_test::GreedyOptions(text, 1), [](std::string_view) { return true; }).ok());
  EXPECT_EQ((*session)->position(), p0 + *next);
}

TEST(ErrorCodes, LoadErrorsSayWhatKindOfFailure) {
  nibble_test::TempDir tmp;
  auto missing = nibble::Model::Load(tmp.sub("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, nibble::ErrorCode::kNotFound) << missing.error().message;
  std::filesystem::create_directories(tmp.sub("gptq"));
  tmp.Write("gptq/config.json", R"({"architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "gptq", "checkpoint_format": "marlin"}})");
  auto gptq = nibble::Model::Load(tmp.sub("gptq"));
  ASSERT_FALSE(gptq.ok());
  EXPECT_EQ(gptq.error().code, nibble::ErrorCode::kUnsupported) << gptq.error().message;
  std::filesystem::create_directories(tmp.sub("bad"));
  tmp.Write("bad/config.json", "{\"architectures\": [");
  auto bad = nibble::Model::Load(tmp.sub("bad"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, nibble::ErrorCode::kCorruptInput) << bad.error().message;
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.sub("out");
  r.model_export = "onnx";
  auto q = nibble::Quantize(r);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().code, nibble::ErrorCode::kUnsupported) << q.error().message;
  EXPECT_STREQ(nibble::ErrorCodeName(q.error().code), "unsupported");
}

}  // namespace
