// `nibble compare`: the FP / RTN / AWQ / GPTQ table in one run — size, perplexity, KL(P_fp || P_q)
// statistics and top-1 agreement of each quantized model against the float model, on the same
// tokens and windows; the float model run now (--model) or read from saved logits. --methods
// quantizes the float model with each method first (into a temporary directory or --keep DIR)
// and adds the quantization time.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/cancel_signal.h"
#include "support/eval_output.h"
#include "support/flags.h"
#include "support/progress.h"
#include "support/text.h"

namespace nibble_cli {

namespace {
struct CompareArgs {
  std::string model, text, kl_base, save_logits, save_logits_format = "fp32";
  std::vector<std::string> quantized;
  int64_t seq_len = 512, max_windows = 60;
  KvArgs kv;
  int threads = 0;
  bool json = false;
  // --methods: quantize --model with each of these first, with the request's scheme and data.
  std::string methods, keep;
  nibble::QuantizeRequest quant;
};

// One method's quantization run, for the methods table.
struct MethodRun {
  std::string method, dir;
  double seconds = 0;
  int64_t bytes = 0;
};

// One entry of --methods: as written (the directory and the table's name) and as the algorithm
// registry reads it.
struct Method {
  std::string text;
  nibble::QuantAlgoInfo algo;
};

// Splits "rtn,awq,gptq,awq+gptq"; each must be a known algorithm or chain (DescribeQuantAlgo).
nibble::Result<std::vector<Method>> ParseMethods(const std::string& text) {
  std::vector<Method> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string m = text.substr(pos, comma - pos);
    auto info = nibble::DescribeQuantAlgo(m);
    if (!info.ok())
      return nibble::Error{"--methods: \"" + m + "\" is not a method: " + info.error().message,
                           nibble::ErrorCode::kInvalidArgument};
    out.push_back({m, std::move(info).value()});
    pos = comma + 1;
  }
  return out;
}

// Quantizes a.model with every method into `root`/<method>, one after the other, each with a
// progress line; the directories join the compared models.
nibble::Result<std::vector<MethodRun>> QuantizeMethods(const CompareArgs& a, const std::string& root) {
  auto parsed = ParseMethods(a.methods);
  if (!parsed.ok()) return parsed.error();
  std::vector<std::string> methods;
  std::vector<nibble::QuantAlgoInfo> algos;
  for (Method& m : *parsed) {
    methods.push_back(m.text);
    algos.push_back(std::move(m.algo));
  }
  std::vector<MethodRun> runs;
  for (size_t i = 0; i < methods.size(); ++i) {
    nibble::QuantizeRequest r = a.quant;
    r.model_dir = a.model;
    r.quant_algo = algos[i].name;
    if (!algos[i].calibrated) r.dataset.clear();
    r.output_dir = (std::filesystem::path(root) / methods[i]).string();
    r.overwrite = true;
    std::fprintf(stderr, "compare: quantizing with %s (%zu of %zu)\n", methods[i].c_str(), i + 1, methods.size());
    std::unique_ptr<nibble::ProgressBar> bar;
    int64_t bar_total = -1;
    const bool calibrated = algos[i].calibrated;
    r.progress = [&bar, &bar_total, &methods, i, calibrated](int64_t done, int64_t total) {
      if (!bar || total != bar_total) {
        bar = std::make_unique<nibble::ProgressBar>(methods[i] + (calibrated ? " steps" : ""), total, true, !calibrated);
        bar_total = total;
      }
      bar->Update(done);
    };
    r.on_layer = nibble::LayerLog(methods[i] + " layers");
    r.on_message = [&bar](const std::string& m) {
      if (bar) bar->Finish();
      std::fprintf(stderr, "%s\n", m.c_str());
    };
    auto s = nibble::Quantize(r);
    bar.reset();
    if (!s.ok()) {
      if (s.error().code == nibble::ErrorCode::kCancelled) return s.error();
      return s.error().WithContext("--methods " + methods[i]);
    }
    std::fprintf(stderr, "compare: %s took %.1f s\n", methods[i].c_str(), s->seconds);
    runs.push_back({methods[i], r.output_dir, s->seconds, s->total_bytes});
  }
  return runs;
}

// The methods table: what the float model and each method give, with their time and size.
void PrintMethodsTable(std::FILE* out, const nibble::ComparisonReport& r, const std::vector<MethodRun>& runs,
                       size_t first_row) {
  std::fprintf(out, "\n%-10s %8s %10s %9s %10s %9s %8s %12s\n", "method", "bits/w", "PPL", "+/-", "mean KLD", "+/-",
               "top-1 %", "quantize s");
  std::fprintf(out, "%-10s %8s %10.4f %9.5f %10s %9s %8s %12s\n", "fp", "16", r.base.ppl, r.base.ppl_stderr, "-", "-", "-", "-");
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& row = r.rows[first_row + i];
    auto size = nibble::Inspect(runs[i].dir);
    std::fprintf(out, "%-10s %8.2f %10.4f %9.5f %10.6f %9.6f %8.3f %12.1f\n", runs[i].method.c_str(),
                 size.ok() ? size->size.bits_per_weight() : 0.0, row.perplexity.ppl, row.perplexity.ppl_stderr,
                 row.mean_kld, row.mean_kld_error, 100.0 * row.top1_agreement, runs[i].seconds);
  }
}

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
  j["base_perplexity"] = PerplexityValue(r.base);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.rows.size(); ++i) {
    nlohmann::ordered_json row = ComparisonRowValue(r.rows[i]);
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
  nibble::LoadOptions lo;
  ApplyKvArgs(a.kv, &lo);
  auto base = nibble::Model::Load(a.model, lo);
  if (!base.ok()) return base.error();
  PrintWarnings(a.model, (*base)->info().warnings);
  opt.save_logits = a.save_logits;
  opt.save_logits_format = a.save_logits_format;
  return nibble::CompareModels(**base, models, text, opt);
}
}  // namespace

