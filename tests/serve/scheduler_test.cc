// The server's scheduler (src/serve/scheduler.h) on the embedded model: sequences run in
// batched steps with chunked prefill give Generate's text alone (greedy, and with OpenAI's
// penalties over each sequence's own output); the queue bound; a cancelled request ends at the
// next step and frees its slot; a long prompt never stalls running streams; the choices of one
// prompt prefill it once.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <nibble/nibble.h>

#include "serve/scheduler.h"
#include "test_paths.h"

namespace nibble::serve {
namespace {

using namespace std::chrono_literals;

SamplingOptions Greedy() {
  SamplingOptions s;
  s.temperature = 0;
  return s;
}

// The embedded model, loaded once, and a scheduler over it per test.
class ServeScheduler : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load(nibble_test::EmbeddedModel());
    if (m.ok()) model_ = std::move(*m);
    else load_error_ = m.error().message;
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override { ASSERT_TRUE(model_) << load_error_; }
  void TearDown() override { sched_.reset(); }

  Scheduler& Start(const SchedulerOptions& so = SchedulerOptions()) {
    sched_ = std::make_unique<Scheduler>(*model_, so);
    return *sched_;
  }

  static SeqJob Job(const std::string& prompt, int64_t max_tokens, int index, std::shared_ptr<Channel> ch,
                    const SamplingOptions& sampling = Greedy()) {
    SeqJob j;
    j.prompt = *model_->Tokenize(prompt);
    j.max_tokens = max_tokens;
    j.sampling = sampling;
    j.index = index;
    j.channel = std::move(ch);
    return j;
  }

  // One request of a job per prompt (choice i = prompts[i]) on a new channel, submitted.
  std::shared_ptr<Channel> Submit(const std::vector<std::string>& prompts, int64_t max_tokens,
                                  const SamplingOptions& sampling = Greedy()) {
    auto ch = std::make_shared<Channel>();
    std::vector<SeqJob> jobs;
    for (size_t i = 0; i < prompts.size(); ++i) jobs.push_back(Job(prompts[i], max_tokens, static_cast<int>(i), ch, sampling));
    EXPECT_TRUE(sched_->Submit(std::move(jobs)));
    return ch;
  }

  // Generate's text for the prompt alone.
  static std::string GenerateAlone(const std::string& prompt, int64_t max_tokens, const SamplingOptions& sampling = Greedy()) {
    GenerateOptions g;
    g.prompt = prompt;
    g.max_new_tokens = max_tokens;
    g.sampling = sampling;
    std::string text;
    auto st = Generate(*model_, g, [&text](std::string_view piece) {
      text += piece;
      return true;
    });
    EXPECT_TRUE(st.ok()) << st.error().message;
    return text;
  }

  static inline std::unique_ptr<Model> model_;
  static inline std::string load_error_;
  std::unique_ptr<Scheduler> sched_;
};

// The text of each choice once all `n` are done (waits at most 60 s).
std::vector<std::string> Collect(Channel& ch, int n, std::vector<SeqEvent>* ends = nullptr) {
  std::vector<std::string> text(static_cast<size_t>(n));
  const auto t0 = std::chrono::steady_clock::now();
  for (int done = 0; done < n && std::chrono::steady_clock::now() - t0 < 60s;) {
    SeqEvent ev;
    if (!ch.Pop(&ev, 100ms)) continue;
    text[static_cast<size_t>(ev.index)] += ev.token.text;
    if (ev.done) {
      ++done;
      if (ends) ends->push_back(ev);
    }
  }
  return text;
}

TEST_F(ServeScheduler, BatchedChunkedGreedyEqualsGenerateAlone) {
  const std::vector<std::string> prompts = {"The king", "A small boat sailed across the quiet bay while the",
                                            "In the morning", "She opened the door and saw", "Long ago", "The children ran"};
  SchedulerOptions so;
  so.parallel = 4;  // two wait in the queue
  so.chunk = 5;     // long prompts prefill over several steps, beside running decodes
  so.ctx_size = 256;
  Scheduler& sched = Start(so);
  auto ch = Submit(prompts, 12);
  std::vector<SeqEvent> ends;
  const std::vector<std::string> got = Collect(*ch, static_cast<int>(prompts.size()), &ends);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], GenerateAlone(prompts[i], 12)) << "prompt " << i;
  for (const SeqEvent& e : ends) EXPECT_TRUE(e.error.empty()) << e.error;
  EXPECT_GT(sched.counters().steps.load(), 12);
  // Chunked: no step ran more than `chunk` prompt tokens besides its decode rows.
  EXPECT_LE(sched.counters().step_tokens.load(), sched.counters().steps.load() * (so.chunk + so.parallel));
}

