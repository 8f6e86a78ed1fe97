// The JSON forms of evaluation results (`nibble perplexity --json`, `compare --json`, the Python
// binding's Model.perplexity()): one place for their keys.
#include <nlohmann/json.hpp>

#include <nibble/eval.h>

namespace nibble {

std::string PerplexityJson(const PerplexityReport& p) {
  const nlohmann::ordered_json j = {{"ppl", p.ppl},
                                    {"ppl_stderr", p.ppl_stderr},
                                    {"mean_nll", p.mean_nll},
                                    {"seq_len", p.seq_len},
                                    {"tokens", p.n_tokens},
                                    {"windows", p.n_windows},
                                    {"windows_available", p.n_windows_available},
                                    {"scored_tokens", p.scored_tokens},
                                    {"dropped_tokens", p.dropped_tokens},
                                    {"bos_prepended", p.bos_prepended}};
  return j.dump();
}

std::string ComparisonRowJson(const ComparisonRow& row) {
  nlohmann::ordered_json j;
  j["dir"] = row.dir;
  j["ppl"] = row.perplexity.ppl;
  j["ppl_stderr"] = row.perplexity.ppl_stderr;
  j["mean_nll"] = row.perplexity.mean_nll;
  j["kld"] = {{"mean", row.mean_kld}, {"mean_stderr", row.mean_kld_error}, {"median", row.median_kld},
              {"p90", row.kld_p90},   {"p99", row.kld_p99},                {"p99_9", row.kld_p999},
              {"max", row.max_kld}};
  j["same_top_p"] = row.top1_agreement;
  j["same_top_p_stderr"] = row.top1_agreement_error;
  return j.dump();
}

}  // namespace nibble
