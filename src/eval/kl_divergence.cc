#include "eval/kl_divergence.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>

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

double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(rank);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double f = rank - static_cast<double>(lo);
  return (1 - f) * sorted[lo] + f * sorted[hi];
}

namespace {

// The base's next-token distributions of one window: full logits rows (a forward pass, an fp32
// saved file) or the rows of a compact saved file (uint16, topk).
struct BaseWindow {
  const float* logits = nullptr;
  const SavedLogits* saved = nullptr;
  int64_t w = 0;
};
// The base's rows for window w (tokens `win`).
using BaseWindowFn = std::function<Result<BaseWindow>(int64_t w, const int32_t* win)>;

// Mean NLL of the window's targets under the base (compact files store each target's log-prob).
double BaseMeanNll(const BaseWindow& b, int64_t vocab, const int32_t* targets, int64_t n, double* sq_sum) {
  if (b.logits != nullptr) return MeanNll(b.logits, vocab, targets, n, sq_sum);
  double total = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double nll = -static_cast<double>(b.saved->Row(b.w, i).target_log_prob);
    total += nll;
    sq += nll * nll;
  }
  *sq_sum += sq;
  return total / static_cast<double>(n);
}

int64_t BaseArgMax(const BaseWindow& b, int64_t i, int64_t vocab) {
  return b.logits != nullptr ? ArgMax(b.logits + i * vocab, vocab) : b.saved->Row(b.w, i).argmax;
}

// KL(P || Q) with P given by its top k log-probs and the mass of the rest, that rest lumped into
// one outcome on both sides: Σ_top p (log p − log q) + p_rest (log p_rest − log q_rest). This is
// the KL of the coarsened pair, a lower bound of the full one (docs/FORMATS.md "Saved logits").
double KlTopK(const SavedRow& r, const float* q_logits, int64_t vocab) {
  float qm;
  double ql;
  LogSumExp(q_logits, vocab, &qm, &ql);
  std::vector<uint8_t> top(static_cast<size_t>(vocab), 0);
  double kl = 0;
  for (int64_t t = 0; t < r.top_k; ++t) {
    const int32_t id = r.top_id(t);
    top[static_cast<size_t>(id)] = 1;
    const double lp = r.top_log_prob(t), lq = static_cast<double>(q_logits[id] - qm) - ql;
    kl += std::exp(lp) * (lp - lq);
  }
  if (std::isfinite(r.rest_log_mass)) {
    double rest = 0;  // Σ over the rest of exp(q - qm), summed directly: 1 − Σ_top q cancels
    for (int64_t j = 0; j < vocab; ++j)
      if (!top[static_cast<size_t>(j)]) rest += std::exp(static_cast<double>(q_logits[j] - qm));
    const double lq_rest = rest > 0 ? std::log(rest) - ql : -745.0;  // exp(-745) is the least double
    kl += std::exp(static_cast<double>(r.rest_log_mass)) * (r.rest_log_mass - lq_rest);
  }
  return kl > 0 ? kl : 0.0;
}

double BaseKl(const BaseWindow& b, int64_t i, const float* q_logits, int64_t vocab) {
  if (b.logits != nullptr) return KlDivergenceFromLogits(b.logits + i * vocab, q_logits, vocab);
  const SavedRow r = b.saved->Row(b.w, i);
  if (r.form == SavedLogitsFormat::kTopK) return KlTopK(r, q_logits, vocab);
  // uint16: the row's log-probs (renormalised by the KL); q = 0 lies below the stored range: p = 0.
  std::vector<float> lp(static_cast<size_t>(vocab));
  for (int64_t j = 0; j < vocab; ++j)
    lp[static_cast<size_t>(j)] = r.q[j] == 0 ? -std::numeric_limits<float>::infinity() : r.min_log_prob + r.scale * static_cast<float>(r.q[j]);
  return KlDivergenceFromLogits(lp.data(), q_logits, vocab);
}

// Per model: every position's KL in scoring order, and the argmax agreements.
struct Accumulator {
  std::vector<double> kl;
  double kl_sum = 0;
  int64_t agree = 0;
};

Status CheckModels(int64_t vocab, int64_t seq_len, const std::vector<const LlamaModel*>& models) {
  if (models.empty()) return MakeError("compare: no models to compare with the base model");
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i]->config().vocab_size != vocab)
      return MakeError("compare: model ", i + 1, " has vocab_size ", models[i]->config().vocab_size,
                       " but the base model has ", vocab);
  for (const LlamaModel* m : models) NIBBLE_RETURN_IF_ERROR(CheckWindowFits(*m, seq_len, "a model"));
  return Status::Ok();
}

