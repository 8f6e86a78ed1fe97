// The server's scheduler: one thread runs every open sequence in one batched step
// (StepBatch: the decode tokens of the running sequences plus at most `chunk` prompt tokens of
// those still prefilling, vLLM's chunked-prefill step), samples each sequence on its own, holds
// stop strings back across token boundaries (StopStringMatcher) and streams each token to its
// request's Channel. Requests beyond `parallel` sequences wait in a bounded queue; finished
// sequences go to a PrefixCache, from which new ones start (OpenAI's cached_tokens). A cancelled
// Channel (the client went away) or a passed deadline ends its sequences at the next step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nibble/generate.h>
#include <nibble/prefix_cache.h>
#include <nibble/session.h>

namespace nibble::serve {

/// What a sequence reports to its request: a token, or its end.
struct SeqEvent {
  int index = 0;                 // the choice index within the request
  bool has_token = false;
  TokenEvent token;              // has_token: id, released text, logprobs; at the end: text held back until then
  std::string token_text;        // has_token: the token's own text (OpenAI's logprobs "token")
  bool done = false;
  StopReason reason = StopReason::kLength;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;  // done
  std::string error;             // done with an error (a failed step, a timeout)
  int64_t step = 0;              // the scheduler's step count when it was sent (SchedulerCounters::steps)
};

/// One request's events, from the scheduler to the thread answering it.
class Channel {
 public:
  void Push(SeqEvent ev);
  /// The next event, waiting up to `wait`; false when none came.
  bool Pop(SeqEvent* ev, std::chrono::milliseconds wait);
  /// The client went away: its sequences end at the scheduler's next step.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SeqEvent> events_;
  std::atomic<bool> cancelled_{false};
};

/// One sequence to run: a choice of a request.
struct SeqJob {
  std::vector<int32_t> prompt;   // at least one id, fits the context with one position to spare
  int64_t max_tokens = 16;       // >= 1
  SamplingOptions sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;
  bool logprobs = false;
  int top_logprobs = 0;
  int index = 0;
  std::shared_ptr<Channel> channel;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct SchedulerOptions {
  int parallel = 8;
  int64_t ctx_size = 4096;  // at most max_position_embeddings; 0 = DefaultContextSize
  int64_t chunk = 256;
  int64_t max_queue = 64;
  int threads = 0;
  int64_t max_memory = 0;  // SessionOptions::max_memory of every sequence's session
  int64_t prefix_cache_bytes = 256 << 20;
};

/// Counters for /metrics (monotonic totals unless said otherwise).
struct SchedulerCounters {
  std::atomic<int64_t> prompt_tokens{0};      // prompt tokens computed (cached ones not)
  std::atomic<int64_t> cached_tokens{0};      // prompt tokens served by the prefix cache
  std::atomic<int64_t> generated_tokens{0};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> step_tokens{0};        // rows of all steps
  std::atomic<int64_t> last_batch_tokens{0};  // rows of the last step (gauge)
  std::atomic<int64_t> cache_hits{0};         // sequences that started from a cached prefix
  std::atomic<int64_t> busy_micros{0};        // time spent in steps
  std::atomic<int64_t> cancelled{0};          // sequences ended by a disconnect or timeout
};

class Scheduler {
 public:
  Scheduler(const Model& model, const SchedulerOptions& options);
  ~Scheduler();  // Stop()
  /// Queues the sequences of one request, all or none: false when more than max_queue of them
  /// would wait (those beyond the free slots).
  bool Submit(std::vector<SeqJob> jobs);
  /// Ends the scheduler thread once every queued and running sequence has finished.
  void Stop();
  int64_t active() const { return active_.load(); }
  int64_t queued() const;
  const SchedulerCounters& counters() const { return counters_; }
  const PrefixCache& cache() const { return cache_; }

  struct Slot;

 private:
  void Run();
  void Admit();
  bool NextJob(SeqJob* job);
  Slot* Sibling(const SeqJob& job) const;
  Status Start(Slot& slot);
  void Reap();
  void Step();
  void Emit(Slot& slot);
  void Finish(Slot& slot, StopReason reason, const std::string& error = "");

  const Model& model_;
  SchedulerOptions options_;
  PrefixCache cache_;
  SchedulerCounters counters_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SeqJob> queue_;
  bool stop_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;  // the scheduler thread's own
  std::deque<SeqJob> deferred_;               // the scheduler thread's own: choices waiting for a sibling's prefill
  std::atomic<int64_t> deferred_n_{0};
  std::atomic<int64_t> active_{0};
  std::thread thread_;
};

}  // namespace nibble::serve
