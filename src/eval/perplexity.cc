#include "eval/perplexity.h"

#include <cmath>
#include <memory>
#include <vector>

#include "base/memory.h"
#include "base/parallel.h"
#include "eval/saved_logits.h"
#include "model/ops.h"

namespace nibble {

// Each row's NLL on any thread, summed in row order: the same bits for any thread count.
double MeanNll(const float* logits, int64_t vocab, const int32_t* targets, int64_t n, double* sq_sum) {
  std::vector<double> nll(static_cast<size_t>(n));
  ParallelFor(n, n * vocab >= kTeamMinWork, [&](int64_t i) {
    const float* row = logits + i * vocab;
    float mx = row[0];
    for (int64_t j = 1; j < vocab; ++j) mx = row[j] > mx ? row[j] : mx;
    // fp32 exponentials (ExpF, ~2 ulp) summed in fp32 blocks, blocks summed in double.
    double sum = 0;
    for (int64_t j0 = 0; j0 < vocab; j0 += 256) {
      float block = 0;
      const int64_t j1 = j0 + 256 < vocab ? j0 + 256 : vocab;
      for (int64_t j = j0; j < j1; ++j) block += ExpF(row[j] - mx);
      sum += block;
    }
    nll[static_cast<size_t>(i)] = (std::log(sum) + mx) - static_cast<double>(row[targets[i]]);
  });
  double total = 0, sq = 0;
  for (const double v : nll) {
    total += v;
    sq += v * v;
  }
  if (sq_sum != nullptr) *sq_sum += sq;
  return total / static_cast<double>(n);
}

Status CheckWindowNll(double mean_nll, int64_t window, const std::string& what) {
  if (std::isfinite(mean_nll)) return Status::Ok();
  return MakeError(what, " produced non-finite logits in window ", window, " (mean NLL ", mean_nll,
                   "); no perplexity can be computed");
}

double RunningPerplexity(const PerplexityResult& r) {
  double s = 0;
  for (double v : r.window_mean_nll) s += v;
  return r.window_mean_nll.empty() ? 0.0 : std::exp(s / static_cast<double>(r.window_mean_nll.size()));
}

void FinishPerplexity(PerplexityResult& r) {
  double s = 0;
  for (double v : r.window_mean_nll) s += v;
  r.mean_nll = s / static_cast<double>(r.window_mean_nll.size());
  r.ppl = std::exp(r.mean_nll);
  // Every window scores the same number of tokens: mean_nll is also the mean over tokens.
  const double n = static_cast<double>(r.scored_tokens);
  const double var = r.nll_sq_sum / n - r.mean_nll * r.mean_nll;
  r.ppl_stderr = n > 1 && var > 0 ? r.ppl * std::sqrt(var / (n - 1)) : 0.0;
}

std::string WindowName(int64_t w, int64_t n_windows) {
  return "perplexity before window " + std::to_string(w + 1) + " of " + std::to_string(n_windows);
}

Status CheckWindowMemory(int64_t seq_len, int64_t vocab) {
  return CheckMemoryFor(4.0 * static_cast<double>(seq_len) * static_cast<double>(vocab),
                        "the logits of a window of --seq_len " + std::to_string(seq_len) + " x vocab_size " +
                            std::to_string(vocab));
}

Status CheckWindowFits(const LlamaModel& model, int64_t seq_len, const char* whose) {
  if (seq_len < 2) return MakeError("--seq_len ", seq_len, " is too small (need at least 2)");
  const int64_t max_pos = model.config().max_position_embeddings;
  if (seq_len > max_pos)
    return MakeError("--seq_len ", seq_len, " exceeds ", whose, "'s max_position_embeddings (", max_pos, ")");
  return Status::Ok();
}

Status CheckOneWindow(int64_t n_tokens, int64_t seq_len) {
  if (n_tokens <= 1)
    return MakeError("text has ", n_tokens, n_tokens == 1 ? " token" : " tokens", ": nothing to score (a window needs 2)");
  if (n_tokens < seq_len)
    return MakeError("text has ", n_tokens, " tokens, fewer than one window of --seq_len ", seq_len,
                     ": give a longer text or a smaller --seq_len");
  return Status::Ok();
}

Result<PerplexityResult> EvaluatePerplexityTokens(const LlamaModel& model, const std::vector<int32_t>& tokens,
                                                  const PerplexityProtocol& protocol) {
  const ModelConfig& c = model.config();
  const int64_t seq_len = protocol.seq_len;
  NIBBLE_RETURN_IF_ERROR(CheckWindowFits(model, seq_len, "the model"));
  PerplexityResult r;
  r.n_tokens = static_cast<int64_t>(tokens.size());
  NIBBLE_RETURN_IF_ERROR(CheckOneWindow(r.n_tokens, seq_len));
  r.n_windows_available = r.n_tokens / seq_len;
  r.n_windows = r.n_windows_available;
  if (protocol.max_windows > 0 && protocol.max_windows < r.n_windows) r.n_windows = protocol.max_windows;
  r.dropped_tokens = r.n_tokens - r.n_windows_available * seq_len;
  r.scored_tokens = r.n_windows * (seq_len - 1);

  std::unique_ptr<SavedLogitsWriter> save;
  if (!protocol.save_logits.empty()) {
    NIBBLE_ASSIGN_OR_RETURN(save, SavedLogitsWriter::Open(SavedLogitsPathFor(protocol.save_logits), c.vocab_size, seq_len,
                                                          r.n_windows, tokens, protocol.save_logits_format));
  }
  NIBBLE_RETURN_IF_ERROR(CheckWindowMemory(seq_len, c.vocab_size));
  std::vector<float> logits(static_cast<size_t>(seq_len * c.vocab_size));
  NIBBLE_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(seq_len));
  for (int64_t w = 0; w < r.n_windows; ++w) {
    cache.length = 0;
    const int32_t* win = tokens.data() + w * seq_len;
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(protocol.cancel, WindowName(w, r.n_windows)));
    NIBBLE_RETURN_IF_ERROR(model.Forward(win, seq_len, cache, logits.data(), /*all_logits=*/true, protocol.cancel));
    r.window_mean_nll.push_back(MeanNll(logits.data(), c.vocab_size, win + 1, seq_len - 1, &r.nll_sq_sum));
    NIBBLE_RETURN_IF_ERROR(CheckWindowNll(r.window_mean_nll.back(), w + 1, "the model"));
    if (save) NIBBLE_RETURN_IF_ERROR(save->AddWindow(logits.data()));
    if (protocol.progress) protocol.progress(w + 1, r.n_windows);
    if (protocol.on_window) protocol.on_window(w + 1, r.n_windows, RunningPerplexity(r));
  }
  if (save) NIBBLE_RETURN_IF_ERROR(save->Finish());
  FinishPerplexity(r);
  return r;
}

}  // namespace nibble
