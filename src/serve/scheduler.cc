// The batched scheduler (scheduler.h).
#include "serve/scheduler.h"

#include <algorithm>

#include <nibble/stop_strings.h>

#include "api/logprobs.h"
#include "api/model_impl.h"
#include "base/result.h"
#include "tokenizer/stream_decoder.h"

namespace nibble::serve {

void Channel::Push(SeqEvent ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

bool Channel::Pop(SeqEvent* ev, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, wait, [this] { return !events_.empty(); })) return false;
  *ev = std::move(events_.front());
  events_.pop_front();
  return true;
}

// A running sequence. Between steps it is in one of three states: prefilling (fed < prompt
// size), holding a sampled token to run (next >= 0), or ready to sample (logits of its last
// position are the distribution of its next token).
struct Scheduler::Slot {
  SeqJob job;
  std::unique_ptr<Session> session;
  size_t fed = 0;      // prompt ids the session holds
  size_t taking = 0;   // prompt ids in this step's item
  int32_t next = -1;
  bool ready = false;
  bool finished = false;
  int64_t generated = 0, cached = 0;
  std::unique_ptr<StreamDecoder> decoder;
  std::unique_ptr<StopStringMatcher> stop;
};

Scheduler::Scheduler(const Model& model, const SchedulerOptions& options)
    : model_(model), options_(options), cache_(model, options.prefix_cache_bytes) {
  if (options_.ctx_size <= 0) options_.ctx_size = DefaultContextSize(model);
  options_.ctx_size = std::min(options_.ctx_size, model.info().max_position_embeddings);
  thread_ = std::thread([this] { Run(); });
}

Scheduler::~Scheduler() { Stop(); }

bool Scheduler::Submit(std::vector<SeqJob> jobs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Sequences that will wait: those beyond the free slots (active_ lags by at most a step).
    const int64_t free_slots = std::max<int64_t>(0, options_.parallel - active_.load());
    if (stop_ || static_cast<int64_t>(queue_.size() + jobs.size()) > options_.max_queue + free_slots) return false;
    for (SeqJob& j : jobs) queue_.push_back(std::move(j));
  }
  cv_.notify_one();
  return true;
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

int64_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size()) + deferred_n_.load();
}

void Scheduler::Run() {
  if (options_.threads > 0) SetNumThreads(options_.threads);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty() || !slots_.empty() || !deferred_.empty(); });
      if (stop_ && queue_.empty() && slots_.empty() && deferred_.empty()) return;
    }
    Admit();
    Reap();
    if (!slots_.empty()) Step();
    slots_.erase(std::remove_if(slots_.begin(), slots_.end(), [](const auto& s) { return s->finished; }), slots_.end());
    active_.store(static_cast<int64_t>(slots_.size()));
  }
}

// A running sequence of the same request with the same prompt (another of its `n` choices).
Scheduler::Slot* Scheduler::Sibling(const SeqJob& job) const {
  for (const auto& s : slots_)
    if (!s->finished && s->session && s->job.channel == job.channel && s->job.prompt == job.prompt) return s.get();
  return nullptr;
}

// The next job to start: a deferred choice whose sibling has its prompt in its KV cache (or is
// gone), else the queue's front; a choice whose sibling is still prefilling is deferred, so that
// the prompt is prefilled once per request rather than once per choice.
bool Scheduler::NextJob(SeqJob* job) {
  for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
    const Slot* sib = Sibling(*it);
    if (sib != nullptr && sib->fed < sib->job.prompt.size() && !it->channel->cancelled()) continue;
    *job = std::move(*it);
    deferred_.erase(it);
    deferred_n_.store(static_cast<int64_t>(deferred_.size()));
    return true;
  }
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return false;
      *job = std::move(queue_.front());
      queue_.pop_front();
    }
    const Slot* sib = Sibling(*job);
    if (sib == nullptr || sib->fed == sib->job.prompt.size() || job->channel->cancelled()) return true;
    deferred_.push_back(std::move(*job));
    deferred_n_.store(static_cast<int64_t>(deferred_.size()));
  }
}

void Scheduler::Admit() {
  SeqJob job;
  while (static_cast<int>(slots_.size()) < options_.parallel && NextJob(&job)) {
    auto slot = std::make_unique<Slot>();
    slot->job = std::move(job);
    if (slot->job.channel->cancelled()) {
      ++counters_.cancelled;
      continue;  // nobody is listening
    }
    Slot& s = *slots_.emplace_back(std::move(slot));
    if (std::chrono::steady_clock::now() > s.job.deadline) {  // its time ran out in the queue
      ++counters_.cancelled;
      Finish(s, StopReason::kCancelled, "the request waited past the server's --timeout");
      continue;
    }
    if (const Status st = Start(s); !st.ok()) Finish(s, StopReason::kLength, st.error().message);
  }
}

// A new sequence's session: a fork of its sibling's prompt (all but the last position, which
// runs again to give the sequence its own logits), else the prefix cache's longest match.
Status Scheduler::Start(Slot& s) {
  SessionOptions so;
  so.context = options_.ctx_size;
  so.threads = options_.threads;
  so.max_memory = options_.max_memory;
  if (const Slot* sib = Sibling(s.job); sib != nullptr && s.job.prompt.size() > 1 && sib->fed == sib->job.prompt.size()) {
    const auto keep = static_cast<int64_t>(s.job.prompt.size()) - 1;
    NIBBLE_ASSIGN_OR_RETURN(s.session, sib->session->Fork(keep, so));
    s.fed = static_cast<size_t>(keep);
  } else {
    NIBBLE_ASSIGN_OR_RETURN(PrefixCache::Hit hit, cache_.Acquire(s.job.prompt, so));
    s.session = std::move(hit.session);
    s.cached = hit.cached_tokens;
    s.fed = static_cast<size_t>(hit.cached_tokens);
    s.ready = s.fed == s.job.prompt.size();  // the entry holds the whole prompt with its logits
    if (s.cached > 0) ++counters_.cache_hits;
    counters_.cached_tokens += s.cached;
  }
  s.decoder = std::make_unique<StreamDecoder>(ModelAccess::tokenizer(model_), s.job.prompt);
  s.stop = std::make_unique<StopStringMatcher>(s.job.stop);
  return Status::Ok();
}

