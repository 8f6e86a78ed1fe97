// Public API: Session (KV cache, logits, sampler) and the streaming Generate over it.
#include <nibble/session.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

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
  KvCache cache;  // with the workspace of this session's forward passes (model/workspace.h)
  std::vector<int32_t> tokens;  // the ids in the cache, [cache.length] (the repeat penalty's history)
  std::vector<float> logits;  // [vocab] of the last position, empty before the first Prefill
  std::optional<Sampler> sampler;
  SamplingOptions sampler_options;
  // A token Generate sampled last and streamed but did not run (the next call runs it first, so
  // the context holds every token shown).
  std::vector<int32_t> unfed;
  // The public call running on this session, nullptr when none (SessionUse).
  std::atomic<const char*> in_use{nullptr};

  // The calls themselves, run while the caller holds in_use.
  Status Prefill(const std::vector<int32_t>& tokens);
  Result<int32_t> Sample(const SamplingOptions& o);
  void Truncate(int64_t position);
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::Create(const Model& model, const SessionOptions& options) {
  const int64_t max_pos = model.info().max_position_embeddings;
  if (options.context < 0 || options.context > max_pos)
    return MakeError("session context ", options.context, " is outside [0, max_position_embeddings = ", max_pos, "]");
  const int64_t context = options.context > 0 ? options.context : DefaultContextSize(model);
  NIBBLE_RETURN_IF_ERROR(CheckKvMemory(model, context, options.max_memory));
  auto impl = std::make_unique<Impl>();
  impl->model = &model;
  impl->threads = options.threads;
  NIBBLE_ASSIGN_OR_RETURN(impl->cache, ModelAccess::llama(model).NewCache(context));
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Status Session::Impl::Prefill(const std::vector<int32_t>& new_tokens) {
  if (new_tokens.empty()) return MakeError("Prefill: no tokens");
  ScopedThreads scoped(threads);
  const LlamaModel& llama = ModelAccess::llama(*model);
  logits.resize(static_cast<size_t>(llama.config().vocab_size));
  const Status s =
      llama.Forward(new_tokens.data(), static_cast<int64_t>(new_tokens.size()), cache, logits.data(), false);
  cache.workspace.Trim(kSessionScratchKeep);
  if (s.ok()) tokens.insert(tokens.end(), new_tokens.begin(), new_tokens.end());
  else logits.clear();
  tokens.resize(static_cast<size_t>(cache.length));
  return s;
}

Status Session::Prefill(const std::vector<int32_t>& tokens) {
  SessionUse use(impl_->in_use, "Prefill");
  if (!use.held()) return use.Refusal("Prefill");
  return impl_->Prefill(tokens);
}

Status Session::Step(int32_t token) {
  SessionUse use(impl_->in_use, "Step");
  if (!use.held()) return use.Refusal("Step");
  return impl_->Prefill({token});
}

Status StepBatch(const std::vector<Session*>& sessions, const std::vector<int32_t>& tokens) {
  if (sessions.empty()) return MakeError("StepBatch: no sessions");
  if (sessions.size() != tokens.size())
    return MakeError("StepBatch: ", sessions.size(), " sessions but ", tokens.size(), " tokens");
  std::vector<KvCache*> caches;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (sessions[i] == nullptr) return MakeError("StepBatch: session ", i, " is null");
    if (sessions[i]->impl_->model != sessions[0]->impl_->model)
      return MakeError("StepBatch: session ", i, " runs another model than session 0");
    for (size_t o = 0; o < i; ++o)
      if (sessions[o] == sessions[i])
        return MakeError("StepBatch: sessions ", o, " and ", i, " share one KV cache (one session listed twice)");
    caches.push_back(&sessions[i]->impl_->cache);
  }
  std::vector<std::unique_ptr<SessionUse>> uses;  // every session held for the whole step
  for (size_t i = 0; i < sessions.size(); ++i) {
    uses.push_back(std::make_unique<SessionUse>(sessions[i]->impl_->in_use, "StepBatch"));
    if (!uses.back()->held()) return uses.back()->Refusal("StepBatch", "session " + std::to_string(i));
  }
  ScopedThreads threads(sessions[0]->impl_->threads);
  const LlamaModel& llama = ModelAccess::llama(*sessions[0]->impl_->model);
  const int64_t vocab = llama.config().vocab_size, batch = static_cast<int64_t>(sessions.size());
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  const Status st = llama.DecodeBatch(tokens.data(), batch, caches.data(), logits.data());
  caches[0]->workspace.Trim(kSessionScratchKeep);
  NIBBLE_RETURN_IF_ERROR(st);
  for (size_t i = 0; i < sessions.size(); ++i) {
    Session::Impl& s = *sessions[i]->impl_;
    s.logits.assign(logits.begin() + static_cast<int64_t>(i) * vocab, logits.begin() + static_cast<int64_t>(i + 1) * vocab);
    s.tokens.push_back(tokens[i]);
  }
  return Status::Ok();
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
  return Status::Ok();
}

Status ValidateGenerateOptions(const GenerateOptions& o, std::string_view prefix) {
  NIBBLE_RETURN_IF_ERROR(ValidateSamplingOptions(o.sampling, prefix));
  const std::string p(prefix);
  if (o.max_new_tokens < 0) return MakeError(p, "max_new_tokens ", o.max_new_tokens, " must be >= 0");
  if (o.warmup < 0) return MakeError(p, "warmup ", o.warmup, " must be >= 0");
  return Status::Ok();
}

Result<int32_t> Session::Sample(const SamplingOptions& o) {
  SessionUse use(impl_->in_use, "Sample");
  if (!use.held()) return use.Refusal("Sample");
  return impl_->Sample(o);
}

