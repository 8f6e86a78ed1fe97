// What generation reports besides text: why it stopped (StopReason), and per token its id, the
// text it releases and its log-probabilities (TokenEvent), for a streaming server (OpenAI
// `logprobs` / `top_logprobs`, `finish_reason`) or a binding. Prompt-token log-probabilities
// (OpenAI completions' `echo` with `logprobs`) over the same types.
//
// Log-probabilities are of the model's raw distribution: the log-softmax of the logits the
// model gives, before the repeat penalty, temperature and the top-k / top-p / min-p cuts (vLLM's
// default, "raw_logprobs"), so they do not depend on the sampling options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nibble/error.h>
#include <nibble/model.h>

namespace nibble {

/// Why a Generate call stopped.
enum class StopReason {
  kLength,       // max_new_tokens generated
  kEos,          // the model's EOS token (not shown)
  kStopToken,    // one of GenerateOptions::stop_ids (not shown)
  kStopString,   // one of GenerateOptions::stop completed (it and what follows not shown)
  kContextFull,  // the session's context (ctx_size) filled up
  kCancelled,    // GenerateOptions::cancel was cancelled after tokens were streamed
  kCallback,     // the callback returned false
};

/// nibble's name, as the CLI prints it: "max_new_tokens", "eos", "stop_token", "stop_string",
/// "context_full", "cancelled", "callback".
const char* StopReasonName(StopReason r);
/// OpenAI's `finish_reason` (llama-server's and vLLM's too): "length" for kLength and
/// kContextFull, "stop" for kEos, kStopToken, kStopString and kCallback, "abort" (vLLM's) for
/// kCancelled.
const char* FinishReason(StopReason r);

/// OpenAI's limit on top_logprobs, which GenerateOptions and PromptLogprobs apply.
inline constexpr int kMaxTopLogprobs = 20;

/// One candidate token and its log-probability.
struct TokenLogprob {
  int32_t id = 0;
  std::string text;  // the text not shown yet if this token came next: its own text, after the
                     // bytes of a character still incomplete before it (incomplete ones as U+FFFD)
  float logprob = 0;
};

/// One token, generated (Generate's token callback) or of a prompt (PromptLogprobs).
struct TokenEvent {
  /// The id of an event that carries no token: Generate's last event when text was held back to
  /// the end (an incomplete character as U+FFFD, or the start of a stop string that never completed).
  static constexpr int32_t kNoToken = -1;
  int32_t id = kNoToken;
  /// The text this token releases: whole UTF-8 characters, "" while a character's bytes are
  /// incomplete or (Generate) while it may be the start of a stop string; the held-back text comes
  /// with a later event. The texts of all events concatenate to the text stream.
  std::string text;
  /// log p(id | what precedes it); 0 when not computed (GenerateOptions::logprobs off), NaN for a
  /// prompt's first token (nothing precedes it; OpenAI's null).
  float logprob = 0;
  /// The top_logprobs most likely tokens, most likely first (ties: the lower id first).
  std::vector<TokenLogprob> top_logprobs;
};

/// The log-probabilities of every token of `ids` run as one sequence from position 0, each given
/// the tokens before it (Model::Logits), with the `top_n` most likely tokens at each position;
/// entry i is ids[i] with its text as streamed after ids[0, i). The first entry has logprob NaN
/// and no top_logprobs. Errors: top_n outside [0, kMaxTopLogprobs], no ids, Model::Logits' errors
/// (kCancelled when `cancel` is cancelled).
Result<std::vector<TokenEvent>> PromptLogprobs(const Model& model, const std::vector<int32_t>& ids, int top_n,
                                               const CancellationToken* cancel = nullptr);

}  // namespace nibble
