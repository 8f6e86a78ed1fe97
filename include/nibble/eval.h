// Evaluation of loaded models: perplexity with the GPTQ/AWQ-paper protocol (SPEC §6.1) and the
// comparison of quantized models with their float base on the same windows (perplexity, mean
// KL divergence, top-1 agreement: llama.cpp's --kl-divergence measures).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nibble/error.h>
#include <nibble/model.h>

namespace nibble {

struct PerplexityOptions {
  int64_t seq_len = 2048;
  int64_t max_windows = 0;  // 0 = every full window
  int threads = 0;          // 0 = the calling thread's setting
  std::function<void(int64_t done, int64_t total)> progress;
};

/// Result of the "GPTQ/AWQ paper" protocol (SPEC §6.1), with the protocol's numbers.
struct PerplexityReport {
  double ppl = 0, mean_nll = 0;
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

/// Options of CompareModels: the perplexity protocol (SPEC §6.1) shared by every model.
struct CompareOptions {
  int64_t seq_len = 512;
  int64_t max_windows = 0;  // 0 = every full window
  int threads = 0;          // 0 = the calling thread's setting
  std::function<void(int64_t done, int64_t total)> progress;
};

/// One model compared with the base (float) model on the same windows.
struct ComparisonRow {
  std::string dir;
  PerplexityReport perplexity;
  double mean_kld = 0;        // mean over scored positions of KL(P_base || P_model), nats
  double max_kld = 0;
  double top1_agreement = 0;  // fraction of positions whose argmax equals the base's
};

struct ComparisonReport {
  PerplexityReport base;
  std::vector<ComparisonRow> rows;
};

/// Tokenizes `text` with the base model's tokenizer once and runs the base and every model on
/// the same windows (the measures of llama.cpp's --kl-divergence, over all scored positions).
/// Errors: no models, vocab sizes that differ, text not UTF-8, fewer tokens than one window,
/// seq_len out of range.
Result<ComparisonReport> CompareModels(const Model& base, const std::vector<const Model*>& models, const std::string& text,
                                       const CompareOptions& options);

}  // namespace nibble