Runner RegisterCompare(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand("compare", "Perplexity, KLD statistics and top-1 agreement of quantized models vs the float model");
  auto* m = cmd->add_option("--model,-m,--model_dir", a->model, "Float (reference) model directory");
  auto* kb = cmd->add_option("--kl_divergence_base", a->kl_base,
                             "Logits of the float model saved by --save_logits (a file, or a directory holding "
                             "nibble-logits.bin), read instead of running --model");
  m->excludes(kb);
  cmd->add_option("--save_logits", a->save_logits,
                  "Also write the float model's logits to FILE (a directory: DIR/nibble-logits.bin) for --kl_divergence_base")
      ->excludes(kb);
  cmd->add_option("--save_logits_format", a->save_logits_format,
                  "How --save_logits stores each position: fp32 (raw logits), uint16 (log-probs in 16 bits, as llama.cpp's "
                  "KL-divergence base) or topk:K (the K largest log-probs and the rest's mass; docs/FORMATS.md)")
      ->capture_default_str()
      ->needs("--save_logits");
  cmd->add_option("--quantized,-q", a->quantized, "Quantized model directories")->expected(1, -1);
  cmd->add_option("--text,-f", a->text, "UTF-8 text file, evaluated as one string")->required();
  cmd->add_option("--seq_len", a->seq_len, "Window length in tokens")->capture_default_str();
  cmd->add_option("--max_windows", a->max_windows, "Evaluate only the first W windows (0 = all)")->capture_default_str()->check(AtLeast(0));
  AddThreadsOption(cmd, &a->threads);
  AddKvOptions(cmd, &a->kv, "default --seq_len (each window runs on a fresh cache; must be >= --seq_len)");
  cmd->add_flag("--json", a->json, "Print a JSON object on stdout (the human text goes to stderr)");
  cmd->add_option("--methods", a->methods, "Quantize --model first with each of rtn,awq,gptq,awq+gptq and compare them");
  cmd->add_option("--keep", a->keep, "--methods: write the checkpoints to DIR/<method> (default: a temporary directory, removed)");
  cmd->add_option("--dataset", a->quant.dataset, "--methods: calibration data for awq / gptq");
  cmd->add_option("--quant_scheme", a->quant.quant_scheme, "--methods: the scheme every method uses")->capture_default_str();
  cmd->add_option("--group_size", a->quant.group_size, "--methods: group size")->capture_default_str();
  cmd->add_option("--num_calib_data", a->quant.num_calib_data, "--methods: calibration chunks")->capture_default_str();
  cmd->add_option("--calib_seq_len", a->quant.seq_len, "--methods: tokens per calibration chunk")->capture_default_str();
  cmd->add_option("--misaligned", a->quant.misaligned, "--methods: layers whose in_features is not a multiple of group_size: "
                  "error | exclude | per_channel")->capture_default_str();
  return [a]() {
    if (a->model.empty() && a->kl_base.empty()) return UsageError("compare: give the float model (--model) or its saved logits (--kl_divergence_base)");
    if (a->quantized.empty() && a->methods.empty()) return UsageError("compare: give --quantized DIR... or --methods LIST");
    if (!a->methods.empty() && a->model.empty()) return UsageError("compare: --methods quantizes the float model: give --model");
    if (nibble::Status v = nibble::ValidateWindowOptions(a->seq_len, a->max_windows, false); !v.ok())
      return UsageError(v.error().message);
    if (!a->methods.empty()) {  // the method list and its calibration data, before the first method runs
      auto methods = ParseMethods(a->methods);
      if (!methods.ok()) return UsageError(methods.error().message);
      for (const Method& m : *methods)
        if (m.algo.calibrated && a->quant.dataset.empty())
          return UsageError("--methods " + m.text + " needs calibration data: --dataset FILE");
    }
    if (auto st = nibble::CheckSavedLogitsFormat(a->save_logits_format); !st.ok()) return UsageError(st.error().message);
    nibble::SetNumThreads(a->threads);
    std::string text;
    if (const std::string err = ReadTextFile(a->text, &text); !err.empty()) return Fail(err);
    const CancelOnSignal interrupt;  // Ctrl-C: quantizing or comparing stops, exit 130
    a->quant.cancel = interrupt.token();
    std::vector<MethodRun> runs;
    std::string tmp_root;
    if (!a->methods.empty()) {
      std::error_code ec;
      tmp_root = a->keep.empty() ? (std::filesystem::temp_directory_path() / ("nibble-compare-" + std::to_string(::getpid()))).string() : "";
      const std::string root = a->keep.empty() ? tmp_root : a->keep;
      std::filesystem::create_directories(root, ec);
      if (ec) return Fail("--keep " + root + ": cannot create the directory (" + ec.message() + ")");
      auto r = QuantizeMethods(*a, root);
      if (!r.ok()) {
        if (!tmp_root.empty()) std::filesystem::remove_all(tmp_root, ec);
        return r.error().code == nibble::ErrorCode::kCancelled ? FailStatus(r.error()) : Fail(r.error().message);
      }
      runs = std::move(r).value();
    }
    const size_t first_method_row = a->quantized.size();
    for (const auto& run : runs) a->quantized.push_back(run.dir);
    std::vector<std::unique_ptr<nibble::Model>> owned;
    std::vector<const nibble::Model*> models;
    for (const auto& d : a->quantized) {
      nibble::LoadOptions lo;
      ApplyKvArgs(a->kv, &lo);
      auto m = nibble::Model::Load(d, lo);
      if (!m.ok()) return Fail(m.error().message);
      PrintWarnings(d, (*m)->info().warnings);
      if (const std::string err = CheckWindowContext(**m, a->seq_len, a->kv); !err.empty()) return Fail(d + ": " + err);
      owned.push_back(std::move(m).value());
      models.push_back(owned.back().get());
    }
    std::unique_ptr<nibble::ProgressBar> bar;
    nibble::CompareOptions opt;
    opt.seq_len = a->seq_len;
    opt.max_windows = a->max_windows;
    opt.cancel = interrupt.token();
    opt.progress = [&bar](int64_t done, int64_t total) {
      if (!bar) bar = std::make_unique<nibble::ProgressBar>("compare", total);
      bar->Update(done);
    };
    auto r = RunComparison(*a, text, models, opt);
    bar.reset();
    if (!r.ok()) {
      if (!tmp_root.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(tmp_root, ec);
      }
      return r.error().code == nibble::ErrorCode::kCancelled ? FailStatus(r.error()) : Fail(a->text + ": " + r.error().message);
    }
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
    if (!runs.empty()) PrintMethodsTable(out, *r, runs, first_method_row);
    if (a->json) {
      nlohmann::ordered_json j = ToJson(*a, *r, sizes);
      for (size_t i = 0; i < runs.size(); ++i) {
        j["models"][first_method_row + i]["method"] = runs[i].method;
        j["models"][first_method_row + i]["quantize_seconds"] = runs[i].seconds;
      }
      std::printf("%s\n", j.dump(2).c_str());
    }
    if (!tmp_root.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(tmp_root, ec);
    }
    return 0;
  };
}

}  // namespace nibble_cli
