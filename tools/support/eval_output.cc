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

nlohmann::ordered_json PerplexityValue(const nibble::PerplexityReport& p) {
  return nlohmann::ordered_json::parse(nibble::PerplexityJson(p));
}

nlohmann::ordered_json ComparisonRowValue(const nibble::ComparisonRow& row) {
  return nlohmann::ordered_json::parse(nibble::ComparisonRowJson(row));
}

nlohmann::ordered_json SizeJson(const nibble::SizeSummary& s) {
  return nlohmann::ordered_json::parse(nibble::SizeSummaryJson(s));
}

}  // namespace nibble_cli
