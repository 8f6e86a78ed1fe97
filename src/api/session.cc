// Public API: Session (KV cache, logits, sampler) and the streaming Generate over it.
#include <nibble/session.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include <nibble/stop_strings.h>

#include "api/logprobs.h"
#include "api/model_impl.h"
#include "model/sampler.h"
#include "tokenizer/stream_decoder.h"

namespace nibble {

namespace {

// Scratch a session keeps between calls: a decode step needs a few hundred KB; a long prompt's
// activations (tokens x widths, tens to hundreds of MB) are freed when its Prefill returns.
constexpr size_t kSessionScratchKeep = size_t{16} << 20;

// Holds a session (or one session of a batch) for one call: `flag` names the call running on it.
// A second call meanwhile, from another thread or from inside Generate's callback, finds the flag
// taken and is refused with an error instead of racing on the KV cache.
class SessionUse {
 public:
  SessionUse(std::atomic<const char*>& flag, const char* call) : flag_(&flag) {
    const char* none = nullptr;
    held_ = flag.compare_exchange_strong(none, call, std::memory_order_acquire);
    if (!held_) holder_ = none;
  }
  ~SessionUse() {
    if (held_) flag_->store(nullptr, std::memory_order_release);
  }
  SessionUse(const SessionUse&) = delete;
  SessionUse& operator=(const SessionUse&) = delete;
  bool held() const { return held_; }
  // The refusal of `call` (`who` names the session in a batch, else empty).
  Error Refusal(const std::string& call, const std::string& who = "") const {
    return MakeError(call, ": ", who.empty() ? "the session" : who, " is in use by another call (",
                     holder_ != nullptr ? holder_ : "?",
                     "): a Session runs one call at a time; use one Session per thread, and no calls on a "
                     "session from inside its Generate callback");
  }

 private:
  std::atomic<const char*>* flag_;
  const char* holder_ = nullptr;
  bool held_ = false;
};

}  // namespace

struct Session::Impl {
  const Model* model = nullptr;
  int threads = 0;
  int64_t max_memory = 0;  // SessionOptions::max_memory (a Fork checks its KV against it)
  KvCache cache;  // with the workspace of this session's forward passes (model/workspace.h)
  std::vector<int32_t> tokens;  // the ids in the cache, [cache.length] (the repeat penalty's history)
  // [vocab] of the last position, null before the first Prefill; shared with readers
  // (shared_logits) and forks, so a forward pass writes into OutputLogits(), never into a buffer
  // someone else holds.
  std::shared_ptr<std::vector<float>> logits;
  std::optional<Sampler> sampler;
  SamplingOptions sampler_options;
  // The output the presence / frequency penalties count: tokens[output_start..]. `sampled` is the
  // token Sample returned last (-1 once anything was appended): appended alone next, it extends
  // the output; anything else appended is a prompt, after which a new output starts.
  int64_t output_start = 0;
  int32_t sampled = -1;
  // A token Generate sampled last and streamed but did not run (the next call runs it first, so
  // the context holds every token shown).
  std::vector<int32_t> unfed;
  // The public call running on this session, nullptr when none (SessionUse).
  std::atomic<const char*> in_use{nullptr};

  bool has_logits() const { return logits != nullptr && !logits->empty(); }
  // The buffer the next forward pass writes its [vocab] logits into: the current one when this
  // session holds the only reference (reused: decode steps allocate nothing), else a fresh one.
  std::shared_ptr<std::vector<float>> OutputLogits(size_t vocab) {
    if (logits != nullptr && logits.use_count() == 1) {
      // The last other holder's release (its reads) happens before the writes that follow.
      std::atomic_thread_fence(std::memory_order_acquire);
      logits->resize(vocab);
      return logits;
    }
    return std::make_shared<std::vector<float>>(vocab);
  }

