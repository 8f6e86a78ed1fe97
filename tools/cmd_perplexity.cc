// `nibble perplexity`: the GPTQ/AWQ-paper protocol (SPEC §6.1), printed next to the number, with
// llama-perplexity's standard error, running value and (against a base) KL divergence statistics.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/cancel_signal.h"
#include "support/eval_output.h"
#include "support/flags.h"
#include "support/text.h"

namespace nibble_cli {

namespace {
struct PerplexityArgs {
  std::string model, text, kl_base, save_logits, save_logits_format = "fp32";
  int64_t seq_len = 0, max_windows = 0;
  KvArgs kv;
  int threads = 0;
  nibble::ActivationType activations = nibble::ActivationType::kAuto;
  nibble::TokenizerType tokenizer = nibble::TokenizerType::kAuto;
  bool int8 = false;  // compare fp32 against int8 / bf16 activations on the same windows
  bool bf16 = false;
  bool json = false;
};

// The opt-in activation path a run compares against fp32 activations (--int8_activations or
// --bf16_activations), if any.
struct OptInActs {
  bool on = false;
  const char* label = "";      // printed before the figures
  const char* short_name = ""; // "int8" / "bf16"
  nibble::ActivationType type = nibble::ActivationType::kFp32;
};

// What a run evaluates: the model, its opt-in activation instance (when asked for), the text.
struct Run {
  const PerplexityArgs* a;
  std::string text;
  const nibble::Model* model;
  const nibble::Model* model2;
  OptInActs opt_in;
  int64_t opt_linears;
  std::FILE* out;  // human text: stdout, or stderr under --json
  const nibble::CancellationToken* cancel;  // cancelled by Ctrl-C (support/cancel_signal.h)
};

// A failed evaluation: named by the text file, or (Ctrl-C) the cancellation's exit code.
int FailEval(const PerplexityArgs* a, const nibble::Error& e) {
  return e.code == nibble::ErrorCode::kCancelled ? FailStatus(e) : Fail(a->text + ": " + e.message);
}

// --kl_divergence_base: the model (and its opt-in activation instance) against the float base on
// the same windows: a base model directory run now, or logits saved earlier by --save_logits.
nibble::Result<nibble::ComparisonReport> CompareWithBase(const Run& run) {
  const PerplexityArgs* a = run.a;
  nibble::CompareOptions co;
  co.seq_len = a->seq_len;
  co.max_windows = a->max_windows;
  co.on_window = RunningPerplexityPrinter();
  co.cancel = run.cancel;
  // The opt-in instance goes through the same comparison, so the base runs (or is read) once.
  std::vector<const nibble::Model*> models = {run.model};
  if (run.opt_in.on) models.push_back(run.model2);
  if (!nibble::FindSavedLogits(a->kl_base).empty()) {
    if (!a->save_logits.empty()) return nibble::MakeError("--save_logits: --kl_divergence_base reads saved logits, there is no base model to save");
    return nibble::CompareWithSavedLogits(a->kl_base, models, run.text, co);
  }
  nibble::LoadOptions base_lo;
  ApplyKvArgs(a->kv, &base_lo);
  base_lo.tokenizer = a->tokenizer;
  auto base = nibble::Model::Load(a->kl_base, base_lo);
  if (!base.ok()) return base.error();
  PrintWarnings(a->kl_base, (*base)->info().warnings);
  co.save_logits = a->save_logits;
  co.save_logits_format = a->save_logits_format;
  return nibble::CompareModels(**base, models, run.text, co);
}

int RunAgainstBase(const Run& run) {
  const PerplexityArgs* a = run.a;
  auto c = CompareWithBase(run);
  if (!c.ok()) return FailEval(a, c.error());
  const auto& row = c->rows[0];
  const std::string base = c->base_logits_file.empty() ? a->kl_base : c->base_logits_file + " (saved logits)";
  std::fprintf(run.out, "model: %s\nbase: %s\ntext: %s\n", a->model.c_str(), base.c_str(), a->text.c_str());
  std::fprintf(run.out, "protocol: GPTQ/AWQ (SPEC 6.1), windows of %lld tokens, %lld of %lld windows, %lld scored positions "
               "(tokenized with the %s tokenizer)\n",
               static_cast<long long>(a->seq_len), static_cast<long long>(c->base.n_windows),
               static_cast<long long>(c->base.n_windows_available), static_cast<long long>(c->base.scored_tokens),
               c->base_logits_file.empty() ? "base model's" : "model's");
  std::fprintf(run.out, "perplexity: %.4f (base %.4f)\nmean KLD: %.6f nats (max %.4f)\ntop-1 agreement: %.2f %%\n",
               row.perplexity.ppl, c->base.ppl, row.mean_kld, row.max_kld, 100.0 * row.top1_agreement);
  PrintKldStatistics(run.out, row, c->base);
  nlohmann::ordered_json j = {{"model", a->model},
                              {"base", c->base_logits_file.empty() ? a->kl_base : c->base_logits_file},
                              {"base_is_saved_logits", !c->base_logits_file.empty()},
                              {"text", a->text},
                              {"activations", nibble::ActivationTypeName(run.model->info().activations)}};
  j["base_perplexity"] = PerplexityValue(c->base);
  j["perplexity"] = PerplexityValue(row.perplexity);
  j["comparison"] = ComparisonRowValue(row);
  if (run.opt_in.on) {
    const auto& r2 = c->rows[1];
    std::fprintf(run.out, "%s, %lld int4 linears): perplexity %.4f (%+.2f %% vs fp32 activations), mean KLD %.6f nats "
                 "(%+.6f), top-1 agreement %.2f %%\n",
                 run.opt_in.label, static_cast<long long>(run.opt_linears), r2.perplexity.ppl,
                 100.0 * (r2.perplexity.ppl / row.perplexity.ppl - 1.0), r2.mean_kld, r2.mean_kld - row.mean_kld,
                 100.0 * r2.top1_agreement);
    j[std::string(run.opt_in.short_name) + "_activations"] = ComparisonRowValue(r2);
  }
  if (!a->save_logits.empty()) std::fprintf(run.out, "saved the base model's logits to %s\n", a->save_logits.c_str());
  j["seconds"] = c->base.seconds;
  j["threads"] = nibble::NumThreads();
  if (a->json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

void PrintPlain(const Run& run, const nibble::PerplexityReport& r) {
  const PerplexityArgs* a = run.a;
  std::fprintf(run.out, "model: %s\ntext: %s\n", a->model.c_str(), a->text.c_str());
  std::fprintf(run.out, "protocol: GPTQ/AWQ (SPEC 6.1): whole text tokenized once, %s, non-overlapping windows of %lld tokens, "
               "remainder dropped, positions 1..%lld of each window scored\n",
               r.bos_prepended ? "one BOS at the start" : "no BOS", static_cast<long long>(r.seq_len),
               static_cast<long long>(r.seq_len - 1));
  std::fprintf(run.out, "tokens: %lld | windows: %lld of %lld | scored tokens: %lld | dropped tokens: %lld\n",
               static_cast<long long>(r.n_tokens), static_cast<long long>(r.n_windows),
               static_cast<long long>(r.n_windows_available), static_cast<long long>(r.scored_tokens),
               static_cast<long long>(r.dropped_tokens));
  std::fprintf(run.out, "mean NLL: %.6f nats/token\nperplexity: %.4f +/- %.5f (standard error)\n", r.mean_nll, r.ppl,
               r.ppl_stderr);
  if (!a->save_logits.empty()) std::fprintf(run.out, "saved logits to %s\n", a->save_logits.c_str());
  std::fprintf(stderr, "throughput: %.1f tokens/s (%.2f s, %s)\n", r.tokens_per_second, r.seconds,
               Plural(nibble::NumThreads(), "thread").c_str());
}

int RunPlain(const Run& run, const nibble::PerplexityOptions& opt) {
  const PerplexityArgs* a = run.a;
  nibble::PerplexityOptions o = opt;
  o.save_logits = a->save_logits;
  o.save_logits_format = a->save_logits_format;
  auto r = nibble::EvaluatePerplexity(*run.model, run.text, o);
  if (!r.ok()) return FailEval(a, r.error());
  PrintPlain(run, *r);
  nlohmann::ordered_json j = {{"model", a->model},
                              {"text", a->text},
                              {"activations", nibble::ActivationTypeName(run.model->info().activations)}};
  j["perplexity"] = PerplexityValue(*r);
  j["seconds"] = r->seconds;
  j["tokens_per_second"] = r->tokens_per_second;
  j["threads"] = nibble::NumThreads();
  if (!a->save_logits.empty()) j["saved_logits"] = a->save_logits;
  if (run.opt_in.on) {
    nibble::PerplexityOptions o2 = opt;
    o2.on_window = RunningPerplexityPrinter();
    auto r2 = nibble::EvaluatePerplexity(*run.model2, run.text, o2);
    if (!r2.ok()) return FailEval(a, r2.error());
    std::fprintf(run.out, "%s, %lld int4 linears): mean NLL %.6f, perplexity %.4f (%+.2f %% vs fp32 activations %.4f)\n",
                 run.opt_in.label, static_cast<long long>(run.opt_linears), r2->mean_nll, r2->ppl,
                 100.0 * (r2->ppl / r->ppl - 1.0), r->ppl);
    std::fprintf(stderr, "throughput (%s activations): %.1f tokens/s (%.2f s)\n", run.opt_in.short_name, r2->tokens_per_second,
                 r2->seconds);
    j[std::string(run.opt_in.short_name) + "_activations"] = PerplexityValue(*r2);
  }
  if (a->json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace

Runner RegisterPerplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Token perplexity of a text file (GPTQ/AWQ protocol, SPEC 6.1)");
  cmd->add_option("--model,-m,--model_dir", a->model, "Model directory")->required();
  cmd->add_option("--text,-f", a->text, "UTF-8 text file, evaluated as one string")->required();
  cmd->add_option("--seq_len", a->seq_len, "Window length in tokens (0 = min(2048, max_position_embeddings))")->capture_default_str();
  cmd->add_option("--max_windows", a->max_windows, "Evaluate only the first W windows (0 = all)")->capture_default_str()->check(AtLeast(0));
  AddThreadsOption(cmd, &a->threads);
  cmd->add_option("--kl_divergence_base", a->kl_base,
                  "Float model directory, or logits saved by --save_logits (a file, or a directory holding "
                  "nibble-logits.bin): also report KL(P_base || P_model) statistics and top-1 agreement on the same windows");
  cmd->add_option("--save_logits", a->save_logits,
                  "Write the logits of every scored position to FILE (a directory: DIR/nibble-logits.bin) for later "
                  "--kl_divergence_base runs; with a base model directory, the base's logits");
  cmd->add_option("--save_logits_format", a->save_logits_format,
                  "How --save_logits stores each position: fp32 (raw logits), uint16 (log-probs in 16 bits, as llama.cpp's "
                  "KL-divergence base) or topk:K (the K largest log-probs and the rest's mass; docs/FORMATS.md)")
      ->capture_default_str()
      ->needs("--save_logits");
  cmd->add_flag("--json", a->json, "Print a JSON object on stdout (the human text goes to stderr)");
  AddActivationsOption(cmd, &a->activations);
  AddTokenizerOption(cmd, &a->tokenizer);
  AddKvOptions(cmd, &a->kv, "default --seq_len (each window runs on a fresh cache; must be >= --seq_len)");
  cmd->add_flag("--int8_activations", a->int8,
                "Evaluate the same windows twice, fp32 then int8 activations in the int4 linears, and print the "
                "perplexity (and KLD) cost")
      ->excludes("--activations");
  cmd->add_flag("--bf16_activations", a->bf16,
                "Evaluate the same windows twice, fp32 then bf16 activations in the int4 linears, and print the "
                "perplexity (and KLD) cost")
      ->excludes("--int8_activations")
      ->excludes("--activations");
  return [a]() {
    // Flags first, before anything is loaded.
    if (nibble::Status v = nibble::ValidateWindowOptions(a->seq_len, a->max_windows, true); !v.ok())
      return UsageError(v.error().message);
    if (!a->save_logits.empty() && !a->kl_base.empty() && !nibble::FindSavedLogits(a->kl_base).empty())
      return UsageError("--save_logits: --kl_divergence_base reads saved logits, there is no base model to save");
    if (auto st = nibble::CheckSavedLogitsFormat(a->save_logits_format); !st.ok()) return UsageError(st.error().message);
    nibble::SetNumThreads(a->threads);
    // Ctrl-C from here on (loading included): the evaluation stops at its first check, exit 130.
    const CancelOnSignal interrupt;
    Run run{a.get(), "", nullptr, nullptr, {}, 0, a->json ? stderr : stdout, interrupt.token()};
    if (const std::string err = ReadTextFile(a->text, &run.text); !err.empty()) return Fail(err);
    // Comparing against an opt-in path: the first instance runs fp32 activations.
    nibble::LoadOptions lo1;
    lo1.activations = a->int8 || a->bf16 ? nibble::ActivationType::kFp32 : a->activations;
    lo1.tokenizer = a->tokenizer;
    ApplyKvArgs(a->kv, &lo1);
    auto model = nibble::Model::Load(a->model, lo1);
    if (!model.ok()) return Fail(model.error().message);
    PrintWarnings(a->model, (*model)->info().warnings);
    std::fprintf(stderr, "%s\n", nibble::LoadSummary((*model)->info()).c_str());
    if (const std::string err = ReportActivations(a->model, lo1.activations, (*model)->info()); !err.empty())
      return Fail(err);
    run.model = model->get();
    if (a->int8) run.opt_in = {true, "int8 activations (W4A8", "int8", nibble::ActivationType::kInt8};
    if (a->bf16) run.opt_in = {true, "bf16 activations (W4A16 bf16", "bf16", nibble::ActivationType::kBf16};
    // An opt-in path: a second instance of the model with those activations runs the same
    // windows; a model it cannot serve is refused before evaluating anything.
    std::unique_ptr<nibble::Model> model2;
    if (run.opt_in.on) {
      nibble::LoadOptions lo;
      lo.activations = run.opt_in.type;
      lo.tokenizer = a->tokenizer;
      ApplyKvArgs(a->kv, &lo);
      auto m2 = nibble::Model::Load(a->model, lo);
      if (!m2.ok()) return Fail(m2.error().message);
      model2 = std::move(*m2);
      run.model2 = model2.get();
      run.opt_linears = model2->info().activation_linears;
      if (run.opt_linears == 0) return Fail(a->int8 ? Int8NotServed(a->model) : Bf16NotServed(a->model));
      const std::string kept = KeptFp32Note(a->int8, (*model)->info().int4_linears, run.opt_linears);
      if (!kept.empty())
        std::fprintf(stderr, "%s: %s\n", a->int8 ? "--int8_activations" : "--bf16_activations", kept.c_str());
    }
    if (a->seq_len == 0) a->seq_len = std::min<int64_t>(2048, (*model)->info().max_position_embeddings);
    if (const std::string err = CheckWindowContext(**model, a->seq_len, a->kv); !err.empty()) return Fail(err);
    if (!a->kl_base.empty()) return RunAgainstBase(run);
    nibble::PerplexityOptions opt;
    opt.cancel = run.cancel;
    opt.seq_len = a->seq_len;
    opt.max_windows = a->max_windows;
    opt.on_window = RunningPerplexityPrinter();
    return RunPlain(run, opt);
  };
}

}  // namespace nibble_cli