// OpenAI's presence / frequency penalties count each sequence's own generated tokens, whether it
// prefilled its prompt in chunks, forked a sibling's (two choices of one prompt) or started
// from the prefix cache (the request repeated): each gives Generate's text alone.
TEST_F(ServeScheduler, PenaltiesCountEachSequencesOwnOutput) {
  const std::vector<std::string> prompts = {"The king", "A small boat sailed across the quiet bay while the", "The king"};
  SamplingOptions pen = Greedy();
  pen.presence_penalty = 0.5f;
  pen.frequency_penalty = 1.0f;
  SchedulerOptions so;
  so.chunk = 6;
  so.ctx_size = 256;
  Start(so);
  std::vector<std::string> want;
  int differs = 0;
  for (const std::string& p : prompts) {
    want.push_back(GenerateAlone(p, 24, pen));
    differs += want.back() != GenerateAlone(p, 24);
  }
  ASSERT_GT(differs, 0) << "the penalties change no greedy text: the test would prove nothing";
  for (int run = 0; run < 2; ++run) {
    auto ch = Submit(prompts, 24, pen);
    std::vector<SeqEvent> ends;
    const std::vector<std::string> got = Collect(*ch, 3, &ends);
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << "run " << run << ", prompt " << i;
    if (run == 1) {
      EXPECT_TRUE(std::any_of(ends.begin(), ends.end(), [](const SeqEvent& e) { return e.cached_tokens > 0; }));
    }
  }
}

TEST_F(ServeScheduler, RepeatedPromptComesFromThePrefixCache) {
  Scheduler& sched = Start();
  std::vector<SeqEvent> first, second;
  for (auto* ends : {&first, &second}) Collect(*Submit({"A small boat sailed across the quiet bay"}, 4), 1, ends);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_TRUE(first[0].error.empty()) << first[0].error;
  EXPECT_EQ(first[0].cached_tokens, 0);
  EXPECT_EQ(second[0].cached_tokens, second[0].prompt_tokens - 1);  // all but the last, which must run
  EXPECT_EQ(sched.counters().cache_hits.load(), 1);
}

TEST_F(ServeScheduler, QueueBoundAndCancelFreesTheSlot) {
  SchedulerOptions so;
  so.parallel = 1;
  so.max_queue = 1;
  so.ctx_size = 512;
  Scheduler& sched = Start(so);
  auto a = Submit({"The story"}, 400);
  for (int i = 0; i < 500 && sched.active() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(sched.active(), 1);
  auto b = Submit({"The sea"}, 4);  // waits for the slot
  std::vector<SeqJob> jc;
  jc.push_back(Job("The sky", 4, 0, std::make_shared<Channel>()));
  EXPECT_FALSE(sched.Submit(std::move(jc)));  // the queue is full: the server's 429
  a->Cancel();
  std::vector<SeqEvent> ends;
  Collect(*a, 1, &ends);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].reason, StopReason::kCancelled);
  EXPECT_LT(ends[0].completion_tokens, 400);
  std::vector<SeqEvent> b_ends;
  Collect(*b, 1, &b_ends);  // B got the slot
  ASSERT_EQ(b_ends.size(), 1u);
  EXPECT_EQ(b_ends[0].completion_tokens, 4);
  EXPECT_EQ(sched.counters().cancelled.load(), 1);
}

