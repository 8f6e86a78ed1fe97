// `nibble quantize`: float HF checkpoint -> AMD Quark hf_format int4 checkpoint (Quark's flags).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/cancel_signal.h"
#include "support/eval_output.h"
#include "support/flags.h"
#include "support/progress.h"
#include "support/report.h"
#include "support/text.h"

namespace nibble_cli {

namespace {

struct QuantizeArgs {
  nibble::QuantizeRequest req;
  std::string max_shard_size = "5GB";
  bool exclude_given = false;
  int threads = 0;
  std::string report;
  bool json = false;
};

// "5GB" (decimal, as HF), "500MiB" (binary), or plain bytes: the library's one size parser.
bool ParseSize(const std::string& text, int64_t* out) {
  const nibble::Result<int64_t> v = nibble::ParseMemorySize(text);
  if (!v.ok() || *v <= 0) return false;
  *out = *v;
  return true;
}

// "Quantization algorithm: rtn | awq | gptq, or a chain run in order on each layer (awq,gptq)",
// the names from the library's registry.
std::string QuantAlgoHelp() {
  std::string names;
  for (const std::string& n : nibble::QuantAlgoNames()) names += (names.empty() ? "" : " | ") + n;
  return "Quantization algorithm: " + names + ", or a chain of them run in order on each layer (awq,gptq)";
}

// Per layer: the chosen ratio and loss of each AWQ mapping, GPTQ's damping where it was not the
// asked one, and the RTN -> method output errors.
void PrintCalibSummary(std::FILE* out, const nibble::QuantizeRequest& r, const nibble::QuantizeSummary& s) {
  const std::string& algo = s.quant_algo_label;
  std::fprintf(out, "%s: %lld calibration chunks x %lld tokens (%s), propagation %s%s, %.1f s\n", algo.c_str(),
               static_cast<long long>(s.calib_chunks), static_cast<long long>(s.calib_seq_len), r.dataset.c_str(),
               s.propagate.c_str(), r.awq_clip ? ", clip" : "", s.calib_seconds);
  if (s.hessian_peak_bytes > 0)
    std::fprintf(out, "  GPTQ Hessians: one layer at a time, at most %.1f MB for one input (K x K fp32 and its factorisation)\n",
                 static_cast<double>(s.hessian_peak_bytes) / 1e6);
  for (const auto& l : s.calib_layers) {
    std::fprintf(out, "  layer %lld (%.1f s):", static_cast<long long>(l.layer), l.seconds);
    for (const auto& m : l.mappings) {
      if (m.skipped) continue;
      std::string dst = m.layers.size() == 1 ? m.layers[0].substr(m.layers[0].rfind('.') + 1) : m.prev_op;
      std::fprintf(out, " [%s r=%.2f%s loss %.3g->%.3g]", dst.c_str(), m.ratio, m.duo ? "d" : "", m.loss_rtn, m.loss_best);
    }
    std::fprintf(out, "%soutput error RTN->%s:", l.mappings.empty() ? " " : "\n    ", algo.c_str());
    for (const auto& e : l.linears) {
      if (!e.quantized) continue;
      std::fprintf(out, " %s %.2e->%.2e", e.name.substr(e.name.rfind('.') + 1).c_str(), e.rtn_error, e.method_error);
      if (e.gptq && (e.retries > 0 || e.fallback_rtn))
        std::fprintf(out, e.fallback_rtn ? " (RTN: no damping factorised)" : " (damping %.4f after %d retries)",
                     e.dampening_frac, e.retries);
    }
    std::fprintf(out, "\n");
  }
}

// Layers quantized and kept, sizes, the worst weight error, shards and time.
void PrintExportSummary(std::FILE* out, const nibble::QuantizeRequest& r, const nibble::QuantizeSummary& s) {
  double worst = 0;
  std::string worst_name;
  for (const auto& l : s.layers)
    if (l.quantized && l.rel_error > worst) {
      worst = l.rel_error;
      worst_name = l.name;
    }
  std::fprintf(out, "quantized %lld of %zu linear layers (%s, algo %s) into %s\n",
               static_cast<long long>(s.size.quantized_linears), s.layers.size(),
               r.quant_config_file.empty() ? r.quant_scheme.c_str() : r.quant_config_file.c_str(), r.quant_algo.c_str(),
               r.output_dir.c_str());
  // One line per rule that decided: quantized layers counted, float ones named (a few of them).
  std::map<std::string, std::vector<std::string>> quantized_by, kept_by;
  for (const auto& l : s.layers) (l.quantized ? quantized_by : kept_by)[l.rule].push_back(l.name);
  if (quantized_by.size() > 1)
    for (const auto& [rule, names] : quantized_by)
      std::fprintf(out, "  quantized by %s: %s\n", rule.c_str(), Plural(names.size(), "layer").c_str());
  for (const auto& l : s.layers)
    if (l.name == "lm_head" && l.quantized && r.exclude_layers_given)
      std::fprintf(out, "  lm_head quantized: --exclude_layers replaced the default lm_head exclusion\n");
  for (const auto& [rule, names] : kept_by) {
    std::string list;
    for (size_t i = 0; i < names.size() && i < 3; ++i) list += (i ? ", " : "") + names[i];
    if (names.size() > 3) list += ", ...";
    std::fprintf(out, "  kept in float (%s): %s: %s\n", rule.c_str(), Plural(names.size(), "layer").c_str(),
                 list.c_str());
  }
  std::fprintf(out, "size: %s\n", nibble::FormatSize(s.size).c_str());
  if (s.size.quantized_linears > 0)
    std::fprintf(out, "worst relative weight error %.4f (%s)\n", worst, worst_name.c_str());
  if (!s.copied_files.empty()) {
    std::string files;
    for (const std::string& f : s.copied_files) files += (files.empty() ? "" : ", ") + f;
    std::fprintf(out, "copied from the input: %s\n", files.c_str());
  }
  if (s.calib_seconds > 0)
    std::fprintf(out, "wrote %lld shard(s); %.2f s in all (%s %.2f s)\n", static_cast<long long>(s.shards), s.seconds,
                 s.quant_algo.c_str(), s.calib_seconds);
  else
    std::fprintf(out, "wrote %lld shard(s) in %.2f s\n", static_cast<long long>(s.shards), s.seconds);
  if (s.peak_anon_bytes >= 0)
    std::fprintf(out, "memory: peak anonymous %.1f MB (%.1f MB at the start), peak file-backed %.1f MB, VmHWM %.1f MB\n",
                 static_cast<double>(s.peak_anon_bytes) / 1e6, static_cast<double>(s.start_anon_bytes) / 1e6,
                 static_cast<double>(s.peak_file_bytes) / 1e6, static_cast<double>(s.vm_hwm_bytes) / 1e6);
}

// --json: the summary as one object (the report file has the per-layer detail).
nlohmann::ordered_json SummaryJson(const nibble::QuantizeRequest& r, const nibble::QuantizeSummary& s) {
  nlohmann::ordered_json j;
  j["model_dir"] = r.model_dir;
  j["output_dir"] = r.output_dir;
  j["quant_algo"] = r.quant_algo;
  j["quant_scheme"] = r.quant_config_file.empty() ? r.quant_scheme : "";
  j["quant_config"] = r.quant_config_file;
  j["linear_layers"] = s.layers.size();
  j["size"] = SizeJson(s.size);
  nlohmann::ordered_json kept = nlohmann::ordered_json::array();
  double worst = 0;
  for (const auto& l : s.layers) {
    if (!l.quantized) kept.push_back({{"name", l.name}, {"rule", l.rule}});
    if (l.quantized) worst = std::max(worst, l.rel_error);
  }
  j["kept_in_float"] = kept;
  j["worst_relative_weight_error"] = worst;
  j["copied_files"] = s.copied_files;
  j["shards"] = s.shards;
  j["seconds"] = s.seconds;
  if (s.calibrated) j["calib_seconds"] = s.calib_seconds;
  j["peak_anon_bytes"] = s.peak_anon_bytes;
  j["peak_file_bytes"] = s.peak_file_bytes;
  j["plan"] = nlohmann::ordered_json::parse(s.plan_json);
  return j;
}

}  // namespace

Runner RegisterQuantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  auto& r = a->req;
  CLI::App* cmd = app.add_subcommand("quantize", "Quantize a float checkpoint to 4-bit weights (AMD Quark hf_format)");
  cmd->add_option("--model_dir,--model,-m", r.model_dir, "Input HF model directory (float weights)")->required();
  cmd->add_option("--output_dir,--out,-o", r.output_dir, "Output directory (written atomically)")->required();
  auto* scheme = cmd->add_option("--quant_scheme", r.quant_scheme,
                                 "w_uint4_per_group_asym | w_int4_per_group_sym | w_uint4_per_channel_asym | w_int4_per_channel_sym")
                     ->capture_default_str();
  auto* gs = cmd->add_option("--group_size", r.group_size, "Group size along in_features (per_group schemes)")->capture_default_str();
  cmd->add_option("--quant_algo", r.quant_algo, QuantAlgoHelp())->capture_default_str();
  cmd->add_option("--dataset", r.dataset, "Calibration data (awq, gptq): a text file (one text) or JSONL with a \"text\" field");
  cmd->add_option("--num_calib_data", r.num_calib_data, "Calibration chunks")->capture_default_str();
  cmd->add_option("--seq_len", r.seq_len, "Tokens per calibration chunk")->capture_default_str();
  cmd->add_option("--seed", r.seed, "Calibration chunk choice: 0 = the first chunks in order, else a seeded shuffle")->capture_default_str();
  cmd->add_flag("--awq_clip", r.awq_clip, "AWQ: AutoAWQ's weight-clipping search after scaling (off by default)");
  cmd->add_option("--propagate", r.propagate,
                  "Next layer's calibration input: the (smoothed) fp layer (fp) or the quantized layer (quantized); "
                  "default fp for awq, quantized for gptq and awq,gptq");
  cmd->add_option("--dampening_frac", r.dampening_frac, "GPTQ: damping added to the Hessian diagonal, a fraction of its mean")
      ->capture_default_str();
  cmd->add_option("--block_size", r.block_size, "GPTQ: columns per lazy batch update")->capture_default_str();
  cmd->add_option("--gptq_scale_timing", r.gptq_scale_timing,
                  "GPTQ group scales: up_front (llm-compressor) | dynamic (GPTQModel, refit at each group's first column)")
      ->capture_default_str();
  cmd->add_option("--actorder", r.actorder,
                  "GPTQ column order: none | static (largest Hessian diagonal first, natural g_idx) | group (needs g_idx)")
      ->capture_default_str();
  cmd->add_flag("--true_sequential", r.true_sequential,
                "GPTQ: Hessians of o_proj, gate/up, down_proj after the linears before them are quantized (GPTQModel)");
  cmd->add_option("--duo_scaling", r.duo_scaling, "AWQ grid: true | false | both (llm-compressor)")->capture_default_str();
  cmd->add_option("--n_grid", r.n_grid, "AWQ grid points")->capture_default_str();
  cmd->add_option("--calib_dtype", r.calib_dtype,
                  "AWQ, GPTQ: dtype of the calibration forward: auto (the model's torch_dtype) | bf16 | fp16 | fp32")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print the summary as a JSON object on stdout (the human text goes to stderr)");
  cmd->add_option("--report", a->report, "Write a JSON report (per layer AWQ ratios, losses, per-linear errors)");
  cmd->add_option("--model_export", r.model_export,
                  "Export format: hf_format (AMD Quark) | compressed-tensors (llm-compressor pack-quantized) | awq (AutoAWQ GEMM) | "
                  "gptq (AutoGPTQ / GPTQModel)")
      ->capture_default_str();
  cmd->add_option("--gptq_format", r.gptq_format,
                  "--model_export gptq zero points: v1 (checkpoint_format gptq, stores z - 1; no zero point 0) | v2 (gptq_v2)")
      ->capture_default_str();
  auto* pm = cmd->add_option("--pack_method", r.pack_method, "Nibble order: reorder (AWQ order) | order")->capture_default_str();
  auto* ex = cmd->add_option("--exclude_layers", r.exclude_layers,
                             "Layers kept in float: fnmatch patterns or re:REGEX (default: lm_head; give no value to exclude nothing)")
                 ->expected(0, -1);
  auto* lqc = cmd->add_option("--layer_quant_config", r.layer_quant_config,
                              "Per-layer override PATTERN:group_size=N[,quant_scheme=S] (first match wins)")
                  ->expected(1, -1);
  cmd->add_option("--quant_config", r.quant_config_file,
                  "A Quark quantization_config JSON file applied as written (instead of the scheme flags); its algo_config "
                  "may carry AWQ scaling_layers");
  cmd->add_option("--misaligned", r.misaligned,
                  "Layers whose in_features is not a multiple of group_size: error | exclude | per_channel")
      ->capture_default_str();
  cmd->add_option("--tp", r.tp, "Refuse up front a configuration vLLM would refuse at this tensor-parallel size")->check(AtLeast(1));
  AddMaxMemoryOption(cmd, &r.max_memory,
                     "Refuse, before the first layer, a run whose planned peak memory (the plan: line) exceeds this "
                     "(e.g. 20GB, 500MiB); default 90 % of MemAvailable");
  cmd->add_option("--max_shard_size", a->max_shard_size, "Largest safetensors shard, e.g. 5GB, 500MB, 200MiB")->capture_default_str();
  cmd->add_flag("--overwrite", r.overwrite, "Replace an existing output directory");
  cmd->add_flag("--resume", r.resume,
                "Continue a run of this --output_dir that was stopped (Ctrl-C, kill, power loss) after its last finished "
                "layer; the same flags are required, the output is the same");
  AddThreadsOption(cmd, &a->threads);
  return [a, cmd, scheme, gs, pm, ex, lqc]() {
    auto& r = a->req;
    r.exclude_layers_given = ex->count() > 0;
    if (!ParseSize(a->max_shard_size, &r.max_shard_size)) return UsageError("--max_shard_size \"" + a->max_shard_size + "\" is not a size like 5GB or 200MiB");
    if (!r.quant_config_file.empty()) {
      for (CLI::Option* o : {scheme, gs, pm, ex, lqc})
        if (o->count() > 0) return UsageError("--quant_config is applied as written; do not combine it with " + o->get_name());
    }
    if (gs->count() > 0 && r.quant_scheme.find("per_channel") != std::string::npos)
      return UsageError("--group_size does not apply to " + r.quant_scheme + " (one scale per output row)");
    if (!a->report.empty()) {  // checked before quantizing, so a long AWQ run does not end in this error
      std::error_code ec;
      const std::filesystem::path parent = std::filesystem::absolute(a->report, ec).parent_path();
      if (ec || !std::filesystem::is_directory(parent, ec))
        return Fail("--report " + a->report + ": directory " + parent.string() + " does not exist");
      if (std::filesystem::is_directory(a->report, ec)) return Fail("--report " + a->report + " is a directory");
    }
    (void)cmd;
    nibble::SetNumThreads(a->threads);
    // Each layer's stages with elapsed time, ETA and RSS: one line redrawn on a terminal, a line
    // per stage in logs; the calibrated algorithms' per-layer log lines (LayerLog) too.
    nibble::StageProgress stages(r.quant_algo);
    r.on_stage = [&stages](const nibble::QuantizeStage& st) {
      stages.Update(st.layer, st.layers, st.layers_done, st.stage, st.rss_anon_bytes);
    };
    r.on_layer = nibble::LayerLog(r.quant_algo + " layers");
    r.on_plan = [&stages](const std::string& line) {
      stages.Finish();
      std::fprintf(stderr, "%s\n", line.c_str());
    };
    r.on_message = [&stages](const std::string& m) {
      stages.Finish();
      std::fprintf(stderr, "%s\n", m.c_str());
    };
    r.resumable = true;  // a stopped run keeps its finished layers for --resume
    const CancelOnSignal interrupt;  // Ctrl-C: stops at the next check, exit 130
    r.cancel = interrupt.token();
    auto s = nibble::Quantize(r);
    stages.Finish();
    if (!s.ok()) return FailStatus(s.error());
    if (!std::filesystem::exists(std::filesystem::path(r.model_dir) / "tokenizer.model") &&
        !std::filesystem::exists(std::filesystem::path(r.model_dir) / "tokenizer.json"))
      std::fprintf(stderr, "warning: %s has no tokenizer.model or tokenizer.json; the output cannot run generate or "
                   "perplexity\n", r.model_dir.c_str());
    if (!a->report.empty()) {
      const nibble::Status w = nibble::WriteFileAtomically(a->report, s->report_json);
      if (!w.ok()) return Fail("cannot write report: " + w.error().message);
    }
    std::FILE* out = a->json ? stderr : stdout;
    if (s->calibrated) PrintCalibSummary(out, r, *s);
    PrintExportSummary(out, r, *s);
    if (a->json) std::printf("%s\n", SummaryJson(r, *s).dump(2).c_str());
    return 0;
  };
}

}  // namespace nibble_cli
