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

#include <nibble/cancel.h>
#include <nibble/error.h>
#include <nibble/generate.h>
#include <nibble/model.h>

namespace nibble {

/// Applied in this order: repeat penalty (llama.cpp's), presence and frequency penalties
/// (OpenAI's), temperature, top-k, top-p, min-p; the cuts act on the tempered probabilities.
struct SamplingOptions {
  float temperature = 0.8f;    // 0 = greedy (the argmax after the penalties)
  int64_t top_k = 40;          // 0 = no top-k
  float top_p = 0.95f;         // 1 = no nucleus cut
  float min_p = 0.0f;          // keep tokens with p >= min_p · p_max; 0 = off (llama.cpp's default: 0.05)
  float repeat_penalty = 1.0f; // > 1 divides a positive logit / multiplies a negative one of every
                               // token among the last repeat_last_n of the context; 1 = off
  int64_t repeat_last_n = 64;  // tokens the penalty looks back over (prompt included); 0 = off, -1 = all
  // OpenAI's penalties over the output so far (the generated tokens, not the prompt; Session::Sample
  // says which): logit[t] -= presence_penalty · (count[t] > 0) + frequency_penalty · count[t].
  // In [-2, 2]; 0 = off; negative values favour repeats.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;

  bool operator==(const SamplingOptions&) const = default;
};

/// The rules every front end applies (CLI flags, a server's request fields): temperature >= 0
/// and finite, top_k >= 0, top_p in (0, 1], min_p in [0, 1], repeat_penalty > 0 and finite,
/// repeat_last_n >= -1, presence_penalty and frequency_penalty in [-2, 2] (OpenAI's range).
/// Cheap and model-free, so a front end checks before loading anything. The error names the
/// field as `name_prefix` + field name ("--temperature" for the CLI's "--"; the bare names are
/// llama.cpp server's request fields) with the value and the allowed range.
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
  /// Token ids run instead of tokenizing `prompt` (a PrefixCache hit's remainder, a ChatTurns
  /// turn, pre-tokenized input such as OpenAI's token-array prompt): exactly these ids, BOS only
  /// where the caller put it. Empty = tokenize `prompt`. Errors: both set, an id outside the
  /// vocabulary (names its index).
  std::vector<int32_t> prompt_ids;
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  int64_t warmup = 0;  // untimed prompt prefills before the timed run (benchmarks)
  /// More ids that end generation as EOS does, neither run nor shown (a chat template's
  /// end-of-turn token); StopReason::kStopToken.
  std::vector<int32_t> stop_ids;
  /// Stop strings (OpenAI's `stop`, `generate --stop`, a chat template's end-of-turn markers):
  /// text that may be the start of one is held back; the first to complete ends generation
  /// (StopReason::kStopString) and neither it nor what follows is shown (StopStringMatcher).
  std::vector<std::string> stop;
  /// Compute TokenEvent::logprob of each generated token (OpenAI's `logprobs`), and its
  /// top_logprobs most likely alternatives, in [0, kMaxTopLogprobs]; raw logprobs (generate.h).
  bool logprobs = false;
  int top_logprobs = 0;
  /// Checked before every token and, through the forward pass, before every layer of the prefill
  /// and of each step (<nibble/cancel.h>). Cancelled before the first token is streamed: Error
  /// kCancelled; after: Ok with StopReason::kCancelled. Either way the session stays at its last
  /// complete position (a cancelled prefill leaves it where it was). Must outlive the call.
  const CancellationToken* cancel = nullptr;
};

/// ValidateSamplingOptions, then max_new_tokens >= 0, warmup >= 0, no empty stop string,
/// top_logprobs in [0, kMaxTopLogprobs] and only with logprobs, not both prompt and prompt_ids
/// (named the same way; the ids' range needs the model: Generate checks it).
Status ValidateGenerateOptions(const GenerateOptions& options, std::string_view name_prefix = "");

struct GenerateStats {
  int64_t prompt_tokens = 0;     // incl. BOS
  int64_t generated_tokens = 0;  // tokens streamed (an EOS or stop id is not one)
  double prefill_seconds = 0;    // prompt forward pass up to the first sampled token
  double decode_seconds = 0;     // all later tokens
  /// Positions the context held when Generate began (earlier turns, a Fork, a PrefixCache hit):
  /// reused rather than computed. prompt_tokens counts only the new ones, so OpenAI's
  /// usage.prompt_tokens is prompt_tokens + cached_tokens and its cached_tokens this.
  int64_t cached_tokens = 0;
  StopReason stop_reason = StopReason::kLength;
  std::string stop_string;       // the stop string that matched (kStopString), else ""
  int32_t stop_token = -1;       // the EOS or stop id that ended generation (kEos, kStopToken), else -1
};

