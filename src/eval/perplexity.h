// Perplexity under the "GPTQ/AWQ paper" protocol (SPEC §6.1): tokenize the whole text once (one
// BOS at the very start when the tokenizer adds one), cut into non-overlapping windows of seq_len
// tokens, drop the remainder, run each window independently (fresh KV cache, no BOS inserted),
// score positions 1..seq_len-1 of each window, PPL = exp(mean over windows of the window mean NLL).
// Its standard error is llama-perplexity's: PPL * sqrt(var(token NLL) / (N - 1)) over the N scored
// tokens (the delta method on exp of a mean), var = mean(NLL^2) - mean(NLL)^2.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/result.h"
#include "eval/saved_logits.h"
#include "model/llama.h"

namespace nibble {

struct PerplexityProtocol {
  int64_t seq_len = 2048;
  int64_t max_windows = 0;  // 0 = all windows
  /// Called after each window with (windows done, windows total).
  std::function<void(int64_t, int64_t)> progress;
  /// Called after each window with (windows done, windows total, PPL over the windows so far).
  std::function<void(int64_t, int64_t, double)> on_window;
  /// When set: the scored logits rows are written to this saved-logits file (eval/saved_logits.h)
  /// in `save_logits_format`.
  std::string save_logits;
  SavedLogitsFormat save_logits_format;
  /// Checked before each window and, through LlamaModel::Forward, before each decoder layer:
  /// cancelled, the evaluation returns kCancelled and the save_logits file is not committed.
  const CancellationToken* cancel = nullptr;
};

struct PerplexityResult {
  double ppl = 0;
  double mean_nll = 0;           // nats per scored token
  int64_t n_tokens = 0;          // tokens of the whole text (incl. BOS)
  int64_t n_windows = 0;         // windows evaluated
  int64_t n_windows_available = 0;
  int64_t scored_tokens = 0;     // n_windows * (seq_len - 1)
  int64_t dropped_tokens = 0;    // remainder after the last full window
  double ppl_stderr = 0;         // standard error of ppl (llama-perplexity's estimate)
  std::vector<double> window_mean_nll;
  double nll_sq_sum = 0;         // sum over scored tokens of NLL^2 (for ppl_stderr)
};

/// Fills mean_nll, ppl and ppl_stderr from window_mean_nll, nll_sq_sum and scored_tokens.
void FinishPerplexity(PerplexityResult& r);

/// Ok when a window's mean NLL is finite; otherwise an error naming `what` ("the model",
/// "quantized model 2") and the 1-based window: non-finite logits make every perplexity and KL
/// number meaningless, so they are never printed as a result.
Status CheckWindowNll(double mean_nll, int64_t window, const std::string& what);

/// Ok when a window's logits [seq_len, vocab] fit the available memory (base/memory.h); the error
/// names --seq_len and vocab_size.
Status CheckWindowMemory(int64_t seq_len, int64_t vocab);

/// Ok when a window of seq_len tokens fits `model`: 2 .. max_position_embeddings. `whose` names
/// the model in the error ("the model", "the base model", "a model").
Status CheckWindowFits(const LlamaModel& model, int64_t seq_len, const char* whose);

/// Ok when n_tokens hold one window of seq_len; else an error with the counts (an empty text: the
/// BOS alone, if any).
Status CheckOneWindow(int64_t n_tokens, int64_t seq_len);

/// "perplexity before window 3 of 40" (0-based `w`): what a cancellation between windows names.
std::string WindowName(int64_t w, int64_t n_windows);

/// PPL over the first windows of `r` so far (the running value after each window).
double RunningPerplexity(const PerplexityResult& r);

/// Evaluates `tokens` (already tokenized whole text). Errors: seq_len < 2 or larger than
/// max_position_embeddings, fewer tokens than one window (names the counts), forward errors.
Result<PerplexityResult> EvaluatePerplexityTokens(const LlamaModel& model, const std::vector<int32_t>& tokens,
                                                  const PerplexityProtocol& protocol);

/// Mean negative log-likelihood of targets[i] under logits row i, i < n (log-softmax in double).
/// When `sq_sum` is given, the sum of the squared per-token NLLs is added to it.
double MeanNll(const float* logits, int64_t vocab, const int32_t* targets, int64_t n, double* sq_sum = nullptr);

}  // namespace nibble
