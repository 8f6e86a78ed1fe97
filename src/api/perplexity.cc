#include <algorithm>
#include <chrono>

#include <nibble/eval.h>

#include "api/model_impl.h"
#include "eval/perplexity.h"

namespace nibble {

Status CheckSavedLogitsFormat(const std::string& format) {
  auto f = SavedLogitsFormat::Parse(format);
  return f.ok() ? Status::Ok() : Status(f.error());
}

Status ValidateWindowOptions(int64_t seq_len, int64_t max_windows, bool zero_is_default) {
  if (seq_len < 2 && !(zero_is_default && seq_len == 0))
    return MakeError("--seq_len ", seq_len, " is too small (need at least 2", zero_is_default ? ", or 0 for the default" : "",
                     ")");
  if (max_windows < 0) return MakeError("--max_windows ", max_windows, " must be >= 0 (0 = all windows)");
  return Status::Ok();
}

Status CheckWindowFits(const Model& model, int64_t seq_len) {
  return CheckWindowFits(ModelAccess::llama(model), seq_len, "the model");
}

Result<PerplexityReport> EvaluatePerplexity(const Model& model, const std::string& text,
                                            const PerplexityOptions& options) {
  NIBBLE_RETURN_IF_ERROR(CheckThreads(options.threads));
  ScopedThreads threads(options.threads);
  NIBBLE_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, model.Tokenize(text));
  PerplexityProtocol protocol;
  // seq_len 0: the protocol's 2048, capped at the model's context.
  const int64_t seq_len = options.seq_len > 0 ? options.seq_len
                          : std::min<int64_t>(2048, ModelAccess::llama(model).config().max_position_embeddings);
  protocol.seq_len = seq_len;
  protocol.max_windows = options.max_windows;
  protocol.progress = options.progress;
  protocol.on_window = options.on_window;
  protocol.save_logits = options.save_logits;
  protocol.cancel = options.cancel;
  NIBBLE_ASSIGN_OR_RETURN(protocol.save_logits_format, SavedLogitsFormat::Parse(options.save_logits_format));
  auto t0 = std::chrono::steady_clock::now();
  NIBBLE_ASSIGN_OR_RETURN(PerplexityResult r, EvaluatePerplexityTokens(ModelAccess::llama(model), tokens, protocol));
  PerplexityReport rep;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep.ppl = r.ppl;
  rep.ppl_stderr = r.ppl_stderr;
  rep.mean_nll = r.mean_nll;
  rep.seq_len = seq_len;
  rep.n_tokens = r.n_tokens;
  rep.n_windows = r.n_windows;
  rep.n_windows_available = r.n_windows_available;
  rep.scored_tokens = r.scored_tokens;
  rep.dropped_tokens = r.dropped_tokens;
  rep.bos_prepended = ModelAccess::tokenizer(model).add_bos();
  rep.tokens_per_second = rep.seconds > 0 ? static_cast<double>(r.n_windows * seq_len) / rep.seconds : 0;
  return rep;
}

}  // namespace nibble