// Window counts of the protocol (as EvaluatePerplexityTokens), for the base and every model.
Status InitCounts(int64_t n_tokens, const PerplexityProtocol& protocol, ComparisonResult& out, size_t n_models) {
  const int64_t seq_len = protocol.seq_len;
  PerplexityResult& b = out.base;
  b.n_tokens = n_tokens;
  NIBBLE_RETURN_IF_ERROR(CheckOneWindow(b.n_tokens, seq_len));
  b.n_windows_available = b.n_tokens / seq_len;
  b.n_windows = b.n_windows_available;
  if (protocol.max_windows > 0 && protocol.max_windows < b.n_windows) b.n_windows = protocol.max_windows;
  b.dropped_tokens = b.n_tokens - b.n_windows_available * seq_len;
  b.scored_tokens = b.n_windows * (seq_len - 1);
  out.models.resize(n_models);
  for (auto& m : out.models) {
    m.perplexity.n_tokens = b.n_tokens;
    m.perplexity.n_windows = b.n_windows;
    m.perplexity.n_windows_available = b.n_windows_available;
    m.perplexity.dropped_tokens = b.dropped_tokens;
    m.perplexity.scored_tokens = b.scored_tokens;
  }
  return Status::Ok();
}

// One model on one window against the base rows.
Status CompareWindow(const LlamaModel& model, const int32_t* win, int64_t seq_len, int64_t vocab, const BaseWindow& base,
                     const std::vector<int64_t>& base_arg, std::vector<float>& logits, ModelComparison& mc, Accumulator& acc,
                     const std::string& mc_name, const CancellationToken* cancel) {
  const int64_t scored = seq_len - 1;
  NIBBLE_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(seq_len));
  NIBBLE_RETURN_IF_ERROR(model.Forward(win, seq_len, cache, logits.data(), /*all_logits=*/true, cancel));
  mc.perplexity.window_mean_nll.push_back(MeanNll(logits.data(), vocab, win + 1, scored, &mc.perplexity.nll_sq_sum));
  NIBBLE_RETURN_IF_ERROR(CheckWindowNll(mc.perplexity.window_mean_nll.back(), static_cast<int64_t>(mc.perplexity.window_mean_nll.size()), mc_name));
  std::vector<double> row_kl(static_cast<size_t>(scored));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < scored; ++i)
    row_kl[i] = BaseKl(base, i, logits.data() + i * vocab, vocab);
  for (int64_t i = 0; i < scored; ++i) {  // fixed order: independent of the thread count
    acc.kl_sum += row_kl[i];
    acc.kl.push_back(row_kl[i]);
    mc.max_kld = std::max(mc.max_kld, row_kl[i]);
    if (ArgMax(logits.data() + i * vocab, vocab) == base_arg[i]) ++acc.agree;
  }
  return Status::Ok();
}

// Mean ± error, quantiles and agreement of one model from its accumulated positions.
void FinishModel(ModelComparison& mc, Accumulator& acc, int64_t positions) {
  FinishPerplexity(mc.perplexity);
  const double n = static_cast<double>(positions);
  mc.positions = positions;
  mc.mean_kld = acc.kl_sum / n;
  double sq = 0;
  for (double v : acc.kl) sq += v * v;
  const double var = sq / n - mc.mean_kld * mc.mean_kld;
  mc.mean_kld_error = n > 1 && var > 0 ? std::sqrt(var / (n - 1)) : 0.0;
  std::sort(acc.kl.begin(), acc.kl.end());
  mc.median_kld = Quantile(acc.kl, 0.5);
  mc.kld_p90 = Quantile(acc.kl, 0.9);
  mc.kld_p99 = Quantile(acc.kl, 0.99);
  mc.kld_p999 = Quantile(acc.kl, 0.999);
  const double p = static_cast<double>(acc.agree) / n;
  mc.top1_agreement = p;
  mc.top1_agreement_error = n > 1 ? std::sqrt(p * (1 - p) / (n - 1)) : 0.0;
}

