// `nibble compare`: the FP / RTN / AWQ table in one run — perplexity, mean KL(P_fp || P_q) and
// top-1 agreement of each quantized model against the float model, same tokens and windows.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/progress.h"

namespace nibble_cli {

namespace {
struct CompareArgs {
  std::string model, text;
  std::vector<std::string> quantized;
  int64_t seq_len = 512, max_windows = 60;
  int threads = 0;
};
}  // namespace

Runner RegisterCompare(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand("compare", "Perplexity, mean KLD and top-1 agreement of quantized models vs the float model");
  cmd->add_option("--model,-m", a->model, "Float (reference) model directory")->required();
  cmd->add_option("--quantized,-q", a->quantized, "Quantized model directories")->required()->expected(1, -1);
  cmd->add_option("--text,-f", a->text, "UTF-8 text file, evaluated as one string")->required();
  cmd->add_option("--seq_len", a->seq_len, "Window length in tokens")->capture_default_str();
  cmd->add_option("--max_windows", a->max_windows, "Evaluate only the first W windows (0 = all)")->capture_default_str();
  cmd->add_option("--threads,-t", a->threads, "Worker threads (0 = all cores)")->capture_default_str();
  return [a]() {
    nibble::SetNumThreads(a->threads);
    std::string text;
    if (const std::string err = ReadTextFile(a->text, &text); !err.empty()) return Fail(err);
    auto base = nibble::Model::Load(a->model);
    if (!base.ok()) return Fail(base.error().message);
    std::vector<std::unique_ptr<nibble::Model>> owned;
    std::vector<const nibble::Model*> models;
    for (const auto& d : a->quantized) {
      auto m = nibble::Model::Load(d);
      if (!m.ok()) return Fail(m.error().message);
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
    auto r = nibble::CompareModels(**base, models, text, opt);
    bar.reset();
    if (!r.ok()) return Fail(a->text + ": " + r.error().message);
    std::printf("text: %s\n", a->text.c_str());
    std::printf("protocol: GPTQ/AWQ (SPEC 6.1): whole text tokenized once with the float model's tokenizer, %s, "
                "windows of %lld tokens, %lld of %lld windows, %lld scored positions; KLD = mean KL(P_fp || P_q) over "
                "all scored positions (nats), top-1 = share of positions whose argmax equals FP's\n",
                r->base.bos_prepended ? "one BOS at the start" : "no BOS", static_cast<long long>(a->seq_len),
                static_cast<long long>(r->base.n_windows), static_cast<long long>(r->base.n_windows_available),
                static_cast<long long>(r->base.scored_tokens));
    size_t w = 5;
    for (const auto& d : a->quantized) w = std::max(w, d.size());
    w = std::max(w, a->model.size());
    std::printf("%-*s %12s %12s %10s %10s\n", static_cast<int>(w), "model", "perplexity", "mean KLD", "max KLD", "top-1");
    std::printf("%-*s %12.4f %12s %10s %10s\n", static_cast<int>(w), a->model.c_str(), r->base.ppl, "(fp)", "", "");
    for (const auto& row : r->rows)
      std::printf("%-*s %12.4f %12.6f %10.4f %9.2f%%\n", static_cast<int>(w), row.dir.c_str(), row.perplexity.ppl, row.mean_kld,
                  row.max_kld, 100.0 * row.top1_agreement);
    std::fprintf(stderr, "compare: base model forward %.1f s, %d threads\n", r->base.seconds, nibble::NumThreads());
    return 0;
  };
}

}  // namespace nibble_cli