Result<int32_t> Session::Impl::Sample(const SamplingOptions& o) {
  if (logits.empty()) return MakeError("Sample: no logits yet (prefill a prompt first)");
  NIBBLE_RETURN_IF_ERROR(ValidateSamplingOptions(o));
  const SamplingOptions& cur = sampler_options;
  if (!sampler || o.temperature != cur.temperature || o.top_k != cur.top_k || o.top_p != cur.top_p ||
      o.min_p != cur.min_p || o.repeat_penalty != cur.repeat_penalty || o.repeat_last_n != cur.repeat_last_n ||
      o.seed != cur.seed) {
    sampler.emplace(o);
    sampler_options = o;
  }
  return sampler->Sample(logits.data(), static_cast<int64_t>(logits.size()), tokens);
}

const std::vector<float>& Session::logits() const { return impl_->logits; }
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
  logits.clear();
  unfed.clear();
}

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}


// The prompt's ids for `session`: BOS (the tokenizer's special tokens) only at position 0.
Result<std::vector<int32_t>> PromptIds(const Session& session, const std::string& prompt) {
  const Tokenizer& tok = ModelAccess::tokenizer(session.model());
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(prompt, session.position() == 0));
  if (ids.empty() && session.position() == 0)
    return MakeError("empty prompt and the tokenizer adds no BOS token: nothing to start from");
  return ids;
}

// Samples and streams until max_new_tokens, EOS or a stop id, a full context or the callback says
// stop. `s` is the session's Impl, held by Generate (a template: the type's name is private).
template <class SessionImpl>
Status DecodeLoop(SessionImpl& s, const GenerateOptions& o, const std::vector<int32_t>& context,
                  const TextCallback& on_text, GenerateStats& stats) {
  const Tokenizer& tok = ModelAccess::tokenizer(*s.model);
  StreamDecoder stream(tok, context);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    NIBBLE_ASSIGN_OR_RETURN(const int32_t next, s.Sample(o.sampling));
    const bool eos = std::find(tok.eos_ids().begin(), tok.eos_ids().end(), next) != tok.eos_ids().end();
    if (eos || std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
      stats.stop_reason = eos ? "eos" : "stop_token";
      if (const std::string rest = stream.Flush(); !rest.empty()) on_text(rest);
      return Status::Ok();
    }
    ++stats.generated_tokens;
    const std::string text = stream.Push(next);
    const bool go_on = text.empty() || on_text(text);
    if (!go_on || i + 1 == o.max_new_tokens || s.cache.length >= s.cache.capacity) {
      if (!go_on) stats.stop_reason = "callback";
      else if (i + 1 < o.max_new_tokens) stats.stop_reason = "context_full";
      s.unfed = {next};
      if (const std::string rest = stream.Flush(); go_on && !rest.empty()) on_text(rest);
      return Status::Ok();
    }
    NIBBLE_RETURN_IF_ERROR(s.Prefill({next}));
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

Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TextCallback& on_text) {
  SessionUse use(session.impl_->in_use, "Generate");
  if (!use.held()) return use.Refusal("Generate");
  NIBBLE_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptIds(session, options.prompt));
  Session::Impl& impl = *session.impl_;
  GenerateStats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  stats.stop_reason = "max_new_tokens";
  prompt.insert(prompt.begin(), impl.unfed.begin(), impl.unfed.end());
  if (session.position() + static_cast<int64_t>(prompt.size()) > session.capacity())
    return MakeError("prompt is ", stats.prompt_tokens, " tokens, longer than the remaining context (",
                     session.capacity() - session.position(), " of ", session.capacity(), " positions; max_position_embeddings ",
                     session.model().info().max_position_embeddings, ")");
  if (options.max_new_tokens == 0) return stats;
  const int64_t p0 = session.position();
  for (int64_t i = 0; i < options.warmup; ++i) {  // first calls pay one-time GEMM kernel generation
    NIBBLE_RETURN_IF_ERROR(impl.Prefill(prompt));
    impl.cache.length = p0;
    impl.tokens.resize(static_cast<size_t>(p0));
  }
  impl.unfed.clear();
  const auto t0 = std::chrono::steady_clock::now();
  if (!prompt.empty()) NIBBLE_RETURN_IF_ERROR(impl.Prefill(prompt));
  const auto t1 = std::chrono::steady_clock::now();
  stats.prefill_seconds = Seconds(t0, t1);
  NIBBLE_RETURN_IF_ERROR(DecodeLoop(impl, options, prompt, on_text, stats));
  stats.decode_seconds = Seconds(t1, std::chrono::steady_clock::now());
  return stats;
}

Result<std::vector<int32_t>> PromptTokens(const Model& model, const std::string& prompt) {
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ModelAccess::tokenizer(model).Encode(prompt));
  const int64_t max_pos = model.info().max_position_embeddings;
  if (static_cast<int64_t>(ids.size()) > max_pos)
    return MakeError("prompt is ", ids.size(), " tokens, longer than max_position_embeddings (", max_pos, ")");
  return ids;
}

Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options, const TextCallback& on_text) {
  NIBBLE_RETURN_IF_ERROR(ValidateGenerateOptions(options));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptTokens(model, options.prompt));
  const int64_t max_pos = model.info().max_position_embeddings;
  SessionOptions so;
  so.context = std::max<int64_t>(1, std::min<int64_t>(max_pos, static_cast<int64_t>(prompt.size()) + options.max_new_tokens));
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Create(model, so));
  return Generate(*session, options, on_text);
}

}  // namespace nibble