  // The calls themselves, run while the caller holds in_use.
  Status Prefill(const std::vector<int32_t>& tokens, const CancellationToken* cancel);
  Result<int32_t> Sample(const SamplingOptions& o);
  void Truncate(int64_t position);
  // Bookkeeping after `added` were appended (the cache holds them).
  void Appended(const std::vector<int32_t>& added) {
    if (added.size() != 1 || added[0] != sampled) output_start = cache.length;
    sampled = -1;
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::Create(const Model& model, const SessionOptions& options) {
  NIBBLE_RETURN_IF_ERROR(CheckThreads(options.threads));
  const int64_t max_pos = model.info().max_position_embeddings;
  if (options.context < 0 || options.context > max_pos)
    return MakeError("session context ", options.context, " is outside [0, max_position_embeddings = ", max_pos, "]");
  const int64_t context = options.context > 0 ? options.context : DefaultContextSize(model);
  NIBBLE_RETURN_IF_ERROR(CheckKvMemory(model, context, options.max_memory));
  auto impl = std::make_unique<Impl>();
  impl->model = &model;
  impl->threads = options.threads;
  impl->max_memory = options.max_memory;
  NIBBLE_ASSIGN_OR_RETURN(impl->cache, ModelAccess::llama(model).NewCache(context));
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Status Session::Impl::Prefill(const std::vector<int32_t>& new_tokens, const CancellationToken* cancel) {
  if (new_tokens.empty()) return MakeError("Prefill: no tokens");
  ScopedThreads scoped(threads);
  const LlamaModel& llama = ModelAccess::llama(*model);
  // Forward writes the logits only once every layer ran: on an error the old ones stay.
  std::shared_ptr<std::vector<float>> out = OutputLogits(static_cast<size_t>(llama.config().vocab_size));
  const Status s = llama.Forward(new_tokens.data(), static_cast<int64_t>(new_tokens.size()), cache, out->data(),
                                 false, cancel);
  cache.workspace.Trim(kSessionScratchKeep);
  if (s.ok()) {
    tokens.insert(tokens.end(), new_tokens.begin(), new_tokens.end());
    logits = std::move(out);
  }
  tokens.resize(static_cast<size_t>(cache.length));
  if (s.ok()) Appended(new_tokens);
  return s;
}

Status Session::Prefill(const std::vector<int32_t>& tokens, const CancellationToken* cancel) {
  SessionUse use(impl_->in_use, "Prefill");
  if (!use.held()) return use.Refusal("Prefill");
  return impl_->Prefill(tokens, cancel);
}

Status Session::Step(int32_t token, const CancellationToken* cancel) {
  SessionUse use(impl_->in_use, "Step");
  if (!use.held()) return use.Refusal("Step");
  return impl_->Prefill({token}, cancel);
}

Status StepBatch(const std::vector<BatchItem>& items, const CancellationToken* cancel) {
  if (items.empty()) return MakeError("StepBatch: no sequences");
  const Model* model = items[0].session != nullptr ? items[0].session->impl_->model : nullptr;
  std::vector<int32_t> tokens;
  std::vector<int64_t> query_start_loc = {0};
  std::vector<KvCache*> caches;
  for (size_t i = 0; i < items.size(); ++i) {
    const Session* s = items[i].session;
    if (s == nullptr) return MakeError("StepBatch: sequence ", i, ": the session is null");
    for (size_t o = 0; o < i; ++o)
      if (items[o].session == s)
        return MakeError("StepBatch: sequences ", o, " and ", i, " list the same session (they would share one KV cache)");
    if (s->impl_->model != model) return MakeError("StepBatch: sequence ", i, " runs another model than sequence 0");
    if (items[i].tokens.empty()) return MakeError("StepBatch: sequence ", i, ": no tokens");
    tokens.insert(tokens.end(), items[i].tokens.begin(), items[i].tokens.end());
    query_start_loc.push_back(static_cast<int64_t>(tokens.size()));
    caches.push_back(&s->impl_->cache);
  }
  std::vector<std::unique_ptr<SessionUse>> uses;  // every session held for the whole step
  for (size_t i = 0; i < items.size(); ++i) {
    uses.push_back(std::make_unique<SessionUse>(items[i].session->impl_->in_use, "StepBatch"));
    if (!uses.back()->held()) return uses.back()->Refusal("StepBatch", "session " + std::to_string(i));
  }
  ScopedThreads threads(items[0].session->impl_->threads);
  const LlamaModel& llama = ModelAccess::llama(*model);
  const int64_t vocab = llama.config().vocab_size, batch = static_cast<int64_t>(items.size());
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  const Status st =
      llama.ForwardBatch(tokens.data(), query_start_loc.data(), batch, caches.data(), logits.data(), false, cancel);
  caches[0]->workspace.Trim(kSessionScratchKeep);
  if (!st.ok()) return st.error().WithContext("StepBatch");
  for (size_t i = 0; i < items.size(); ++i) {
    Session::Impl& s = *items[i].session->impl_;
    const auto row = logits.begin() + static_cast<int64_t>(i) * vocab;
    std::shared_ptr<std::vector<float>> out = s.OutputLogits(static_cast<size_t>(vocab));
    std::copy(row, row + vocab, out->begin());
    s.logits = std::move(out);
    s.tokens.insert(s.tokens.end(), items[i].tokens.begin(), items[i].tokens.end());
    s.Appended(items[i].tokens);
  }
  return Status::Ok();
}

Status StepBatch(const std::vector<Session*>& sessions, const std::vector<int32_t>& tokens) {
  if (sessions.empty()) return MakeError("StepBatch: no sessions");
  if (sessions.size() != tokens.size())
    return MakeError("StepBatch: ", sessions.size(), " sessions but ", tokens.size(), " tokens");
  std::vector<BatchItem> items(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) items[i] = {sessions[i], {tokens[i]}};
  return StepBatch(items);
}

namespace {
// "-1", "0.95", "nan": a flag's value as the user typed it, not std::to_string's "-1.000000".
std::string Shown(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}
}  // namespace

Status ValidateSamplingOptions(const SamplingOptions& o, std::string_view prefix) {
  const std::string p(prefix);
  // Written as !(in range) so that NaN fails every check.
  if (!(o.temperature >= 0 && std::isfinite(o.temperature)))
    return MakeError(p, "temperature ", Shown(o.temperature), " must be >= 0 (0 = greedy) and finite");
  if (o.top_k < 0) return MakeError(p, "top_k ", o.top_k, " must be >= 0 (0 = all tokens)");
  if (!(o.top_p > 0 && o.top_p <= 1)) return MakeError(p, "top_p ", Shown(o.top_p), " must be in (0, 1] (1 = off)");
  if (!(o.min_p >= 0 && o.min_p <= 1)) return MakeError(p, "min_p ", Shown(o.min_p), " must be in [0, 1] (0 = off)");
  if (!(o.repeat_penalty > 0 && std::isfinite(o.repeat_penalty)))
    return MakeError(p, "repeat_penalty ", Shown(o.repeat_penalty), " must be > 0 (1 = off) and finite");
  if (o.repeat_last_n < -1) return MakeError(p, "repeat_last_n ", o.repeat_last_n, " must be >= -1 (-1 = all, 0 = off)");
  if (!(o.presence_penalty >= -2 && o.presence_penalty <= 2))
    return MakeError(p, "presence_penalty ", Shown(o.presence_penalty), " must be in [-2, 2] (0 = off)");
  if (!(o.frequency_penalty >= -2 && o.frequency_penalty <= 2))
    return MakeError(p, "frequency_penalty ", Shown(o.frequency_penalty), " must be in [-2, 2] (0 = off)");
  return Status::Ok();
}

Status ValidateGenerateOptions(const GenerateOptions& o, std::string_view prefix) {
  NIBBLE_RETURN_IF_ERROR(ValidateSamplingOptions(o.sampling, prefix));
  const std::string p(prefix);
  if (o.max_new_tokens < 0) return MakeError(p, "max_new_tokens ", o.max_new_tokens, " must be >= 0");
  if (o.warmup < 0) return MakeError(p, "warmup ", o.warmup, " must be >= 0");
  for (size_t i = 0; i < o.stop.size(); ++i)
    if (o.stop[i].empty()) return MakeError(p, "stop: empty stop string (entry ", i, ")");
  if (o.top_logprobs < 0 || o.top_logprobs > kMaxTopLogprobs)
    return MakeError(p, "top_logprobs ", o.top_logprobs, " must be in [0, ", kMaxTopLogprobs, "]");
  if (o.top_logprobs > 0 && !o.logprobs)
    return MakeError(p, "top_logprobs ", o.top_logprobs, " needs ", p, "logprobs");
  if (!o.prompt.empty() && !o.prompt_ids.empty())
    return MakeError(p, "prompt and ", p, "prompt_ids are both given (", o.prompt_ids.size(), " ids): give one");
  return Status::Ok();
}

Result<int32_t> Session::Sample(const SamplingOptions& o) {
  SessionUse use(impl_->in_use, "Sample");
  if (!use.held()) return use.Refusal("Sample");
  return impl_->Sample(o);
}

Result<int32_t> Session::Impl::Sample(const SamplingOptions& o) {
  if (!has_logits()) return MakeError("Sample: no logits yet (prefill a prompt first)");
  NIBBLE_RETURN_IF_ERROR(ValidateSamplingOptions(o));
  if (!sampler || !(o == sampler_options)) {
    sampler.emplace(o);
    sampler_options = o;
  }
  const std::span<const int32_t> context(tokens);
  const size_t start = std::min(static_cast<size_t>(output_start), tokens.size());
  sampled = sampler->Sample(logits->data(), static_cast<int64_t>(logits->size()), context, context.subspan(start));
  return sampled;
}

const std::vector<float>& Session::logits() const {
  static const std::vector<float> kNone;
  return impl_->logits != nullptr ? *impl_->logits : kNone;
}
std::shared_ptr<const std::vector<float>> Session::shared_logits() const { return impl_->logits; }
int64_t Session::position() const { return impl_->cache.length; }
int64_t Session::capacity() const { return impl_->cache.capacity; }
int64_t Session::kv_bytes() const { return impl_->cache.bytes(); }
int64_t Session::scratch_bytes() const { return impl_->cache.workspace.bytes(); }
const Model& Session::model() const { return *impl_->model; }

Status Session::Truncate(int64_t position) {
  SessionUse use(impl_->in_use, "Truncate");
  if (!use.held()) return use.Refusal("Truncate");
  impl_->Truncate(position);
  return Status::Ok();
}

void Session::Impl::Truncate(int64_t position) {
  cache.length = std::clamp<int64_t>(position, 0, cache.length);
  tokens.resize(static_cast<size_t>(cache.length));
  logits = nullptr;  // readers keep theirs
  unfed.clear();
  output_start = std::min(output_start, cache.length);
  sampled = -1;
}

const std::vector<int32_t>& Session::tokens() const { return impl_->tokens; }

int64_t Session::CommonPrefix(const std::vector<int32_t>& tokens) const {
  const std::vector<int32_t>& held = impl_->tokens;
  const auto n = static_cast<int64_t>(std::min(held.size(), tokens.size()));
  int64_t k = 0;
  while (k < n && held[static_cast<size_t>(k)] == tokens[static_cast<size_t>(k)]) ++k;
  const auto want = static_cast<int64_t>(tokens.size());
  const bool has_last_logits = k == want && k == position() && impl_->has_logits();
  return has_last_logits ? k : std::min(k, std::max<int64_t>(want - 1, 0));
}

Result<int64_t> Session::KeepCommonPrefix(const std::vector<int32_t>& tokens) {
  SessionUse use(impl_->in_use, "KeepCommonPrefix");
  if (!use.held()) return use.Refusal("KeepCommonPrefix");
  const int64_t keep = CommonPrefix(tokens);
  if (keep < position()) impl_->Truncate(keep);
  impl_->unfed.clear();
  impl_->output_start = keep;  // what is kept is the caller's prompt
  impl_->sampled = -1;
  return keep;
}

Result<std::unique_ptr<Session>> Session::Fork(int64_t position) const {
  SessionOptions o;
  o.context = capacity();
  o.threads = impl_->threads;
  o.max_memory = impl_->max_memory;
  return Fork(position, o);
}

Result<std::unique_ptr<Session>> Session::Fork(int64_t position, const SessionOptions& options) const {
  // Forks only read this session, so several may run at once; a call that changes it may not.
  if (const char* holder = impl_->in_use.load(std::memory_order_acquire); holder != nullptr)
    return MakeError("Fork: the session is in use by another call (", holder, "): fork it between calls");
  NIBBLE_RETURN_IF_ERROR(CheckThreads(options.threads));
  const KvCache& src = impl_->cache;
  if (position == -1) position = src.length;
  if (position < 0 || position > src.length)
    return MakeError("Fork: position ", position, " is outside [0, ", src.length, "] (the positions this session holds; -1 = all)");
  const int64_t context = options.context > 0 ? options.context : DefaultContextSize(*impl_->model);
  if (context < position)
    return MakeError("Fork: context ", context, " cannot hold the ", position, " positions to keep");
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<Session> fork, Create(*impl_->model, options));
  Impl& dst = *fork->impl_;
  if (dst.cache.bf16 != src.bf16 || dst.cache.row != src.row)
    return MakeErrorCode(ErrorCode::kInternal, "Fork: the model's KV layout changed since this session was made");
  // K/V are [allocated, row] per layer; positions [0, position) are the first position·row values.
  dst.cache.Reserve(position);
  const auto n = static_cast<std::ptrdiff_t>(position * src.row);
  auto copy = [n](const auto& from, auto& to) {
    for (size_t l = 0; l < from.size(); ++l) std::copy(from[l].begin(), from[l].begin() + n, to[l].begin());
  };
  copy(src.k, dst.cache.k);
  copy(src.v, dst.cache.v);
  copy(src.k16, dst.cache.k16);
  copy(src.v16, dst.cache.v16);
  dst.cache.length = position;
  dst.output_start = position;  // a fork starts a new output, as its sampler starts fresh
  dst.tokens.assign(impl_->tokens.begin(), impl_->tokens.begin() + static_cast<std::ptrdiff_t>(position));
  if (position == src.length) {
    dst.logits = impl_->logits;  // shared: neither session writes into it while the other holds it
    dst.unfed = impl_->unfed;
  }
  return fork;
}

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}


// The ids of `prompt_ids`, checked against the vocabulary (Prefill would reject them too, but
// without saying which entry).
Result<std::vector<int32_t>> CheckedPromptIds(const Model& model, const std::vector<int32_t>& ids) {
  const int64_t vocab = model.info().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return MakeError("prompt_ids[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab, ")");
  return ids;
}

// The prompt's ids for `session`: BOS (the tokenizer's special tokens) only at position 0.
Result<std::vector<int32_t>> PromptIds(const Session& session, const std::string& prompt) {
  const Tokenizer& tok = ModelAccess::tokenizer(session.model());
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(prompt, session.position() == 0));
  if (ids.empty() && session.position() == 0)
    return MakeError("empty prompt and the tokenizer adds no BOS token: nothing to start from");
  return ids;
}

// The text streams through a StreamDecoder (whole characters) and a StopStringMatcher (held back
// while it may start a stop string). End of generation: what both still hold goes out in a last
// event without a token, unless the callback or a stop string ended it.
class TextStream {
 public:
  TextStream(const Tokenizer& tok, const std::vector<int32_t>& context, const std::vector<std::string>& stops)
      : decoder_(tok, context), stop_(stops) {}
  const StreamDecoder& decoder() const { return decoder_; }
  std::string Push(int32_t id) { return stop_.Push(decoder_.Push(id)); }
  const StopStringMatcher& stop() const { return stop_; }
  void Finish(const TokenCallback& on_token) {
    TokenEvent last;
    last.text = stop_.Push(decoder_.Flush());
    last.text += stop_.Flush();
    if (!last.text.empty()) on_token(last);
  }

