// Generation state over a loaded Model: a Session owns a KV cache, the logits of its last
// position and a sampler, and offers prefill / step / sample plus a streaming Generate whose
// callback can stop it.
//
// Threads. The Model is shared read-only: any number of Sessions over one Model may run at once,
// each from its own thread, with the results each gets alone. Each Session owns everything its
// calls write: the KV cache, the logits, the sampler, and the workspace of its forward passes
// (activations sized by the tokens of a call, the dequantized weight tiles of the int4 and bf16
// linears; scratch_bytes()), so memory follows the sessions, not the threads that ran them; a
// batched step (StepBatch) runs in its first session's workspace. A Session runs one call at a
// time: Prefill, Step, Sample, Truncate, PromptPositions, Generate and StepBatch refuse, with an
// error naming the call in progress, to start on a session another call is running on (from
// another thread, or from inside that session's Generate callback: the callback may read the
// session's position() and logits() and may use other sessions, but not call into its own).
// A caller must not destroy a Session, or read its accessors from another thread, while a call
// runs on it; the Model must outlive its Sessions.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nibble/error.h>
#include <nibble/model.h>

namespace nibble {

/// Applied in this order: repeat penalty (llama.cpp's), temperature, top-k, top-p, min-p; the
/// cuts act on the tempered probabilities.
struct SamplingOptions {
  float temperature = 0.8f;    // 0 = greedy (the argmax after the repeat penalty)
  int64_t top_k = 40;          // 0 = no top-k
  float top_p = 0.95f;         // 1 = no nucleus cut
  float min_p = 0.0f;          // keep tokens with p >= min_p · p_max; 0 = off (llama.cpp's default: 0.05)
  float repeat_penalty = 1.0f; // > 1 divides a positive logit / multiplies a negative one of every
                               // token among the last repeat_last_n of the context; 1 = off
  int64_t repeat_last_n = 64;  // tokens the penalty looks back over (prompt included); 0 = off, -1 = all
  uint64_t seed = 0;
};

/// The rules every front end applies (CLI flags, a server's request fields): temperature >= 0
/// and finite, top_k >= 0, top_p in (0, 1], min_p in [0, 1], repeat_penalty > 0 and finite,
/// repeat_last_n >= -1. Cheap and model-free, so a front end checks before loading anything. The
/// error names the field as `name_prefix` + field name ("--temperature" for the CLI's "--";
/// the bare names are llama.cpp server's request fields) with the value and the allowed range.
Status ValidateSamplingOptions(const SamplingOptions& options, std::string_view name_prefix = "");

struct SessionOptions {
  int64_t context = 0;     // ctx_size: KV cache positions; 0 = DefaultContextSize(model)
  int threads = 0;         // threads of this session's compute; 0 = the calling thread's setting
  int64_t max_memory = 0;  // bytes the KV cache may take at full context; 0 = DefaultMaxMemory(),
                           // < 0 = no limit
};

/// ctx_size when none is asked for: min(max_position_embeddings, 8192), a bounded context as
/// llama.cpp's default.
int64_t DefaultContextSize(const Model& model);
/// Bytes of a KV cache of `context` positions in the model's kv_dtype:
/// 2 (K and V) · num_hidden_layers · num_key_value_heads · head_dim · context · (2 bf16 | 4 fp32).
int64_t KvCacheBytes(const Model& model, int64_t context);
/// 90 % of the available memory (MemAvailable, lowered to what RLIMIT_AS leaves; base/memory.h);
/// -1 when unknown.
int64_t DefaultMaxMemory();
/// A memory size as --max_memory takes it: a byte count with an optional suffix, KB MB GB TB
/// (powers of 1000) or KiB MiB GiB TiB (powers of 1024), case-insensitive, e.g. "16GB", "512MiB".
/// Errors name the text.
Result<int64_t> ParseMemorySize(const std::string& text);
/// Ok when KvCacheBytes(model, context) fits max_memory (0 = DefaultMaxMemory(); < 0 or unknown:
/// no limit). Else ErrorCode::kResourceExhausted with the context, the bytes needed and allowed.
Status CheckKvMemory(const Model& model, int64_t context, int64_t max_memory);

struct GenerateOptions {
  std::string prompt;  // may be empty: generation starts from BOS alone (on an empty session)
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  int64_t warmup = 0;  // untimed prompt prefills before the timed run (benchmarks)
  /// More ids that end generation as EOS does, neither run nor shown (a chat template's
  /// end-of-turn token); stop_reason "stop_token".
  std::vector<int32_t> stop_ids;
};

/// ValidateSamplingOptions, then max_new_tokens >= 0 and warmup >= 0 (named the same way).
Status ValidateGenerateOptions(const GenerateOptions& options, std::string_view name_prefix = "");

struct GenerateStats {
  int64_t prompt_tokens = 0;     // incl. BOS
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;    // prompt forward pass up to the first sampled token
  double decode_seconds = 0;     // all later tokens
  std::string stop_reason;       // "max_new_tokens" | "eos" | "stop_token" | "context_full" | "callback"
};

/// Called with each new piece of UTF-8 text as soon as it is complete; returning false stops
/// generation after that piece (stop_reason "callback").
using TextCallback = std::function<bool(std::string_view)>;

class Session {
 public:
  /// The KV cache is sized for options.context but its storage grows in blocks of 256 positions
  /// as it fills. Errors: context < 0 or above max_position_embeddings; the full context's KV
  /// bytes above max_memory (kResourceExhausted, CheckKvMemory);
  /// the cache and its RoPE tables above the available memory (names both).
  static Result<std::unique_ptr<Session>> Create(const Model& model, const SessionOptions& options = SessionOptions());
  ~Session();