// A long prompt arriving while sequences decode is prefilled `chunk` tokens per step beside
// them: every running sequence gets a token every step (its inter-token gap is one step of at
// most `chunk` prompt rows), and the long prompt's first token comes after its chunks.
TEST_F(ServeScheduler, LongPromptNeverStallsRunningStreams) {
  SchedulerOptions so;
  so.parallel = 5;
  so.chunk = 32;
  so.ctx_size = 512;
  Scheduler& sched = Start(so);
  auto running = Submit({"The king", "A small boat", "In the morning", "Long ago"}, 60);
  // Once every stream has its first token, the long prompt (over 10 chunks) arrives.
  std::vector<std::vector<int64_t>> steps(4);
  std::vector<bool> done(4, false);
  auto take = [&](std::chrono::milliseconds wait) {
    SeqEvent ev;
    if (!running->Pop(&ev, wait)) return false;
    if (ev.has_token) steps[static_cast<size_t>(ev.index)].push_back(ev.step);
    if (ev.done) done[static_cast<size_t>(ev.index)] = true;
    return true;
  };
  while (std::any_of(steps.begin(), steps.end(), [](const auto& s) { return s.empty(); })) ASSERT_TRUE(take(10s));
  std::string text;
  for (int i = 0; i < 25; ++i) text += "The children ran to the river and the old man watched them. ";
  const auto long_tokens = static_cast<int64_t>(model_->Tokenize(text)->size());
  ASSERT_GT(long_tokens, 10 * so.chunk);
  const int64_t submitted_at = sched.counters().steps.load();
  auto longer = Submit({text}, 2);
  SeqEvent first_long;
  for (bool got = false; !got;) {
    ASSERT_TRUE(longer->Pop(&first_long, 30s));
    got = first_long.has_token || first_long.done;
  }
  ASSERT_TRUE(first_long.error.empty()) << first_long.error;
  EXPECT_GE(first_long.step - submitted_at, (long_tokens + so.chunk - 1) / so.chunk);
  while (!std::all_of(done.begin(), done.end(), [](bool d) { return d; })) ASSERT_TRUE(take(30s));
  for (size_t i = 0; i < steps.size(); ++i) {
    ASSERT_GT(steps[i].size(), 20u) << "stream " << i;
    for (size_t k = 1; k < steps[i].size(); ++k)
      ASSERT_EQ(steps[i][k] - steps[i][k - 1], 1) << "stream " << i << " skipped a step at token " << k;
  }
  EXPECT_LE(sched.counters().step_tokens.load(), sched.counters().steps.load() * (so.chunk + 4));
}

// The n choices of one prompt prefill it once: the others fork the first's KV and run only the
// last prompt token for their own logits. Greedy, all equal Generate's text.
TEST_F(ServeScheduler, ChoicesOfOnePromptPrefillItOnce) {
  SchedulerOptions so;
  so.chunk = 8;  // the prompt takes several steps: the other choices wait for it
  so.ctx_size = 256;
  so.prefix_cache_bytes = 0;  // no help from the prefix cache
  Scheduler& sched = Start(so);
  const std::string prompt = "A small boat sailed across the quiet bay while the old man watched from the shore";
  const auto n_prompt = static_cast<int64_t>(model_->Tokenize(prompt)->size());
  ASSERT_GT(n_prompt, 2 * so.chunk);
  auto ch = Submit({prompt, prompt, prompt}, 10);
  const std::vector<std::string> got = Collect(*ch, 3);
  const std::string want = GenerateAlone(prompt, 10);
  for (const std::string& text : got) EXPECT_EQ(text, want);
  EXPECT_EQ(sched.counters().prompt_tokens.load(), n_prompt + 2);
  EXPECT_EQ(sched.queued(), 0);
}

}  // namespace
}  // namespace nibble::serve
