// Evaluation of loaded models: perplexity with the GPTQ/AWQ-paper protocol (SPEC §6.1) and the
// comparison of quantized models with their float base on the same windows (perplexity, mean
// KL divergence, top-1 agreement: llama.cpp's --kl-divergence measures), with llama-perplexity's
// uncertainties. The float model's logits can be saved once (`save_logits`, a documented binary
// file: docs/FORMATS.md "Saved logits") and read back instead of re-running it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nibble/cancel.h>
#include <nibble/error.h>
#include <nibble/model.h>

namespace nibble {

/// The saved-logits file looked for in a directory given as a saved-logits path.
inline constexpr char kSavedLogitsFileName[] = "nibble-logits.bin";

/// The saved-logits file `path` names: `path` itself when it is a regular file, path/
/// nibble-logits.bin when `path` is a directory holding one, else "" (e.g. a model directory).
std::string FindSavedLogits(const std::string& path);

/// The model-free rules of the window protocol (SPEC §6.1), for a front end to check before it
/// loads anything: seq_len >= 2 (0 too when `zero_is_default`: perplexity's min(2048, context)),
/// max_windows >= 0. Errors name "--seq_len" / "--max_windows" with the value. That seq_len fits
/// the model's context is CheckWindowFits's, once it is loaded.
Status ValidateWindowOptions(int64_t seq_len, int64_t max_windows, bool zero_is_default);

/// Ok when a window of seq_len tokens fits `model` (2 .. max_position_embeddings; 0 is refused:
/// resolve perplexity's default first): for a front end to check before it sizes the window's KV
/// cache. The runs check it too.
Status CheckWindowFits(const Model& model, int64_t seq_len);

struct PerplexityOptions {
  int64_t seq_len = 2048;
  int64_t max_windows = 0;  // 0 = every full window
  int threads = 0;          // 0 = the calling thread's setting
  std::function<void(int64_t done, int64_t total)> progress;
  /// After each window: (windows done, total, perplexity over the windows so far).
  std::function<void(int64_t done, int64_t total, double ppl)> on_window;
  /// When set, the logits of every scored position are written to this file (or, for an
  /// existing directory, to DIR/nibble-logits.bin) for a later kl_divergence_base run.
  std::string save_logits;
  /// How save_logits stores each position (docs/FORMATS.md "Saved logits"): "fp32" (the raw
  /// logits), "uint16" (every log-prob in 16 bits, as llama.cpp's KL-divergence base) or "topk:K"
  /// (the K largest log-probs and the rest's mass). Reading detects the form.
  std::string save_logits_format = "fp32";
  /// When set and cancelled (from any thread): the call stops within one decoder layer of the
  /// window it is running (and between windows) with ErrorCode::kCancelled; no save_logits file
  /// is left behind.
  const CancellationToken* cancel = nullptr;
};

/// Error (naming --save_logits_format, the value and the accepted forms) unless `format` is one
/// of the save_logits_format values.
Status CheckSavedLogitsFormat(const std::string& format);

/// Result of the "GPTQ/AWQ paper" protocol (SPEC §6.1), with the protocol's numbers.
struct PerplexityReport {
  double ppl = 0, mean_nll = 0;
  double ppl_stderr = 0;  // standard error of ppl: ppl * sqrt(var(token NLL) / (N - 1)), N scored tokens
  int64_t seq_len = 0, n_tokens = 0, n_windows = 0, n_windows_available = 0, scored_tokens = 0,
          dropped_tokens = 0;
  bool bos_prepended = false;
  double seconds = 0;
  double tokens_per_second = 0;  // forward throughput (tokens run / seconds)
};

/// Tokenizes `text` once and evaluates non-overlapping windows. Errors: text not UTF-8, fewer
/// tokens than one window, seq_len out of range.
Result<PerplexityReport> EvaluatePerplexity(const Model& model, const std::string& text,
                                            const PerplexityOptions& options);

/// The report as a JSON object: ppl, ppl_stderr, mean_nll, seq_len, tokens, windows,
/// windows_available, scored_tokens, dropped_tokens, bos_prepended (`nibble perplexity --json`'s
/// "perplexity" object; timing is left to the caller).
std::string PerplexityJson(const PerplexityReport& report);

/// Options of CompareModels: the perplexity protocol (SPEC §6.1) shared by every model.
struct CompareOptions {
  int64_t seq_len = 512;
  int64_t max_windows = 0;  // 0 = every full window
  int threads = 0;          // 0 = the calling thread's setting
  std::function<void(int64_t done, int64_t total)> progress;
  /// After each window: (windows done, total, the first model's perplexity so far).
  std::function<void(int64_t done, int64_t total, double ppl)> on_window;
  /// CompareModels only: the base model's logits are also written here, in this form (see
  /// PerplexityOptions).
  std::string save_logits;
  std::string save_logits_format = "fp32";
  /// As PerplexityOptions::cancel: checked before each decoder layer of every model's window.
  const CancellationToken* cancel = nullptr;
};

/// One model compared with the base (float) model on the same windows.
struct ComparisonRow {
  std::string dir;
  PerplexityReport perplexity;
  double mean_kld = 0;        // mean over scored positions of KL(P_base || P_model), nats
  double mean_kld_error = 0;  // standard error of mean_kld: sqrt(var / (N - 1))
  double median_kld = 0, kld_p90 = 0, kld_p99 = 0, kld_p999 = 0;  // quantiles of the per-position KL
  double max_kld = 0;
  double top1_agreement = 0;  // fraction of positions whose argmax equals the base's ("same top p")
  double top1_agreement_error = 0;  // sqrt(p (1 - p) / (N - 1))
};

/// One compared model as a JSON object: dir, ppl, ppl_stderr, mean_nll, kld {mean, mean_stderr,
/// median, p90, p99, p99_9, max}, same_top_p, same_top_p_stderr.
std::string ComparisonRowJson(const ComparisonRow& row);

struct ComparisonReport {
  PerplexityReport base;  // base.seconds: the whole comparison (base and every model), wall time
  std::string base_logits_file;  // the saved logits read (CompareWithSavedLogits), else ""
  std::vector<ComparisonRow> rows;
};

/// Tokenizes `text` with the base model's tokenizer once and runs the base and every model on
/// the same windows (the measures of llama.cpp's --kl-divergence, over all scored positions).
/// Errors: no models, vocab sizes that differ, text not UTF-8, fewer tokens than one window,
/// seq_len out of range.
Result<ComparisonReport> CompareModels(const Model& base, const std::vector<const Model*>& models, const std::string& text,
                                       const CompareOptions& options);

/// CompareModels with the base's logits read from a saved-logits file (`logits_path`: a file or a
/// directory holding nibble-logits.bin) instead of running a base model; the text is tokenized
/// with the first model's tokenizer. Errors name the file and what differs from this run: not a
/// saved-logits file, truncated, vocab size, seq_len, token count or a token id (another text or
/// tokenizer), fewer windows saved than evaluated.
Result<ComparisonReport> CompareWithSavedLogits(const std::string& logits_path, const std::vector<const Model*>& models,
                                                const std::string& text, const CompareOptions& options);

}  // namespace nibble
