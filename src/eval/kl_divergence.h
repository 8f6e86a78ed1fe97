// Distance of a quantized model's next-token distribution from the float model's, the measures
// llama.cpp's `perplexity --kl-divergence` reports: mean KL(P_fp || P_q) over all scored positions
// and top-1 agreement (share of positions whose argmax equals the float model's). On small models
// perplexity moves by fractions of a percent between methods; mean KLD is what ranks them.
//
// Protocol: the perplexity protocol of eval/perplexity.h (SPEC §6.1) — the same windows, and the
// same scored positions 0..seq_len-2 of every window (each predicting the next token); every model
// sees the same tokens. Non-goal: llama.cpp's "second half of each window only" variant.
// Uncertainties as llama-perplexity prints them: mean KLD ± sqrt(var / (N - 1)) over the N
// positions, same top-1 p ± sqrt(p (1 - p) / (N - 1)); quantiles interpolate linearly between the
// two nearest ranks of the sorted per-position values (rank q (N - 1)).
#pragma once

#include <cstdint>
#include <vector>

#include "base/result.h"
#include "eval/perplexity.h"
#include "eval/saved_logits.h"
#include "model/llama.h"

namespace nibble {

/// KL(P || Q) in nats of the softmax distributions of two logit rows of length `vocab` (>= 1):
/// Σ_j p_j (log p_j − log q_j), log-softmax in double (fp32 exponentials as in MeanNll).
/// Terms with p_j == 0 contribute 0. Non-negative up to rounding (clamped at 0).
double KlDivergenceFromLogits(const float* p_logits, const float* q_logits, int64_t vocab);

/// Index of the largest entry (the first on ties); n >= 1.
int64_t ArgMax(const float* row, int64_t n);

/// The `q` quantile (0..1) of ascending `sorted` values (linear between the nearest ranks).
double Quantile(const std::vector<double>& sorted, double q);

/// Per-model result of ComparePerplexityTokens.
struct ModelComparison {
  PerplexityResult perplexity;  // the model's own perplexity (same windows as the base)
  double mean_kld = 0;          // mean over scored positions of KL(P_base || P_model), nats
  double mean_kld_error = 0;    // its standard error
  double median_kld = 0, kld_p90 = 0, kld_p99 = 0, kld_p999 = 0;
  double max_kld = 0;           // largest single-position KL
  double top1_agreement = 0;    // fraction in [0, 1] of positions with argmax equal to the base's
  double top1_agreement_error = 0;
  int64_t positions = 0;        // scored positions
};

struct ComparisonResult {
  PerplexityResult base;
  std::vector<ModelComparison> models;  // in the order given
};

/// Runs the base model and each model on the same windows of `tokens` (protocol as
/// EvaluatePerplexityTokens) and compares their next-token distributions position by position.
/// Errors: no models; a model whose vocab_size differs from the base's (names both); every
/// EvaluatePerplexityTokens error (seq_len, too few tokens, forward errors).
Result<ComparisonResult> ComparePerplexityTokens(const LlamaModel& base, const std::vector<const LlamaModel*>& models,
                                                 const std::vector<int32_t>& tokens, const PerplexityProtocol& protocol);

/// As ComparePerplexityTokens with the base's logits read from `base` (checked against this run
/// first: vocab, seq_len, tokens, windows) instead of a forward pass of the float model.
Result<ComparisonResult> ComparePerplexityTokensSaved(const SavedLogits& base, const std::vector<const LlamaModel*>& models,
                                                      const std::vector<int32_t>& tokens, const PerplexityProtocol& protocol);

}  // namespace nibble