/// Called with each new piece of UTF-8 text as soon as it is complete; returning false stops
/// generation after that piece (StopReason::kCallback).
using TextCallback = std::function<bool(std::string_view)>;
/// Called with each generated token (generate.h), returning false stops generation after it
/// (StopReason::kCallback). A last event with id TokenEvent::kNoToken carries text held back to
/// the end, if any (not after kCallback or kStopString); its return value is ignored.
using TokenCallback = std::function<bool(const TokenEvent&)>;

class Session;

/// One sequence's share of a batched step (StepBatch): `tokens` appended to `session` at its
/// position. One token is a decode step; more are a prompt or a chunk of one (chunked prefill,
/// as vLLM schedules a long prompt over several steps).
struct BatchItem {
  Session* session = nullptr;
  std::vector<int32_t> tokens;
};

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
  /// another call running on the session (see the file comment), and for every call below;
  /// kCancelled when `cancel` is cancelled (checked before each layer). On any error the
  /// session is unchanged: position, tokens and the previous logits stay.
  Status Prefill(const std::vector<int32_t>& tokens, const CancellationToken* cancel = nullptr);
  /// Appends one token (a decode step); same errors.
  Status Step(int32_t token, const CancellationToken* cancel = nullptr);
  /// Samples the next token from the current logits (greedy when temperature is 0); the repeat
  /// penalty looks back over the tokens the context holds. The presence and frequency penalties
  /// count the session's output: the tokens appended since the last prompt, each of them the token
  /// Sample had just returned (Step after Sample, as Generate and a server's decode step run it).
  /// Appending anything else (a prompt, a chunk of one, another token), a Fork and
  /// KeepCommonPrefix start a new, empty output; Truncate cuts it. The sampler is seeded with
  /// options.seed at the first call and again whenever the options change.
  /// Errors: no logits yet (nothing prefilled), invalid options (names the field).
  Result<int32_t> Sample(const SamplingOptions& options);
  /// Logits of the last position, [vocab_size] (empty before the first Prefill); the reference
  /// is valid until the next call that changes the session.
  const std::vector<float>& logits() const;
  /// The same buffer, shared (nullptr before the first Prefill): a reader keeps it alive and
  /// unchanged after later calls, without a copy. A forward pass writes the next logits into the
  /// session's buffer only while no one else holds it, else into a fresh one (a Fork shares it
  /// too). Read it, as logits(), between calls.
  std::shared_ptr<const std::vector<float>> shared_logits() const;
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
  /// The token ids the context holds, [position()] (a token Generate streamed but has not run yet
  /// is not among them).
  const std::vector<int32_t>& tokens() const;

  // Prefix reuse (llama-server's cache_prompt, vLLM's automatic prefix caching). The K/V of a
  // position depends only on the ids up to it, so a context holding the first k ids of a prompt
  // needs only the rest prefilled. Both calls below leave a caller something to continue from:
  // either a token still to run, or the logits of the prompt's last position.

  /// Positions of this context a prompt of `tokens` can keep: the longest common prefix of
  /// tokens() and `tokens`, but at most tokens.size() - 1 unless the context holds exactly
  /// `tokens` with its logits (the prompt's last position must be run to sample after it).
  /// Changes nothing.
  int64_t CommonPrefix(const std::vector<int32_t>& tokens) const;
  /// Keeps CommonPrefix(tokens) positions and drops the rest (Truncate; the logits are kept only
  /// when nothing is dropped), and forgets a token Generate left to run (the caller's `tokens`
  /// say what follows). Returns the positions kept: prefill tokens[kept..] to continue.
  /// Errors: another call running on the session.
  Result<int64_t> KeepCommonPrefix(const std::vector<int32_t>& tokens);

  /// A new Session over the same Model holding the first `position` positions of this one
  /// (-1 = all): a plain copy of their K/V rows (not shared or copy-on-write: the fork and this
  /// session change independently), their token ids, and, when position == position(), the
  /// logits (shared, as shared_logits) and a token Generate left to run. The sampler starts fresh. The fork has this
  /// session's capacity, threads and max_memory. Memory: KvBytes of `position` positions rounded
  /// up to a block of 256 (kv_bytes() of the fork), plus the logits. Const and read-only: several
  /// threads may fork one session at once while none changes it (a fork while a call runs on
  /// the session is refused).
  /// Errors: position outside [0, position()] (and not -1); the fork's KV above max_memory
  /// (kResourceExhausted) or the available memory, as Create.
  Result<std::unique_ptr<Session>> Fork(int64_t position = -1) const;
  /// The same with the fork's own options, as Create takes them (context 0 =
  /// DefaultContextSize); context must hold `position` (-1 = position()) positions.
  Result<std::unique_ptr<Session>> Fork(int64_t position, const SessionOptions& options) const;

 private:
  friend Status StepBatch(const std::vector<BatchItem>& items, const CancellationToken* cancel);
  friend Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TokenCallback& on_token);
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// One step of several sessions over the same Model together, as a server runs its open requests
/// (continuous batching: vLLM's scheduler step, llama.cpp's llama_decode of a multi-sequence
/// batch): decode tokens of some sessions and prefill chunks of others in one call. Each
/// items[i].session appends items[i].tokens at its own position and gets the logits of its last
/// one, as Prefill (or Step) would give it; every projection runs once over all the step's rows,
/// so each weight is read once per step. Runs with the first session's thread setting and in its
/// workspace.
///
/// Tolerance: a session's results do not depend on what else is in the batch beyond the
/// kernels' summation order for the step's row count M (the sum of every item's tokens).
/// Attention, RoPE and the norms are computed per sequence exactly as alone, and at the same M
/// (the session's rows first) its logits are bit-equal whatever the other items are. The
/// projections switch kernels at M thresholds (int4: the fused kernel below
/// Int4Linear::kDequantGemmMinRows = 64 rows, dequantize + dense GEMM from there; bf16
/// activations: the bf16 matmul from Int4Linear::Bf16MatmulMinRows; bf16 dense weights: the GEMV
/// at 1 row, row blocks below 16, the dense GEMM from there; fp32: the dense GEMM's blocking), so
/// against its lone run (Prefill / Step) a session's logits may differ by fp32 rounding: about
/// 1e-6 of the logits' scale with an fp32 KV cache. With the bf16 KV cache (the default) such a
/// difference can also flip the bf16 rounding of a cached K/V value (one bf16 ulp, 2^-8 of it;
/// likewise an activation with bf16 activations): up to about 1e-3 of the scale on the test
/// model, 3e-3 with bf16 activations on its int4 quantization. Greedy tokens are the same (the
/// tests require it; a near tie between two logits could still break either way).
///
/// Errors, with no session changed: no items; a null session; a session listed twice; sessions
/// over different Models; a session another call is running on; an item without tokens; a token outside the vocabulary or positions
/// past a session's context (named "sequence i" by item index). kCancelled when `cancel` is
/// cancelled (checked before each layer): every session keeps its last complete position, tokens
/// and logits.
Status StepBatch(const std::vector<BatchItem>& items, const CancellationToken* cancel = nullptr);