void Scheduler::Reap() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& s : slots_) {
    if (s->finished) continue;
    if (s->job.channel->cancelled()) {
      ++counters_.cancelled;
      Finish(*s, StopReason::kCancelled);
    } else if (now > s->job.deadline) {
      ++counters_.cancelled;
      Finish(*s, StopReason::kCancelled, "the request ran past the server's --timeout");
    }
  }
}

// One StepBatch over the running sequences' decode tokens and up to `chunk` prompt tokens of
// those prefilling (in admission order), then a sample for every sequence whose logits are new.
void Scheduler::Step() {
  std::vector<BatchItem> items;
  std::vector<Slot*> stepped;
  for (auto& s : slots_) {
    if (s->finished || s->next < 0) continue;
    items.push_back({s->session.get(), {s->next}});
    stepped.push_back(s.get());
  }
  int64_t budget = options_.chunk;
  for (auto& s : slots_) {
    if (s->finished || s->ready || s->next >= 0 || budget <= 0) continue;
    const auto& p = s->job.prompt;
    s->taking = std::min<size_t>(static_cast<size_t>(budget), p.size() - s->fed);
    items.push_back({s->session.get(), std::vector<int32_t>(p.begin() + static_cast<std::ptrdiff_t>(s->fed),
                                                            p.begin() + static_cast<std::ptrdiff_t>(s->fed + s->taking))});
    stepped.push_back(s.get());
    budget -= static_cast<int64_t>(s->taking);
  }
  if (!items.empty()) {
    int64_t rows = 0;
    for (const BatchItem& it : items) rows += static_cast<int64_t>(it.tokens.size());
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = StepBatch(items);
    counters_.busy_micros += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    ++counters_.steps;
    counters_.step_tokens += rows;
    counters_.last_batch_tokens = rows;
    if (!st.ok()) {
      for (Slot* s : stepped) Finish(*s, StopReason::kLength, st.error().message);
      return;
    }
    for (Slot* s : stepped) {
      if (s->next >= 0) {
        s->next = -1;
        s->ready = true;
      } else {
        s->fed += s->taking;
        counters_.prompt_tokens += static_cast<int64_t>(s->taking);
        s->taking = 0;
        s->ready = s->fed == s->job.prompt.size();
      }
    }
  }
  for (auto& s : slots_)
    if (!s->finished && s->ready) Emit(*s);
}

// Samples the sequence's next token and streams it, as Generate's decode loop does (EOS and stop
// ids end it unshown; a completed stop string ends it with the text before it).
void Scheduler::Emit(Slot& s) {
  s.ready = false;
  Result<int32_t> next = s.session->Sample(s.job.sampling);
  if (!next.ok()) return Finish(s, StopReason::kLength, next.error().message);
  const std::vector<int32_t>& eos = model_.special_tokens().eos_ids;
  if (std::find(eos.begin(), eos.end(), *next) != eos.end()) return Finish(s, StopReason::kEos);
  if (std::find(s.job.stop_ids.begin(), s.job.stop_ids.end(), *next) != s.job.stop_ids.end())
    return Finish(s, StopReason::kStopToken);
  ++s.generated;
  ++counters_.generated_tokens;
  SeqEvent ev;
  ev.index = s.job.index;
  ev.has_token = true;
  ev.token.id = *next;
  ev.token_text = s.decoder->Peek(*next);
  if (s.job.logprobs) {
    const std::vector<float>& logits = s.session->logits();
    FillLogprobs(logits.data(), static_cast<int64_t>(logits.size()), s.job.top_logprobs, *s.decoder, ev.token);
  }
  ev.token.text = s.stop->Push(s.decoder->Push(*next));
  ev.step = counters_.steps.load();
  s.job.channel->Push(std::move(ev));
  if (s.stop->stopped()) return Finish(s, StopReason::kStopString);
  if (s.generated >= s.job.max_tokens) return Finish(s, StopReason::kLength);
  if (s.session->position() + 1 > s.session->capacity()) return Finish(s, StopReason::kContextFull);
  s.next = *next;
}

void Scheduler::Finish(Slot& s, StopReason reason, const std::string& error) {
  SeqEvent ev;
  ev.index = s.job.index;
  ev.done = true;
  ev.reason = reason;
  ev.error = error;
  if (s.decoder && error.empty() && reason != StopReason::kStopString && reason != StopReason::kCancelled) {
    ev.token.text = s.stop->Push(s.decoder->Flush());
    ev.token.text += s.stop->Flush();
    if (s.stop->stopped()) ev.reason = StopReason::kStopString;
  }
  ev.prompt_tokens = static_cast<int64_t>(s.job.prompt.size());
  ev.cached_tokens = s.cached;
  ev.completion_tokens = s.generated;
  ev.step = counters_.steps.load();
  // The context (prompt and every token run) serves later requests that start the same way;
  // stored before the request hears it ended, so its client's next request finds it.
  if (s.session && s.session->position() > 0) (void)cache_.Insert(*s.session);
  s.job.channel->Push(std::move(ev));
  s.finished = true;
}

}  // namespace nibble::serve