 private:
  StreamDecoder decoder_;
  StopStringMatcher stop_;
};

// Samples and streams until max_new_tokens, EOS or a stop id, a stop string, a full context, a
// cancel or the callback says stop. A cancel before the first token is an error; later it ends
// generation (kCancelled) with the last streamed token left unfed, as every other end but EOS.
// `s` is the session's Impl, held by Generate (a template: the type's name is private).
template <class SessionImpl>
Status DecodeLoop(SessionImpl& s, const GenerateOptions& o, const std::vector<int32_t>& context,
                  const TokenCallback& on_token, GenerateStats& stats) {
  std::vector<int32_t>& unfed = s.unfed;
  const Tokenizer& tok = ModelAccess::tokenizer(*s.model);
  TextStream stream(tok, context, o.stop);
  auto end = [&](StopReason r) {
    stats.stop_reason = r;
    if (r != StopReason::kCallback && r != StopReason::kStopString) stream.Finish(on_token);
    if (stream.stop().stopped()) {  // also when the text flushed at the end completed a stop string
      stats.stop_reason = StopReason::kStopString;
      stats.stop_string = stream.stop().matched();
    }
    return Status::Ok();
  };
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    if (o.cancel != nullptr && o.cancel->cancelled())
      return i == 0 ? CheckCancelled(o.cancel, "generation before the first token") : end(StopReason::kCancelled);
    NIBBLE_ASSIGN_OR_RETURN(const int32_t next, s.Sample(o.sampling));
    const bool eos = std::find(tok.eos_ids().begin(), tok.eos_ids().end(), next) != tok.eos_ids().end();
    if (eos || std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
      stats.stop_token = next;
      return end(eos ? StopReason::kEos : StopReason::kStopToken);
    }
    ++stats.generated_tokens;
    TokenEvent ev;
    ev.id = next;
    if (o.logprobs)
      FillLogprobs(s.logits->data(), static_cast<int64_t>(s.logits->size()), o.top_logprobs, stream.decoder(), ev);
    ev.text = stream.Push(next);
    const bool go_on = on_token(ev);
    if (stream.stop().stopped() || !go_on || i + 1 == o.max_new_tokens || s.cache.length >= s.cache.capacity) {
      unfed = {next};
      if (stream.stop().stopped()) return end(StopReason::kStopString);
      return end(!go_on ? StopReason::kCallback : i + 1 < o.max_new_tokens ? StopReason::kContextFull : StopReason::kLength);
    }
    if (const Status st = s.Prefill({next}, o.cancel); !st.ok()) {
      unfed = {next};
      if (st.error().code != ErrorCode::kCancelled) return st;
      return end(StopReason::kCancelled);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<int64_t> Session::PromptPositions(const std::string& prompt) const {
  SessionUse use(impl_->in_use, "PromptPositions");
  if (!use.held()) return use.Refusal("PromptPositions");
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, PromptIds(*this, prompt));
  return static_cast<int64_t>(ids.size() + impl_->unfed.size());
}

Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TokenCallback& on_token) {
  SessionUse use(session.impl_->in_use, "Generate");
  if (!use.held()) return use.Refusal("Generate");
  NIBBLE_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, options.prompt_ids.empty()
                                                            ? PromptIds(session, options.prompt)
                                                            : CheckedPromptIds(session.model(), options.prompt_ids));
  Session::Impl& impl = *session.impl_;
  GenerateStats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  stats.cached_tokens = session.position();
  prompt.insert(prompt.begin(), impl.unfed.begin(), impl.unfed.end());
  if (session.position() + static_cast<int64_t>(prompt.size()) > session.capacity())
    return MakeError("prompt is ", stats.prompt_tokens, " tokens, longer than the remaining context (",
                     session.capacity() - session.position(), " of ", session.capacity(), " positions; max_position_embeddings ",
                     session.model().info().max_position_embeddings, ")");
  if (options.max_new_tokens == 0) return stats;
  const int64_t p0 = session.position();
  for (int64_t i = 0; i < options.warmup; ++i) {  // first calls pay one-time GEMM kernel generation
    NIBBLE_RETURN_IF_ERROR(impl.Prefill(prompt, options.cancel));
    impl.cache.length = p0;
    impl.tokens.resize(static_cast<size_t>(p0));
  }
  // An error before the first token streamed leaves the session as it was before the call.
  const std::vector<int32_t> unfed0 = std::move(impl.unfed);
  const std::shared_ptr<std::vector<float>> logits0 = impl.logits;  // the prefill writes a fresh buffer
  const int64_t output_start0 = impl.output_start;
  const int32_t sampled0 = impl.sampled;
  impl.unfed.clear();
  const auto t0 = std::chrono::steady_clock::now();
  Status st = prompt.empty() ? Status::Ok() : impl.Prefill(prompt, options.cancel);
  const auto t1 = std::chrono::steady_clock::now();
  stats.prefill_seconds = Seconds(t0, t1);
  if (st.ok()) st = DecodeLoop(impl, options, prompt, on_token, stats);
  stats.decode_seconds = Seconds(t1, std::chrono::steady_clock::now());
  if (!st.ok() && stats.generated_tokens == 0) {
    impl.cache.length = p0;
    impl.tokens.resize(static_cast<size_t>(p0));
    impl.unfed = unfed0;
    impl.logits = logits0;
    impl.output_start = output_start0;
    impl.sampled = sampled0;
  }
  if (!st.ok()) return st.error();
  return stats;
}

Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TextCallback& on_text) {
  return Generate(session, options, [&on_text](const TokenEvent& ev) { return ev.text.empty() || on_text(ev.text); });
}

Result<std::vector<int32_t>> PromptTokens(const Model& model, const std::string& prompt) {
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ModelAccess::tokenizer(model).Encode(prompt));
  const int64_t max_pos = model.info().max_position_embeddings;
  if (static_cast<int64_t>(ids.size()) > max_pos)
    return MakeError("prompt is ", ids.size(), " tokens, longer than max_position_embeddings (", max_pos, ")");
  return ids;
}

Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options, const TextCallback& on_text) {
  return Generate(model, options, [&on_text](const TokenEvent& ev) { return ev.text.empty() || on_text(ev.text); });
}

Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options, const TokenCallback& on_token) {
  NIBBLE_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, options.prompt_ids.empty() ? PromptTokens(model, options.prompt)
                                                                                  : CheckedPromptIds(model, options.prompt_ids));
  const int64_t max_pos = model.info().max_position_embeddings;
  SessionOptions so;
  so.context = std::max<int64_t>(1, std::min<int64_t>(max_pos, static_cast<int64_t>(prompt.size()) + options.max_new_tokens));
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Create(model, so));
  return Generate(*session, options, on_token);
}

}  // namespace nibble