  /// Appends `tokens` at the current position and computes the logits of the last one.
  /// Errors: no tokens, a token id outside the vocabulary, the context full (names the limit);
  /// and for every call below, another call running on the session (see the file comment).
  Status Prefill(const std::vector<int32_t>& tokens);
  /// Appends one token (a decode step); same errors.
  Status Step(int32_t token);
  /// Samples the next token from the current logits (greedy when temperature is 0); the repeat
  /// penalty looks back over the tokens the context holds. The sampler is seeded with
  /// options.seed at the first call and again whenever the options change.
  /// Errors: no logits yet (nothing prefilled), invalid options (names the field).
  Result<int32_t> Sample(const SamplingOptions& options);
  /// Logits of the last position, [vocab_size] (empty before the first Prefill).
  const std::vector<float>& logits() const;
  /// Positions filled, and the cache's capacity.
  int64_t position() const;
  int64_t capacity() const;
  /// Positions a Generate with `prompt` fills before sampling: the prompt's tokens (BOS only on
  /// an empty session) and a token an earlier Generate left to run first. Errors: Generate's.
  Result<int64_t> PromptPositions(const std::string& prompt) const;
  /// Bytes the KV cache holds now (it grows with position(); KvCacheBytes(model, capacity()) at most).
  int64_t kv_bytes() const;
  /// Bytes of scratch the session holds between calls: its forward passes' workspace, kept up
  /// to 16 MiB (what decode steps reuse); a longer call's is freed when the call returns.
  int64_t scratch_bytes() const;
  /// Drops every position from `position` on (0 empties the context; the logits are cleared).
  /// Errors: another call is running on the session.
  Status Truncate(int64_t position);
  const Model& model() const;

 private:
  friend Status StepBatch(const std::vector<Session*>& sessions, const std::vector<int32_t>& tokens);
  friend Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TextCallback& on_text);
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// One decode step of several sessions over the same Model together (batched decode, as a server
/// runs its open requests): sessions[i] appends tokens[i] at its own position and gets its new
/// logits, as Step would, but every weight is read once for the whole batch. Runs with the first
/// session's thread setting and in its workspace. Errors (no session changes): no sessions, sizes
/// that differ, a session listed twice or over another Model, a session another call is running
/// on, and any session's Step error (named by index).
Status StepBatch(const std::vector<Session*>& sessions, const std::vector<int32_t>& tokens);

/// Tokenizes `options.prompt` (BOS only on an empty session), appends it to the session, then
/// samples up to max_new_tokens, streaming the text (the prompt is not echoed). The session is
/// held for the whole call: calls into it from `on_text`, or from other threads meanwhile, are
/// refused (and change nothing). Errors: prompt not UTF-8, prompt longer than the remaining
/// context, empty prompt without a BOS token, the session in use by another call.
Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TextCallback& on_text);
/// The same on a fresh session over `model` sized for the prompt and max_new_tokens.
Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options, const TextCallback& on_text);
/// The prompt's ids as Generate(model, ...) runs them, checked against the model's context: a
/// front end that echoes the prompt calls it first. Errors: prompt not UTF-8, more tokens than
/// max_position_embeddings (names both).
Result<std::vector<int32_t>> PromptTokens(const Model& model, const std::string& prompt);

}  // namespace nibble
