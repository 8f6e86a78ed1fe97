// Public API: FP vs quantized comparison (perplexity, mean KLD, top-1 agreement; eval/kl_divergence.h).
#include <chrono>

#include <nibble/eval.h>

#include "api/model_impl.h"
#include "eval/kl_divergence.h"

namespace nibble {

namespace {
PerplexityReport ToReport(const PerplexityResult& r, int64_t seq_len, bool bos) {
  PerplexityReport rep;
  rep.ppl = r.ppl;
  rep.mean_nll = r.mean_nll;
  rep.seq_len = seq_len;
  rep.n_tokens = r.n_tokens;
  rep.n_windows = r.n_windows;
  rep.n_windows_available = r.n_windows_available;
  rep.scored_tokens = r.scored_tokens;
  rep.dropped_tokens = r.dropped_tokens;
  rep.bos_prepended = bos;
  return rep;
}
}  // namespace

Result<ComparisonReport> CompareModels(const Model& base, const std::vector<const Model*>& models, const std::string& text,
                                       const CompareOptions& options) {
  if (models.empty()) return MakeError("compare: no quantized models given");
  ScopedThreads threads(options.threads);
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, base.Tokenize(text));
  std::vector<const LlamaModel*> llamas;
  for (const Model* m : models) llamas.push_back(&ModelAccess::llama(*m));
  PerplexityProtocol protocol;
  protocol.seq_len = options.seq_len;
  protocol.max_windows = options.max_windows;
  protocol.progress = options.progress;
  const auto t0 = std::chrono::steady_clock::now();
  NIBBLE_ASSIGN_OR_RETURN(ComparisonResult r, ComparePerplexityTokens(ModelAccess::llama(base), llamas, tokens, protocol));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool bos = ModelAccess::tokenizer(base).add_bos();
  ComparisonReport rep;
  rep.base = ToReport(r.base, options.seq_len, bos);
  rep.base.seconds = seconds;
  for (size_t i = 0; i < models.size(); ++i) {
    ComparisonRow row;
    row.dir = models[i]->info().dir;
    row.perplexity = ToReport(r.models[i].perplexity, options.seq_len, bos);
    row.mean_kld = r.models[i].mean_kld;
    row.max_kld = r.models[i].max_kld;
    row.top1_agreement = r.models[i].top1_agreement;
    rep.rows.push_back(std::move(row));
  }
  return rep;
}

}  // namespace nibble
