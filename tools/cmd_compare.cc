// `nibble compare`: the FP / RTN / AWQ table in one run — size, perplexity, KL(P_fp || P_q)
// statistics and top-1 agreement of each quantized model against the float model, on the same
// tokens and windows; the float model run now (--model) or read from saved logits.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/eval_output.h"
#include "support/progress.h"
#include "support/text.h"

namespace nibble_cli {

namespace {
struct CompareArgs {
  std::string model, text, kl_base, save_logits;
  std::vector<std::string> quantized;
  int64_t seq_len = 512, max_windows = 60;
  int threads = 0;
  bool json = false;
};

// The size of every quantized model (inspect's numbers); an empty summary where it cannot be inspected.
std::vector<nibble::SizeSummary> Sizes(const std::vector<std::string>& dirs) {
  std::vector<nibble::SizeSummary> out;
  for (const auto& d : dirs) {
    auto rep = nibble::Inspect(d);
    out.push_back(rep.ok() ? rep->size : nibble::SizeSummary());
  }
  return out;
}

void PrintTable(std::FILE* out, const CompareArgs& a, const nibble::ComparisonReport& r,
                const std::vector<nibble::SizeSummary>& sizes) {
  const std::string base = r.base_logits_file.empty() ? a.model : r.base_logits_file;
  size_t w = 5;
  for (const auto& d : a.quantized) w = std::max(w, d.size());
  w = std::max(w, base.size());
  const int W = static_cast<int>(w);
  std::fprintf(out, "%-*s %6s %10s %9s %9s %8s %9s %9s %9s %9s %9s %7s %6s\n", W, "model", "bits/w", "PPL", "+/-", "mean KLD",
               "+/-", "median", "p90", "p99", "p99.9", "max KLD", "top-1 %", "+/-");
  std::fprintf(out, "%-*s %6s %10.4f %9.5f %9s\n", W, base.c_str(), "fp", r.base.ppl, r.base.ppl_stderr, "(base)");
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const auto& row = r.rows[i];
    std::fprintf(out, "%-*s %6.2f %10.4f %9.5f %9.6f %8.6f %9.6f %9.6f %9.6f %9.6f %9.6f %7.3f %6.3f\n", W, row.dir.c_str(),
                 sizes[i].bits_per_weight(), row.perplexity.ppl, row.perplexity.ppl_stderr, row.mean_kld, row.mean_kld_error,
                 row.median_kld, row.kld_p90, row.kld_p99, row.kld_p999, row.max_kld, 100.0 * row.top1_agreement,
                 100.0 * row.top1_agreement_error);
  }
  for (size_t i = 0; i < r.rows.size(); ++i)
    std::fprintf(out, "size of %s: %s\n", r.rows[i].dir.c_str(), nibble::FormatSize(sizes[i]).c_str());
}

nlohmann::ordered_json ToJson(const CompareArgs& a, const nibble::ComparisonReport& r, const std::vector<nibble::SizeSummary>& sizes) {
  nlohmann::ordered_json j;
  j["text"] = a.text;
  j["base"] = r.base_logits_file.empty() ? a.model : r.base_logits_file;
  j["base_is_saved_logits"] = !r.base_logits_file.empty();
  j["base_perplexity"] = PerplexityJson(r.base);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.rows.size(); ++i) {
    nlohmann::ordered_json row = ComparisonRowJson(r.rows[i]);
    row["size"] = SizeJson(sizes[i]);
    rows.push_back(row);
  }
  j["models"] = rows;
  j["seconds"] = r.base.seconds;
  j["threads"] = nibble::NumThreads();
  return j;
}

nibble::Result<nibble::ComparisonReport> RunComparison(const CompareArgs& a, const std::string& text,
                                                       const std::vector<const nibble::Model*>& models,
                                                       nibble::CompareOptions& opt) {
  if (!a.kl_base.empty()) return nibble::CompareWithSavedLogits(a.kl_base, models, text, opt);
  auto base = nibble::Model::Load(a.model);
  if (!base.ok()) return base.error();
  PrintWarnings(a.model, (*base)->info().warnings);
  opt.save_logits = a.save_logits;
  return nibble::CompareModels(**base, models, text, opt);
}
}  // namespace