Result<ComparisonResult> Compare(const BaseWindowFn& base_window, int64_t vocab, const std::vector<const LlamaModel*>& models,
                                 const std::vector<int32_t>& tokens, const PerplexityProtocol& protocol) {
  ComparisonResult out;
  NIBBLE_RETURN_IF_ERROR(InitCounts(static_cast<int64_t>(tokens.size()), protocol, out, models.size()));
  const int64_t seq_len = protocol.seq_len, scored = seq_len - 1;
  PerplexityResult& b = out.base;
  std::vector<float> logits(static_cast<size_t>(seq_len * vocab));
  std::vector<Accumulator> acc(models.size());
  std::vector<int64_t> base_arg(static_cast<size_t>(scored));
  for (int64_t w = 0; w < b.n_windows; ++w) {
    const int32_t* win = tokens.data() + w * seq_len;
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(protocol.cancel, WindowName(w, b.n_windows)));
    NIBBLE_ASSIGN_OR_RETURN(const BaseWindow base, base_window(w, win));
    b.window_mean_nll.push_back(BaseMeanNll(base, vocab, win + 1, scored, &b.nll_sq_sum));
    NIBBLE_RETURN_IF_ERROR(CheckWindowNll(b.window_mean_nll.back(), w + 1, "the base model"));
    for (int64_t i = 0; i < scored; ++i) base_arg[i] = BaseArgMax(base, i, vocab);
    for (size_t mi = 0; mi < models.size(); ++mi)
      NIBBLE_RETURN_IF_ERROR(CompareWindow(*models[mi], win, seq_len, vocab, base, base_arg, logits, out.models[mi], acc[mi],
                                           "quantized model " + std::to_string(mi + 1), protocol.cancel));
    if (protocol.progress) protocol.progress(w + 1, b.n_windows);
    if (protocol.on_window) protocol.on_window(w + 1, b.n_windows, RunningPerplexity(out.models[0].perplexity));
  }
  FinishPerplexity(b);
  for (size_t mi = 0; mi < models.size(); ++mi) FinishModel(out.models[mi], acc[mi], b.scored_tokens);
  return out;
}

}  // namespace

Result<ComparisonResult> ComparePerplexityTokens(const LlamaModel& base, const std::vector<const LlamaModel*>& models,
                                                 const std::vector<int32_t>& tokens, const PerplexityProtocol& protocol) {
  const int64_t vocab = base.config().vocab_size, seq_len = protocol.seq_len;
  NIBBLE_RETURN_IF_ERROR(CheckModels(vocab, seq_len, models));
  NIBBLE_RETURN_IF_ERROR(CheckWindowFits(base, seq_len, "the base model"));
  NIBBLE_RETURN_IF_ERROR(CheckWindowMemory(seq_len, vocab));
  std::vector<float> base_logits(static_cast<size_t>(seq_len * vocab));
  NIBBLE_ASSIGN_OR_RETURN(KvCache base_cache, base.NewCache(seq_len));
  std::unique_ptr<SavedLogitsWriter> save;
  if (!protocol.save_logits.empty() && static_cast<int64_t>(tokens.size()) >= seq_len) {
    const int64_t avail = static_cast<int64_t>(tokens.size()) / seq_len;
    const int64_t n_windows = protocol.max_windows > 0 && protocol.max_windows < avail ? protocol.max_windows : avail;
    NIBBLE_ASSIGN_OR_RETURN(save, SavedLogitsWriter::Open(SavedLogitsPathFor(protocol.save_logits), vocab, seq_len, n_windows,
                                                          tokens, protocol.save_logits_format));
  }
  auto forward = [&](int64_t, const int32_t* win) -> Result<BaseWindow> {
    base_cache.length = 0;
    NIBBLE_RETURN_IF_ERROR(base.Forward(win, seq_len, base_cache, base_logits.data(), /*all_logits=*/true, protocol.cancel));
    if (save) NIBBLE_RETURN_IF_ERROR(save->AddWindow(base_logits.data()));
    return BaseWindow{base_logits.data(), nullptr, 0};
  };
  NIBBLE_ASSIGN_OR_RETURN(ComparisonResult r, Compare(forward, vocab, models, tokens, protocol));
  if (save) NIBBLE_RETURN_IF_ERROR(save->Finish());
  return r;
}

Result<ComparisonResult> ComparePerplexityTokensSaved(const SavedLogits& base, const std::vector<const LlamaModel*>& models,
                                                      const std::vector<int32_t>& tokens, const PerplexityProtocol& protocol) {
  if (models.empty() || protocol.seq_len < 2) NIBBLE_RETURN_IF_ERROR(CheckModels(base.vocab(), protocol.seq_len, models));
  const int64_t avail = static_cast<int64_t>(tokens.size()) / protocol.seq_len;
  const int64_t n_windows = protocol.max_windows > 0 && protocol.max_windows < avail ? protocol.max_windows : avail;
  NIBBLE_RETURN_IF_ERROR(base.CheckMatches(models[0]->config().vocab_size, protocol.seq_len, n_windows, tokens));
  NIBBLE_RETURN_IF_ERROR(CheckModels(base.vocab(), protocol.seq_len, models));
  auto saved = [&](int64_t w, const int32_t*) -> Result<BaseWindow> {
    if (base.format().form == SavedLogitsFormat::kFp32) return BaseWindow{base.Row(w, 0).logits, nullptr, 0};
    return BaseWindow{nullptr, &base, w};
  };
  return Compare(saved, base.vocab(), models, tokens, protocol);
}

}  // namespace nibble
