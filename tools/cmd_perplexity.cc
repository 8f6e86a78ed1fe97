// `nibble perplexity`: the GPTQ/AWQ-paper protocol (SPEC §6.1), printed next to the number.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/progress.h"

namespace nibble_cli {

namespace {
struct PerplexityArgs {
  std::string model, text, kl_base;
  int64_t seq_len = 0, max_windows = 0;
  int threads = 0;
  bool int8 = false;
  bool bf16 = false;
};

// The opt-in activation path a run compares against fp32 activations (--int8_activations or
// --bf16_activations), if any.
struct OptInActs {
  bool on = false;
  const char* label = "";      // printed before the figures
  const char* short_name = ""; // "int8" / "bf16"
  nibble::ActivationType type = nibble::ActivationType::kFp32;
};

// --kl_divergence_base: the model (and its opt-in activation instance, when given) against the
// float base on the same windows.
int RunAgainstBase(const PerplexityArgs& args, const std::string& text, const nibble::Model& model,
                   const nibble::Model* model2, const OptInActs& opt_in, int64_t opt_linears,
                   const nibble::PerplexityOptions& opt, std::unique_ptr<nibble::ProgressBar>& bar) {
  const PerplexityArgs* a = &args;
  auto base = nibble::Model::Load(a->kl_base);
  if (!base.ok()) return Fail(base.error().message);
  nibble::CompareOptions co;
  co.seq_len = a->seq_len;
  co.max_windows = a->max_windows;
  co.progress = opt.progress;
  // The opt-in instance goes through the same comparison, so the base model runs once for both.
  std::vector<const nibble::Model*> models = {&model};
  if (opt_in.on) models.push_back(model2);
  auto c = nibble::CompareModels(**base, models, text, co);
  bar.reset();
  if (!c.ok()) return Fail(a->text + ": " + c.error().message);
  const auto& row = c->rows[0];
  std::printf("model: %s\nbase: %s\ntext: %s\n", a->model.c_str(), a->kl_base.c_str(), a->text.c_str());
  std::printf("protocol: GPTQ/AWQ (SPEC 6.1), windows of %lld tokens, %lld of %lld windows, %lld scored positions "
              "(tokenized with the base model's tokenizer)\n",
              static_cast<long long>(a->seq_len), static_cast<long long>(c->base.n_windows),
              static_cast<long long>(c->base.n_windows_available), static_cast<long long>(c->base.scored_tokens));
  std::printf("perplexity: %.4f (base %.4f)\nmean KLD: %.6f nats (max %.4f)\ntop-1 agreement: %.2f %%\n",
              row.perplexity.ppl, c->base.ppl, row.mean_kld, row.max_kld, 100.0 * row.top1_agreement);
  if (opt_in.on) {
    const auto& r2 = c->rows[1];
    std::printf("%s, %lld int4 linears): perplexity %.4f (%+.2f %% vs fp32 activations), mean KLD %.6f nats "
                "(%+.6f), top-1 agreement %.2f %%\n",
                opt_in.label, static_cast<long long>(opt_linears), r2.perplexity.ppl,
                100.0 * (r2.perplexity.ppl / row.perplexity.ppl - 1.0), r2.mean_kld, r2.mean_kld - row.mean_kld,
                100.0 * r2.top1_agreement);
  }
  return 0;
}

}  // namespace

Runner RegisterPerplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Token perplexity of a text file (GPTQ/AWQ protocol, SPEC 6.1)");
  cmd->add_option("--model,-m", a->model, "Model directory")->required();
  cmd->add_option("--text,-f", a->text, "UTF-8 text file, evaluated as one string")->required();
  cmd->add_option("--seq_len", a->seq_len, "Window length in tokens (0 = min(2048, max_position_embeddings))")->capture_default_str();
  cmd->add_option("--max_windows", a->max_windows, "Evaluate only the first W windows (0 = all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads,-t", a->threads, "Worker threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--kl_divergence_base", a->kl_base,
                  "Float model directory: also report mean KL(P_base || P_model) and top-1 agreement on the same windows");
  cmd->add_flag("--int8_activations", a->int8,
                "Opt-in W4A8: evaluate the same windows twice, fp32 then int8 activations in the int4 linears, "
                "and print the perplexity (and KLD) cost");
  cmd->add_flag("--bf16_activations", a->bf16,
                "Opt-in bf16 activations: evaluate the same windows twice, fp32 then bf16 activations in the int4 "
                "linears, and print the perplexity (and KLD) cost")
      ->excludes("--int8_activations");
  return [a]() {
    nibble::SetNumThreads(a->threads);
    std::string text;
    if (const std::string err = ReadTextFile(a->text, &text); !err.empty()) return Fail(err);
    auto model = nibble::Model::Load(a->model);
    if (!model.ok()) return Fail(model.error().message);
    OptInActs opt_in;
    if (a->int8) opt_in = {true, "int8 activations (W4A8", "int8", nibble::ActivationType::kInt8};
    if (a->bf16) opt_in = {true, "bf16 activations (W4A16 bf16", "bf16", nibble::ActivationType::kBf16};
    // An opt-in path: a second instance of the model with those activations runs the same
    // windows; a model it cannot serve is refused before evaluating anything.
    int64_t opt_linears = 0;
    std::unique_ptr<nibble::Model> model2;
    if (opt_in.on) {
      nibble::LoadOptions lo;
      lo.activations = opt_in.type;
      auto m2 = nibble::Model::Load(a->model, lo);
      if (!m2.ok()) return Fail(m2.error().message);
      model2 = std::move(*m2);
      opt_linears = model2->info().activation_linears;
      if (opt_linears == 0) return Fail(a->int8 ? Int8NotServed(a->model) : Bf16NotServed(a->model));
      const std::string kept = KeptFp32Note(a->int8, (*model)->info().int4_linears, opt_linears);
      if (!kept.empty())
        std::fprintf(stderr, "%s: %s\n", a->int8 ? "--int8_activations" : "--bf16_activations", kept.c_str());
    }
    if (a->seq_len == 0) a->seq_len = std::min<int64_t>(2048, (*model)->info().max_position_embeddings);
    std::unique_ptr<nibble::ProgressBar> bar;
    nibble::PerplexityOptions opt;
    opt.seq_len = a->seq_len;
    opt.max_windows = a->max_windows;
    opt.progress = [&bar](int64_t done, int64_t total) {
      if (!bar) bar = std::make_unique<nibble::ProgressBar>("perplexity", total);
      bar->Update(done);
    };
    if (!a->kl_base.empty()) return RunAgainstBase(*a, text, **model, model2.get(), opt_in, opt_linears, opt, bar);
    auto r = nibble::EvaluatePerplexity(**model, text, opt);
    bar.reset();
    if (!r.ok()) return Fail(a->text + ": " + r.error().message);
    std::printf("model: %s\ntext: %s\n", a->model.c_str(), a->text.c_str());
    std::printf("protocol: GPTQ/AWQ (SPEC 6.1): whole text tokenized once, %s, non-overlapping windows of %lld tokens, "
                "remainder dropped, positions 1..%lld of each window scored\n",
                r->bos_prepended ? "one BOS at the start" : "no BOS", static_cast<long long>(r->seq_len),
                static_cast<long long>(r->seq_len - 1));
    std::printf("tokens: %lld | windows: %lld of %lld | scored tokens: %lld | dropped tokens: %lld\n",
                static_cast<long long>(r->n_tokens), static_cast<long long>(r->n_windows),
                static_cast<long long>(r->n_windows_available), static_cast<long long>(r->scored_tokens),
                static_cast<long long>(r->dropped_tokens));
    std::printf("mean NLL: %.6f nats/token\nperplexity: %.4f\n", r->mean_nll, r->ppl);
    std::fprintf(stderr, "throughput: %.1f tokens/s (%.2f s, %d threads)\n", r->tokens_per_second, r->seconds,
                 nibble::NumThreads());
    if (opt_in.on) {
      auto r2 = nibble::EvaluatePerplexity(*model2, text, opt);
      bar.reset();
      if (!r2.ok()) return Fail(a->text + ": " + r2.error().message);
      std::printf("%s, %lld int4 linears): mean NLL %.6f, perplexity %.4f (%+.2f %% vs fp32 activations %.4f)\n",
                  opt_in.label, static_cast<long long>(opt_linears), r2->mean_nll, r2->ppl, 100.0 * (r2->ppl / r->ppl - 1.0),
                  r->ppl);
      std::fprintf(stderr, "throughput (%s activations): %.1f tokens/s (%.2f s)\n", opt_in.short_name, r2->tokens_per_second,
                   r2->seconds);
    }
    return 0;
  };
}

}  // namespace nibble_cli
