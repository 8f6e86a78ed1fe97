// Public API: FP vs quantized comparison (perplexity, KLD statistics, top-1 agreement;
// eval/kl_divergence.h), the base's logits from a forward pass or a saved-logits file.
#include <chrono>

#include <nibble/eval.h>

#include "api/model_impl.h"
#include "eval/kl_divergence.h"
#include "eval/saved_logits.h"

namespace nibble {

namespace {
PerplexityReport ToReport(const PerplexityResult& r, int64_t seq_len, bool bos) {
  PerplexityReport rep;
  rep.ppl = r.ppl;
  rep.ppl_stderr = r.ppl_stderr;
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

Result<PerplexityProtocol> ToProtocol(const CompareOptions& options) {
  PerplexityProtocol protocol;
  protocol.seq_len = options.seq_len;
  protocol.max_windows = options.max_windows;
  protocol.progress = options.progress;
  protocol.on_window = options.on_window;
  protocol.save_logits = options.save_logits;
  protocol.cancel = options.cancel;
  NIBBLE_ASSIGN_OR_RETURN(protocol.save_logits_format, SavedLogitsFormat::Parse(options.save_logits_format));
  return protocol;
}

ComparisonReport ToReport(const ComparisonResult& r, const std::vector<const Model*>& models, int64_t seq_len, bool bos,
                          double seconds) {
  ComparisonReport rep;
  rep.base = ToReport(r.base, seq_len, bos);
  rep.base.seconds = seconds;
  for (size_t i = 0; i < models.size(); ++i) {
    const ModelComparison& m = r.models[i];
    ComparisonRow row;
    row.dir = models[i]->info().dir;
    row.perplexity = ToReport(m.perplexity, seq_len, bos);
    row.mean_kld = m.mean_kld;
    row.mean_kld_error = m.mean_kld_error;
    row.median_kld = m.median_kld;
    row.kld_p90 = m.kld_p90;
    row.kld_p99 = m.kld_p99;
    row.kld_p999 = m.kld_p999;
    row.max_kld = m.max_kld;
    row.top1_agreement = m.top1_agreement;
    row.top1_agreement_error = m.top1_agreement_error;
    rep.rows.push_back(std::move(row));
  }
  return rep;
}

std::vector<const LlamaModel*> Llamas(const std::vector<const Model*>& models) {
  std::vector<const LlamaModel*> llamas;
  for (const Model* m : models) llamas.push_back(&ModelAccess::llama(*m));
  return llamas;
}
}  // namespace

std::string FindSavedLogits(const std::string& path) {
  if (!IsDirectory(path)) return PathExists(path) ? path : "";
  const std::string f = JoinPath(path, kSavedLogitsFileName);
  return PathExists(f) ? f : "";
}

Result<ComparisonReport> CompareModels(const Model& base, const std::vector<const Model*>& models, const std::string& text,
                                       const CompareOptions& options) {
  if (models.empty()) return MakeError("compare: no quantized models given");
  NIBBLE_RETURN_IF_ERROR(CheckThreads(options.threads));
  ScopedThreads threads(options.threads);
  NIBBLE_ASSIGN_OR_RETURN(const PerplexityProtocol protocol, ToProtocol(options));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, base.Tokenize(text));
  const auto t0 = std::chrono::steady_clock::now();
  NIBBLE_ASSIGN_OR_RETURN(ComparisonResult r, ComparePerplexityTokens(ModelAccess::llama(base), Llamas(models), tokens, protocol));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return ToReport(r, models, options.seq_len, ModelAccess::tokenizer(base).add_bos(), seconds);
}

Result<ComparisonReport> CompareWithSavedLogits(const std::string& logits_path, const std::vector<const Model*>& models,
                                                const std::string& text, const CompareOptions& options) {
  if (models.empty()) return MakeError("compare: no quantized models given");
  const std::string file = FindSavedLogits(logits_path);
  if (file.empty())
    return MakeError(logits_path, ": no saved logits (", IsDirectory(logits_path) ? "no " : "no such file; expected a file or a directory with ",
                     kSavedLogitsFileName, ")");
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<SavedLogits> saved, SavedLogits::Open(file));
  NIBBLE_RETURN_IF_ERROR(CheckThreads(options.threads));
  ScopedThreads threads(options.threads);
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, models[0]->Tokenize(text));
  NIBBLE_ASSIGN_OR_RETURN(PerplexityProtocol protocol, ToProtocol(options));
  protocol.save_logits.clear();
  const auto t0 = std::chrono::steady_clock::now();
  NIBBLE_ASSIGN_OR_RETURN(ComparisonResult r, ComparePerplexityTokensSaved(*saved, Llamas(models), tokens, protocol));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ComparisonReport rep = ToReport(r, models, options.seq_len, ModelAccess::tokenizer(*models[0]).add_bos(), seconds);
  rep.base_logits_file = file;
  return rep;
}

}  // namespace nibble
