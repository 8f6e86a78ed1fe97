// The threading rules of <nibble/session.h>: one Model shared read-only by many threads, each
// Session owning its scratch, one call at a time per Session. A second call on a session while
// Generate runs on it (from another thread, or from inside the callback) is refused and changes
// nothing; sessions on many threads give the results they give one after another; and the
// scratch memory follows the sessions, not the number of threads that ran forwards.
#include <nibble/nibble.h>

#include <gtest/gtest.h>
#include <malloc.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/load_or_fail.h"
#include "e2e/run_nibble.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

template <class T>
nibble::Status StatusOf(const nibble::Result<T>& r) {
  return r.ok() ? nibble::Status::Ok() : nibble::Status(r.error());
}

bool RefusedAsInUse(const nibble::Status& s) {
  return !s.ok() && s.error().message.find("in use by another call (Generate)") != std::string::npos;
}

// Every call and session that takes a thread count refuses one outside [0, kMaxThreads] with the
// value named, before any work (thousands of OpenMP threads crashed a quantize run).
TEST(SessionThreads, ThreadCountsOutsideTheRangeAreNamedErrors) {
  auto m = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(m, nullptr);
  for (const int bad : {-1, nibble::kMaxThreads + 1, 99999}) {
    const std::string want = "--threads " + std::to_string(bad) + " must be in [0, 1024]";
    auto named = [&](const nibble::Status& s) { return !s.ok() && s.error().message.find(want) != std::string::npos; };
    nibble::SessionOptions so;
    so.threads = bad;
    EXPECT_TRUE(named(StatusOf(nibble::Session::Create(*m, so)))) << bad;
    auto base = nibble::Session::Create(*m);
    ASSERT_TRUE(base.ok());
    EXPECT_TRUE(named(StatusOf((*base)->Fork(-1, so)))) << bad;
    nibble::PerplexityOptions po;
    po.threads = bad;
    EXPECT_TRUE(named(StatusOf(nibble::EvaluatePerplexity(*m, "Once upon a time there was a king.", po)))) << bad;
    nibble::LoadOptions lo;
    lo.threads = bad;
    EXPECT_TRUE(named(StatusOf(nibble::Model::Load(nibble_test::EmbeddedModel(), lo)))) << bad;
    nibble_test::TempDir tmp;
    nibble::QuantizeRequest q;
    q.model_dir = nibble_test::EmbeddedModel();
    q.output_dir = tmp.sub("q");
    q.threads = bad;
    EXPECT_TRUE(named(StatusOf(nibble::Quantize(q)))) << bad;
    EXPECT_FALSE(std::filesystem::exists(tmp.sub("q"))) << bad;
  }
}

