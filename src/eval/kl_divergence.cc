#include "eval/kl_divergence.h"

#include <algorithm>
#include <cmath>

#include "model/ops.h"

namespace nibble {

namespace {

// log Σ exp(row) with the max subtracted: returns (max, log of the shifted sum).
void LogSumExp(const float* row, int64_t n, float* mx_out, double* log_sum_out) {
  float mx = row[0];
  for (int64_t j = 1; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
  double sum = 0;
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    float block = 0;
    const int64_t j1 = std::min(j0 + 256, n);
    for (int64_t j = j0; j < j1; ++j) block += ExpF(row[j] - mx);
    sum += block;
  }
  *mx_out = mx;
  *log_sum_out = std::log(sum);
}

}  // namespace

double KlDivergenceFromLogits(const float* p_logits, const float* q_logits, int64_t vocab) {
  float pm, qm;
  double pl, ql;
  LogSumExp(p_logits, vocab, &pm, &pl);
  LogSumExp(q_logits, vocab, &qm, &ql);
  double kl = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    const double lp = static_cast<double>(p_logits[j] - pm) - pl;
    const double lq = static_cast<double>(q_logits[j] - qm) - ql;
    const double p = std::exp(lp);
    if (p > 0) kl += p * (lp - lq);
  }
  return kl > 0 ? kl : 0.0;
}

int64_t ArgMax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

Result<ComparisonResult> ComparePerplexityTokens(const LlamaModel& base, const std::vector<const LlamaModel*>& models,
                                                 const std::vector<int32_t>& tokens, const PerplexityProtocol& protocol) {
  if (models.empty()) return MakeError("compare: no models to compare with the base model");
  const int64_t vocab = base.config().vocab_size;
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i]->config().vocab_size != vocab)
      return MakeError("compare: model ", i + 1, " has vocab_size ", models[i]->config().vocab_size,
                       " but the base model has ", vocab);
  // Window arithmetic exactly as EvaluatePerplexityTokens.
  ComparisonResult out;
  const int64_t seq_len = protocol.seq_len;
  if (seq_len < 2) return MakeError("--seq_len ", seq_len, " is too small (need at least 2)");
  for (const LlamaModel* m : models)
    if (seq_len > m->config().max_position_embeddings)
      return MakeError("--seq_len ", seq_len, " exceeds a model's max_position_embeddings (", m->config().max_position_embeddings, ")");
  if (seq_len > base.config().max_position_embeddings)
    return MakeError("--seq_len ", seq_len, " exceeds the base model's max_position_embeddings (",
                     base.config().max_position_embeddings, ")");
  PerplexityResult& b = out.base;
  b.n_tokens = static_cast<int64_t>(tokens.size());
  b.n_windows_available = b.n_tokens / seq_len;
  if (b.n_windows_available == 0) return MakeError("text has ", b.n_tokens, " tokens, fewer than one window of seq_len ", seq_len);
  b.n_windows = b.n_windows_available;
  if (protocol.max_windows > 0 && protocol.max_windows < b.n_windows) b.n_windows = protocol.max_windows;
  b.dropped_tokens = b.n_tokens - b.n_windows_available * seq_len;
  b.scored_tokens = b.n_windows * (seq_len - 1);
  out.models.resize(models.size());
  for (auto& m : out.models) {
    m.perplexity.n_tokens = b.n_tokens;
    m.perplexity.n_windows = b.n_windows;
    m.perplexity.n_windows_available = b.n_windows_available;
    m.perplexity.dropped_tokens = b.dropped_tokens;
    m.perplexity.scored_tokens = b.scored_tokens;
  }

  const int64_t scored = seq_len - 1;
  std::vector<float> base_logits(static_cast<size_t>(seq_len * vocab)), logits(base_logits.size());
  KvCache base_cache = base.NewCache(seq_len);
  std::vector<double> kld_sum(models.size(), 0.0);
  std::vector<int64_t> agree(models.size(), 0);
  std::vector<double> row_kl(static_cast<size_t>(scored));
  std::vector<int64_t> base_arg(static_cast<size_t>(scored));
  for (int64_t w = 0; w < b.n_windows; ++w) {
    const int32_t* win = tokens.data() + w * seq_len;
    base_cache.length = 0;
    NIBBLE_RETURN_IF_ERROR(base.Forward(win, seq_len, base_cache, base_logits.data(), /*all_logits=*/true));
    const double nll = MeanNll(base_logits.data(), vocab, win + 1, scored);
    b.window_mean_nll.push_back(nll);
    for (int64_t i = 0; i < scored; ++i) base_arg[i] = ArgMax(base_logits.data() + i * vocab, vocab);
    for (size_t mi = 0; mi < models.size(); ++mi) {
      KvCache cache = models[mi]->NewCache(seq_len);
      NIBBLE_RETURN_IF_ERROR(models[mi]->Forward(win, seq_len, cache, logits.data(), /*all_logits=*/true));
      ModelComparison& mc = out.models[mi];
      mc.perplexity.window_mean_nll.push_back(MeanNll(logits.data(), vocab, win + 1, scored));
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < scored; ++i)
        row_kl[i] = KlDivergenceFromLogits(base_logits.data() + i * vocab, logits.data() + i * vocab, vocab);
      for (int64_t i = 0; i < scored; ++i) {  // fixed order: independent of the thread count
        kld_sum[mi] += row_kl[i];
        mc.max_kld = std::max(mc.max_kld, row_kl[i]);
        if (ArgMax(logits.data() + i * vocab, vocab) == base_arg[i]) ++agree[mi];
      }
    }
    if (protocol.progress) protocol.progress(w + 1, b.n_windows);
  }
  auto finish = [&](PerplexityResult& r) {
    double s = 0;
    for (double v : r.window_mean_nll) s += v;
    r.mean_nll = s / static_cast<double>(r.window_mean_nll.size());
    r.ppl = std::exp(r.mean_nll);
  };
  finish(b);
  for (size_t mi = 0; mi < models.size(); ++mi) {
    ModelComparison& mc = out.models[mi];
    finish(mc.perplexity);
    mc.positions = b.scored_tokens;
    mc.mean_kld = kld_sum[mi] / static_cast<double>(mc.positions);
    mc.top1_agreement = static_cast<double>(agree[mi]) / static_cast<double>(mc.positions);
  }
  return out;
}

}  // namespace nibble
