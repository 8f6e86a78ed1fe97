#include "support/eval_output.h"

#include <unistd.h>

#include <chrono>
#include <memory>

namespace nibble_cli {

std::string PplWithError(const nibble::PerplexityReport& p) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "PPL = %.4f +/- %.5f", p.ppl, p.ppl_stderr);
  return buf;
}

void PrintKldStatistics(std::FILE* out, const nibble::ComparisonRow& row, const nibble::PerplexityReport& base) {
  std::fprintf(out, "====== perplexity and KL divergence statistics (%lld positions) ======\n",
               static_cast<long long>(base.scored_tokens));
  std::fprintf(out, "PPL(Q)      : %.4f +/- %.5f\nPPL(base)   : %.4f +/- %.5f\n", row.perplexity.ppl,
               row.perplexity.ppl_stderr, base.ppl, base.ppl_stderr);
  std::fprintf(out, "Mean    KLD : %10.6f +/- %10.6f\n", row.mean_kld, row.mean_kld_error);
  std::fprintf(out, "Maximum KLD : %10.6f\n99.9%%   KLD : %10.6f\n99.0%%   KLD : %10.6f\n90.0%%   KLD : %10.6f\n",
               row.max_kld, row.kld_p999, row.kld_p99, row.kld_p90);
  std::fprintf(out, "Median  KLD : %10.6f\n", row.median_kld);
  std::fprintf(out, "Same top p  : %6.3f +/- %5.3f %%\n", 100.0 * row.top1_agreement, 100.0 * row.top1_agreement_error);
}

std::function<void(int64_t, int64_t, double)> RunningPerplexityPrinter(std::function<void()> before_print) {
  if (!::isatty(2)) return nullptr;
  struct State {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::function<void()> before;
  };
  auto st = std::make_shared<State>();
  st->before = std::move(before_print);
  return [st](int64_t done, int64_t total, double ppl) {
    if (done == 1) {
      if (st->before) st->before();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - st->start).count();
      std::fprintf(stderr, "first window after %.2f s (tokenizing included), ETA %.1f s\n", s, s * static_cast<double>(total - 1));
    }
    std::fprintf(stderr, "[%lld]%.4f,", static_cast<long long>(done), ppl);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

nlohmann::ordered_json PerplexityJson(const nibble::PerplexityReport& p) {
  return {{"ppl", p.ppl},
          {"ppl_stderr", p.ppl_stderr},
          {"mean_nll", p.mean_nll},
          {"seq_len", p.seq_len},
          {"tokens", p.n_tokens},
          {"windows", p.n_windows},
          {"windows_available", p.n_windows_available},
          {"scored_tokens", p.scored_tokens},
          {"dropped_tokens", p.dropped_tokens},
          {"bos_prepended", p.bos_prepended}};
}

nlohmann::ordered_json ComparisonRowJson(const nibble::ComparisonRow& row) {
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
  return j;
}

nlohmann::ordered_json SizeJson(const nibble::SizeSummary& s) {
  return nlohmann::ordered_json::parse(nibble::SizeSummaryJson(s));
}

}  // namespace nibble_cli