/// One decode step of several sessions (StepBatch with one token each): sessions[i] appends
/// tokens[i]. Errors as StepBatch's, and sizes that differ.
Status StepBatch(const std::vector<Session*>& sessions, const std::vector<int32_t>& tokens);

/// Tokenizes `options.prompt` (BOS only on an empty session) or takes `options.prompt_ids`
/// as they are, appends them to the session, then
/// samples up to max_new_tokens, streaming each token's event (the prompt is not echoed). The
/// last token streamed is left for the next call to run first (so the context holds every token
/// shown) unless generation ended at EOS or a stop id. GenerateStats::cached_tokens is the
/// session's position when the call began, whichever way the prompt came. The session is held
/// for the whole call: calls into it from `on_token`, or from other threads meanwhile, are
/// refused (and change nothing). Errors: prompt not UTF-8, a prompt_ids id outside the
/// vocabulary, prompt longer than the remaining context, empty prompt without a BOS token,
/// invalid options, the session in use by another call, kCancelled.
Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TokenCallback& on_token);
/// The same streaming text only: each non-empty TokenEvent::text.
Result<GenerateStats> Generate(Session& session, const GenerateOptions& options, const TextCallback& on_text);
/// The same on a fresh session over `model` sized for the prompt and max_new_tokens.
Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options, const TextCallback& on_text);
Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options, const TokenCallback& on_token);
/// The prompt's ids as Generate(model, ...) runs them, checked against the model's context: a
/// front end that echoes the prompt calls it first. Errors: prompt not UTF-8, more tokens than
/// max_position_embeddings (names both).
Result<std::vector<int32_t>> PromptTokens(const Model& model, const std::string& prompt);

}  // namespace nibble