Runner RegisterCompare(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand("compare", "Perplexity, KLD statistics and top-1 agreement of quantized models vs the float model");
  auto* m = cmd->add_option("--model,-m", a->model, "Float (reference) model directory");
  auto* kb = cmd->add_option("--kl_divergence_base", a->kl_base,
                             "Logits of the float model saved by --save_logits (a file, or a directory holding "
                             "nibble-logits.bin), read instead of running --model");
  m->excludes(kb);
  cmd->add_option("--save_logits", a->save_logits,
                  "Also write the float model's logits to FILE (a directory: DIR/nibble-logits.bin) for --kl_divergence_base")
      ->excludes(kb);
  cmd->add_option("--quantized,-q", a->quantized, "Quantized model directories")->required()->expected(1, -1);
  cmd->add_option("--text,-f", a->text, "UTF-8 text file, evaluated as one string")->required();
  cmd->add_option("--seq_len", a->seq_len, "Window length in tokens")->capture_default_str();
  cmd->add_option("--max_windows", a->max_windows, "Evaluate only the first W windows (0 = all)")->capture_default_str();
  cmd->add_option("--threads,-t", a->threads, "Worker threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print a JSON object on stdout (the human text goes to stderr)");
  return [a]() {
    if (a->model.empty() && a->kl_base.empty()) return Fail("compare: give the float model (--model) or its saved logits (--kl_divergence_base)");
    nibble::SetNumThreads(a->threads);
    std::string text;
    if (const std::string err = ReadTextFile(a->text, &text); !err.empty()) return Fail(err);
    std::vector<std::unique_ptr<nibble::Model>> owned;
    std::vector<const nibble::Model*> models;
    for (const auto& d : a->quantized) {
      auto m = nibble::Model::Load(d);
      if (!m.ok()) return Fail(m.error().message);
      PrintWarnings(d, (*m)->info().warnings);
      owned.push_back(std::move(m).value());
      models.push_back(owned.back().get());
    }
    std::unique_ptr<nibble::ProgressBar> bar;
    nibble::CompareOptions opt;
    opt.seq_len = a->seq_len;
    opt.max_windows = a->max_windows;
    opt.progress = [&bar](int64_t done, int64_t total) {
      if (!bar) bar = std::make_unique<nibble::ProgressBar>("compare", total);
      bar->Update(done);
    };
    auto r = RunComparison(*a, text, models, opt);
    bar.reset();
    if (!r.ok()) return Fail(a->text + ": " + r.error().message);
    std::FILE* out = a->json ? stderr : stdout;
    std::fprintf(out, "text: %s\n", a->text.c_str());
    std::fprintf(out, "protocol: GPTQ/AWQ (SPEC 6.1): whole text tokenized once with the %s tokenizer, %s, "
                 "windows of %lld tokens, %lld of %lld windows, %lld scored positions; KLD = KL(P_fp || P_q) per scored "
                 "position (nats): mean +/- standard error and quantiles; top-1 = share of positions whose argmax equals FP's\n",
                 r->base_logits_file.empty() ? "float model's" : "first quantized model's",
                 r->base.bos_prepended ? "one BOS at the start" : "no BOS", static_cast<long long>(a->seq_len),
                 static_cast<long long>(r->base.n_windows), static_cast<long long>(r->base.n_windows_available),
                 static_cast<long long>(r->base.scored_tokens));
    const std::vector<nibble::SizeSummary> sizes = Sizes(a->quantized);
    PrintTable(out, *a, *r, sizes);
    if (!a->save_logits.empty()) std::fprintf(out, "saved the float model's logits to %s\n", a->save_logits.c_str());
    std::fprintf(stderr, "compare: %.1f s in all (the float model%s and %s on every window), %s\n", r->base.seconds,
                 r->base_logits_file.empty() ? "" : "'s saved logits", Plural(static_cast<long long>(models.size()), "quantized model").c_str(),
                 Plural(nibble::NumThreads(), "thread").c_str());
    if (a->json) std::printf("%s\n", ToJson(*a, *r, sizes).dump(2).c_str());
    return 0;
  };
}

}  // namespace nibble_cli