TEST(SessionThreads, CallsWhileGenerateRunsAreRefusedAndChangeNothing) {
  auto m = nibble_test::LoadOrFail(nibble_test::EmbeddedModel());
  ASSERT_NE(m, nullptr);
  const auto o = nibble_test::GreedyOptions("In the beginning God created", 10);
  std::string want;
  ASSERT_TRUE(nibble::Generate(*m, o, [&](std::string_view p) {
    want += p;
    return true;
  }).ok());

  auto created = nibble::Session::Create(*m);
  ASSERT_TRUE(created.ok()) << created.error().message;
  nibble::Session& s = **created;
  auto other = nibble::Session::Create(*m);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Prefill({1, 5}).ok());
  std::string got;
  int pieces = 0;
  std::vector<nibble::Status> from_thread, reentrant;
  int64_t pos_before = -1, pos_after = -1;
  std::vector<float> logits_before;
  auto stats = nibble::Generate(s, o, [&](std::string_view piece) {
    got += piece;
    if (pieces++ != 2) return true;
    pos_before = s.position();
    logits_before = s.logits();
    // Another thread, started and joined here: it runs while Generate is in progress.
    std::thread t([&] {
      from_thread.push_back(s.Step(5));
      from_thread.push_back(s.Prefill({5, 6}));
      from_thread.push_back(StatusOf(s.Sample(o.sampling)));
      from_thread.push_back(s.Truncate(0));
      from_thread.push_back(StatusOf(s.PromptPositions("x")));
      from_thread.push_back(StatusOf(nibble::Generate(s, nibble_test::GreedyOptions("x", 2), [](std::string_view) { return true; })));
      from_thread.push_back(nibble::StepBatch({other->get(), &s}, {5, 6}));
    });
    t.join();
    // The callback's own thread: re-entrant calls are refused too.
    reentrant.push_back(s.Step(5));
    reentrant.push_back(s.Truncate(1));
    reentrant.push_back(StatusOf(nibble::Generate(s, nibble_test::GreedyOptions("x", 2), [](std::string_view) { return true; })));
    pos_after = s.position();
    return true;
  });
  ASSERT_TRUE(stats.ok()) << stats.error().message;
  ASSERT_EQ(from_thread.size(), 7u);
  for (size_t i = 0; i < from_thread.size(); ++i)
    EXPECT_TRUE(RefusedAsInUse(from_thread[i])) << i << ": " << (from_thread[i].ok() ? "ok" : from_thread[i].error().message);
  for (size_t i = 0; i < reentrant.size(); ++i)
    EXPECT_TRUE(RefusedAsInUse(reentrant[i])) << i << ": " << (reentrant[i].ok() ? "ok" : reentrant[i].error().message);
  EXPECT_NE(from_thread.back().error().message.find("session 1"), std::string::npos) << from_thread.back().error().message;
  EXPECT_EQ(pos_after, pos_before);
  EXPECT_EQ(got, want) << "the refused calls changed the generation";
  EXPECT_EQ((*other)->position(), 2) << "a refused StepBatch stepped another session";
  // The session is free again and usable.
  const int64_t pos = s.position();
  ASSERT_TRUE(s.Step(5).ok());
  EXPECT_EQ(s.position(), pos + 1);
  ASSERT_TRUE(s.Truncate(0).ok());
  std::string again;
  ASSERT_TRUE(nibble::Generate(s, o, [&](std::string_view p) {
    again += p;
    return true;
  }).ok());
  EXPECT_EQ(again, want);
  (void)logits_before;
}

// A small int4 (Quark) model with a wide dense lm_head (65536 x 256, 32 MB in bf16, 64 MB
// widened to fp32): large enough that a per-thread copy of a weight shows in the RSS.
class WideHeadModel {
 public:
  static const nibble::Model* Get() {
    static WideHeadModel* m = new WideHeadModel();
    return m->model_.get();
  }

 private:
  WideHeadModel() : dir_("nibble_wide_head_") {
    dir_.Write("config.json", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 65536, "max_position_embeddings": 512, "rms_norm_eps": 1e-05,
      "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1,
      "eos_token_id": 2, "torch_dtype": "bfloat16"})");
    const auto r = nibble_test::RunNibble("synth --config " + nibble_test::Quote(dir_.sub("config.json")) +
                                          " --format quark --out " + nibble_test::Quote(dir_.sub("m")));
    if (r.exit_code != 0) {
      ADD_FAILURE() << r.out;
      return;
    }
    model_ = nibble_test::LoadOrFail(dir_.sub("m"));
  }
  nibble_test::TempDir dir_;
  std::unique_ptr<nibble::Model> model_;
};

std::vector<int32_t> ThreadTestIds(int64_t n, int32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(1 + (seed * 7919 + i * 104729) % 4000);
  return ids;
}

