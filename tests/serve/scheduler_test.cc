// The server's scheduler (src/serve/scheduler.h) on the embedded model: sequences run in
// batched steps with chunked prefill give Generate's greedy text alone; the queue bound; a
// cancelled request ends at the next step and frees its slot.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <nibble/nibble.h>

#include "serve/scheduler.h"
#include "test_paths.h"

namespace nibble::serve {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Model> LoadEmbedded() {
  auto m = Model::Load(nibble_test::EmbeddedModel());
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(*m) : nullptr;
}

SeqJob Job(const Model& model, const std::string& prompt, int64_t max_tokens, int index, std::shared_ptr<Channel> ch) {
  SeqJob j;
  j.prompt = *model.Tokenize(prompt);
  j.max_tokens = max_tokens;
  j.sampling.temperature = 0;
  j.index = index;
  j.channel = std::move(ch);
  return j;
}

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

TEST(ServeScheduler, BatchedChunkedGreedyEqualsGenerateAlone) {
  auto model = LoadEmbedded();
  ASSERT_TRUE(model);
  const std::vector<std::string> prompts = {"The king", "A small boat sailed across the quiet bay while the",
                                            "In the morning", "She opened the door and saw", "Long ago", "The children ran"};
  SchedulerOptions so;
  so.parallel = 4;  // two wait in the queue
  so.chunk = 5;     // long prompts prefill over several steps, beside running decodes
  so.ctx_size = 256;
  Scheduler sched(*model, so);
  auto ch = std::make_shared<Channel>();
  std::vector<SeqJob> jobs;
  for (size_t i = 0; i < prompts.size(); ++i) jobs.push_back(Job(*model, prompts[i], 12, static_cast<int>(i), ch));
  ASSERT_TRUE(sched.Submit(std::move(jobs)));
  std::vector<SeqEvent> ends;
  const std::vector<std::string> got = Collect(*ch, static_cast<int>(prompts.size()), &ends);
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions g;
    g.prompt = prompts[i];
    g.max_new_tokens = 12;
    g.sampling.temperature = 0;
    std::string want;
    auto st = Generate(*model, g, [&want](std::string_view piece) {
      want += piece;
      return true;
    });
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(got[i], want) << "prompt " << i;
  }
  for (const SeqEvent& e : ends) EXPECT_TRUE(e.error.empty()) << e.error;
  EXPECT_GT(sched.counters().steps.load(), 12);
  // Chunked: no step ran more than `chunk` prompt tokens besides its decode rows.
  EXPECT_LE(sched.counters().step_tokens.load(), sched.counters().steps.load() * (so.chunk + so.parallel));
}

TEST(ServeScheduler, RepeatedPromptComesFromThePrefixCache) {
  auto model = LoadEmbedded();
  ASSERT_TRUE(model);
  Scheduler sched(*model, SchedulerOptions());
  std::vector<SeqEvent> first, second;
  for (auto* ends : {&first, &second}) {
    auto ch = std::make_shared<Channel>();
    std::vector<SeqJob> jobs;
    jobs.push_back(Job(*model, "A small boat sailed across the quiet bay", 4, 0, ch));
    ASSERT_TRUE(sched.Submit(std::move(jobs)));
    Collect(*ch, 1, ends);
  }
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_TRUE(first[0].error.empty()) << first[0].error;
  EXPECT_EQ(first[0].cached_tokens, 0);
  EXPECT_EQ(second[0].cached_tokens, second[0].prompt_tokens - 1);  // all but the last, which must run
  EXPECT_EQ(sched.counters().cache_hits.load(), 1);
}

TEST(ServeScheduler, QueueBoundAndCancelFreesTheSlot) {
  auto model = LoadEmbedded();
  ASSERT_TRUE(model);
  SchedulerOptions so;
  so.parallel = 1;
  so.max_queue = 1;
  so.ctx_size = 512;
  Scheduler sched(*model, so);
  auto a = std::make_shared<Channel>(), b = std::make_shared<Channel>(), c = std::make_shared<Channel>();
  std::vector<SeqJob> ja, jb, jc;
  ja.push_back(Job(*model, "The story", 400, 0, a));
  ASSERT_TRUE(sched.Submit(std::move(ja)));
  for (int i = 0; i < 500 && sched.active() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(sched.active(), 1);
  jb.push_back(Job(*model, "The sea", 4, 0, b));
  ASSERT_TRUE(sched.Submit(std::move(jb)));  // waits for the slot
  jc.push_back(Job(*model, "The sky", 4, 0, c));
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

}  // namespace
}  // namespace nibble::serve

namespace nibble::serve {
namespace {

// A long prompt arriving while sequences decode is prefilled `chunk` tokens per step beside
// them: every running sequence gets a token every step (its inter-token gap is one step of at
// most `chunk` prompt rows), and the long prompt's first token comes after its chunks.
TEST(ServeScheduler, LongPromptNeverStallsRunningStreams) {
  auto model = LoadEmbedded();
  ASSERT_TRUE(model);
  SchedulerOptions so;
  so.parallel = 5;
  so.chunk = 32;
  so.ctx_size = 512;
  Scheduler sched(*model, so);
  auto running = std::make_shared<Channel>(), longer = std::make_shared<Channel>();
  std::vector<SeqJob> jobs;
  const char* prompts[] = {"The king", "A small boat", "In the morning", "Long ago"};
  for (int i = 0; i < 4; ++i) jobs.push_back(Job(*model, prompts[i], 60, i, running));
  ASSERT_TRUE(sched.Submit(std::move(jobs)));
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
  std::vector<SeqJob> long_job;
  long_job.push_back(Job(*model, text, 2, 0, longer));
  const int64_t long_tokens = static_cast<int64_t>(long_job[0].prompt.size());
  ASSERT_GT(long_tokens, 10 * so.chunk);
  const int64_t submitted_at = sched.counters().steps.load();
  ASSERT_TRUE(sched.Submit(std::move(long_job)));
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

}  // namespace
}  // namespace nibble::serve

namespace nibble::serve {
namespace {

// The n choices of one prompt prefill it once: the others fork the first's KV and run only the
// last prompt token for their own logits. Greedy, all equal Generate's text.
TEST(ServeScheduler, ChoicesOfOnePromptPrefillItOnce) {
  auto model = LoadEmbedded();
  ASSERT_TRUE(model);
  SchedulerOptions so;
  so.chunk = 8;  // the prompt takes several steps: the other choices wait for it
  so.ctx_size = 256;
  so.prefix_cache_bytes = 0;  // no help from the prefix cache
  Scheduler sched(*model, so);
  const std::string prompt = "A small boat sailed across the quiet bay while the old man watched from the shore";
  auto ch = std::make_shared<Channel>();
  std::vector<SeqJob> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back(Job(*model, prompt, 10, i, ch));
  const auto n_prompt = static_cast<int64_t>(jobs[0].prompt.size());
  ASSERT_GT(n_prompt, 2 * so.chunk);
  ASSERT_TRUE(sched.Submit(std::move(jobs)));
  const std::vector<std::string> got = Collect(*ch, 3);
  GenerateOptions g;
  g.prompt = prompt;
  g.max_new_tokens = 10;
  g.sampling.temperature = 0;
  std::string want;
  ASSERT_TRUE(Generate(*model, g, [&want](std::string_view piece) {
                want += piece;
                return true;
              }).ok());
  for (const std::string& text : got) EXPECT_EQ(text, want);
  EXPECT_EQ(sched.counters().prompt_tokens.load(), n_prompt + 2);
  EXPECT_EQ(sched.queued(), 0);
}

}  // namespace
}  // namespace nibble::serve