// Logits after a prefill of `ids` and after each of `steps` greedy steps.
std::vector<std::vector<float>> RunSession(const nibble::Model& m, const std::vector<int32_t>& ids, int steps) {
  nibble::SessionOptions so;
  so.threads = 1;
  so.context = 256;
  auto s = nibble::Session::Create(m, so);
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return {};
  std::vector<std::vector<float>> out;
  EXPECT_TRUE((*s)->Prefill(ids).ok());
  out.push_back((*s)->logits());
  nibble::SamplingOptions greedy;
  greedy.temperature = 0;
  for (int i = 0; i < steps; ++i) {
    auto next = (*s)->Sample(greedy);
    EXPECT_TRUE(next.ok());
    if (!next.ok()) break;
    EXPECT_TRUE((*s)->Step(*next).ok());
    out.push_back((*s)->logits());
  }
  return out;
}

TEST(SessionThreads, SessionsOnManyThreadsMatchThemOneAfterAnother) {
  const nibble::Model* m = WideHeadModel::Get();
  ASSERT_NE(m, nullptr);
  constexpr int kThreads = 4;
  std::vector<std::vector<std::vector<float>>> alone(kThreads), together(kThreads);
  // Prompts of 100 rows run the int4 linears' tiled dequantize + GEMM path, steps the kernels.
  for (int i = 0; i < kThreads; ++i) alone[i] = RunSession(*m, ThreadTestIds(100 + 10 * i, i), 3);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back([&, i] { together[i] = RunSession(*m, ThreadTestIds(100 + 10 * i, i), 3); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_EQ(together[i].size(), alone[i].size());
    for (size_t j = 0; j < alone[i].size(); ++j) EXPECT_EQ(together[i][j], alone[i][j]) << "session " << i << " call " << j;
  }
}

// Threads that stay alive after their forwards, as a server's request threads do: each runs a
// prefill of 200 tokens in a session of its own and Model::Logits of 200 positions (the wide
// lm_head on 200 rows). Before, each thread kept its scratch (the lm_head widened to fp32, 64 MB,
// and the activations) for its life; now the scratch is the session's or the call's, so eight
// threads hold what one does.
TEST(SessionThreads, ScratchDoesNotGrowWithTheThreadsThatRanForwards) {
  if (nibble_test::ProcStatusBytes("VmRSS") < 0) GTEST_SKIP() << "no /proc/self/status";
  const nibble::Model* m = WideHeadModel::Get();
  ASSERT_NE(m, nullptr);
  // Large blocks always from mmap (freed back at once): the RSS then shows what is held.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  const std::vector<int32_t> ids = ThreadTestIds(200, 3);
  auto work = [&] {
    nibble::SetNumThreads(1);
    auto logits = m->Logits(ids);
    EXPECT_TRUE(logits.ok());
    nibble::SessionOptions so;
    so.threads = 1;
    so.context = 256;
    auto s = nibble::Session::Create(*m, so);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Prefill(ids).ok());
    EXPECT_LE((*s)->scratch_bytes(), int64_t{16} << 20) << "a long prompt's scratch is kept after its Prefill";
  };
  work();  // one-time state (oneDNN kernels, RoPE tables) on this thread first
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  bool release = false;
  std::vector<std::thread> threads;
  auto start_one = [&] {
    const int want = done + 1;
    threads.emplace_back([&] {
      work();
      std::unique_lock<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == want; });
  };
  const int64_t base = nibble_test::ProcStatusBytes("VmRSS");
  start_one();
  const int64_t one = nibble_test::ProcStatusBytes("VmRSS");
  for (int i = 1; i < 8; ++i) start_one();
  const int64_t eight = nibble_test::ProcStatusBytes("VmRSS");
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  const int64_t head_fp32 = int64_t{65536} * 256 * 4;
  std::printf("VmRSS: base %.1f MB, 1 thread +%.1f MB, 8 threads +%.1f MB\n", base / 1e6, (one - base) / 1e6,
              (eight - base) / 1e6);
  // Seven more threads: before, 7 x (64 MB + activations); now their stacks and allocator state.
  EXPECT_LT(eight - one, head_fp32 / 2) << "scratch grows with the threads that ran forwards";
}

}  // namespace
