// Public API: flags in Quark's vocabulary -> QuarkQuantConfig -> quantize pipeline; inspect.
#include <algorithm>
#include <cstdlib>
#include <tuple>

#include <nibble/quantize.h>

#include "api/model_impl.h"
#include "api/size.h"
#include "base/sha256.h"
#include "formats/checkpoint_format.h"
#include "formats/quark_config.h"
#include "io/file.h"
#include "io/staging_dir.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/model_loader.h"
#include "base/memory.h"
#include "kernels/int4_dispatch.h"
#include "quantize/quantize.h"

namespace nibble {

namespace {

Result<WeightQuantSpec> SpecForScheme(const std::string& scheme, int64_t group_size) {
  WeightQuantSpec s;
  if (scheme == "w_uint4_per_group_asym" || scheme == "w_uint4_per_channel_asym") {
    s.dtype = QuantDType::kUint4;
    s.symmetric = false;
  } else if (scheme == "w_int4_per_group_sym" || scheme == "w_int4_per_channel_sym") {
    s.dtype = QuantDType::kInt4;
    s.symmetric = true;
  } else {
    return MakeErrorCode(ErrorCode::kUnsupported, "--quant_scheme \"", scheme,
                     "\" is not supported (supported: w_uint4_per_group_asym, w_int4_per_group_sym, "
                     "w_uint4_per_channel_asym, w_int4_per_channel_sym)");
  }
  if (scheme.find("per_channel") != std::string::npos) {
    s.qscheme = QScheme::kPerChannel;
    s.ch_axis = 0;
    s.group_size = -1;
    s.observer_cls = "PerChannelMinMaxObserver";
  } else {
    if (group_size != -1 && group_size <= 0)
      return MakeError("--group_size ", group_size, " must be a positive integer (or -1 for a whole row)");
    s.qscheme = QScheme::kPerGroup;
    s.ch_axis = 1;
    s.group_size = group_size;
  }
  return s;
}

// "PATTERN:key=value[,key=value]" -> (pattern, spec derived from the global one).
Result<std::pair<std::string, WeightQuantSpec>> ParseLayerOverride(const std::string& text, const std::string& scheme,
                                                                    int64_t group_size) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return MakeError("--layer_quant_config \"", text, "\": expected PATTERN:key=value[,key=value] (keys: group_size, quant_scheme)");
  const std::string pattern = text.substr(0, colon);
  std::string sch = scheme;
  int64_t g = group_size;
  std::string rest = text.substr(colon + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    const std::string kv = rest.substr(pos, comma - pos);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) return MakeError("--layer_quant_config \"", text, "\": \"", kv, "\" is not key=value");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "group_size") {
      char* end = nullptr;
      g = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') return MakeError("--layer_quant_config \"", text, "\": group_size \"", value, "\" is not an integer");
    } else if (key == "quant_scheme") {
      sch = value;
    } else {
      return MakeError("--layer_quant_config \"", text, "\": unknown key \"", key, "\" (keys: group_size, quant_scheme)");
    }
    pos = comma + 1;
  }
  auto spec = SpecForScheme(sch, g);
  if (!spec.ok()) return spec.error().WithContext("--layer_quant_config \"" + text + "\"");
  return std::pair{pattern, *spec};
}

// The request's exclude list: empty entries dropped (`--exclude_layers` with no value means
// "exclude nothing"), and the default lm_head exclusion lifted by an override that names lm_head.
std::vector<std::string> ExcludeFromRequest(const QuantizeRequest& r, std::vector<std::string>* notes) {
  std::vector<std::string> out;
  for (const std::string& e : r.exclude_layers)
    if (!e.empty()) out.push_back(e);
  if (r.exclude_layers_given || !r.quant_config_file.empty()) return out;
  for (const std::string& o : r.layer_quant_config) {
    const std::string pattern = o.substr(0, o.rfind(':'));
    if (!LayerKeyMatches("lm_head", pattern)) continue;
    out.erase(std::remove(out.begin(), out.end(), std::string("lm_head")), out.end());
    notes->push_back("note: --layer_quant_config \"" + o + "\" quantizes lm_head: an explicit override lifts the "
                     "default lm_head exclusion");
    break;
  }
  return out;
}

Result<QuarkQuantConfig> ConfigFromRequest(const QuantizeRequest& r, std::vector<std::string>* notes) {
  if (!r.quant_config_file.empty()) {
    NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(r.quant_config_file));
    NIBBLE_RETURN_IF_ERROR(ParseJsonText(text, r.quant_config_file));  // duplicate keys, syntax
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
    if (j.is_object() && j.contains("quantization_config")) j = j["quantization_config"];
    NIBBLE_RETURN_IF_ERROR(CheckQuarkConfigKeys(j, r.quant_config_file));
    NIBBLE_ASSIGN_OR_RETURN(QuarkQuantConfig c, ParseQuarkQuantConfig(j, r.quant_config_file));
    c.calibration = nullptr;  // it records a past run; this run writes its own
    return c;
  }
  QuarkQuantConfig c;
  NIBBLE_ASSIGN_OR_RETURN(c.global, SpecForScheme(r.quant_scheme, r.group_size));
  for (const auto& o : r.layer_quant_config) {
    NIBBLE_ASSIGN_OR_RETURN(auto entry, ParseLayerOverride(o, r.quant_scheme, r.group_size));
    c.layer_quant_config.emplace_back(entry.first, entry.second);
  }
  c.exclude = ExcludeFromRequest(r, notes);
  if (r.pack_method == "reorder") c.export_config.pack_method = PackMethod::kReorder;
  else if (r.pack_method == "order") c.export_config.pack_method = PackMethod::kOrder;
  else return MakeErrorCode(ErrorCode::kUnsupported, "--pack_method \"", r.pack_method, "\" is not supported (supported: reorder, order)");
  c.algo_config = nullptr;
  c.quant_mode = "eager_mode";
  // Validate through the same parser a loader uses (exclude regexes, spec invariants).
  return ParseQuarkQuantConfig(ToJson(c), "quantize flags");
}

}  // namespace

// One AWQ mapping's outcome for the report.
static nlohmann::ordered_json MappingJson(const AwqMappingSummary& m) {
  nlohmann::ordered_json mj;
  mj["prev_op"] = m.prev_op;
  mj["layers"] = m.layers;
  mj["skipped"] = m.skipped;
  if (m.skipped) {
    mj["skip_reason"] = m.skip_reason;
  } else {
    mj["ratio"] = m.ratio;
    mj["duo"] = m.duo;
    mj["loss_rtn"] = m.loss_rtn;
    mj["loss_best"] = m.loss_best;
    mj["rejected_candidates"] = m.rejected;
    mj["stopped_early_candidates"] = m.stopped_early;
    mj["scale_min"] = m.scale_min;
    mj["scale_max"] = m.scale_max;
  }
  return mj;
}

// Per decoder layer of a calibrated run: AWQ mappings, per-linear output errors and GPTQ damping.
static nlohmann::ordered_json CalibLayersJson(const QuantizeSummary& s) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : s.calib_layers) {
    nlohmann::ordered_json lj;
    lj["layer"] = l.layer;
    lj["seconds"] = l.seconds;
    nlohmann::ordered_json maps = nlohmann::ordered_json::array();
    for (const auto& m : l.mappings) maps.push_back(MappingJson(m));
    lj["mappings"] = maps;
    nlohmann::ordered_json lins = nlohmann::ordered_json::array();
    for (const auto& e : l.linears) {
      nlohmann::ordered_json ej = {{"name", e.name}, {"quantized", e.quantized}, {"rtn_output_error", e.rtn_error},
                                   {"method_output_error", e.method_error}};
      if (e.gptq)
        ej["gptq"] = {{"dampening_frac", e.dampening_frac}, {"retries", e.retries},
                      {"dead_columns", e.dead_columns}, {"fallback_rtn", e.fallback_rtn}};
      lins.push_back(ej);
    }
    lj["linears"] = lins;
    layers.push_back(lj);
  }
  return layers;
}

// The `--report` JSON: request, calibration, each algorithm's settings as run (`algorithms`:
// AlgorithmPlan::ReportJson), per layer (AWQ, GPTQ), export per linear.
static std::string QuantizeReportJson(const QuantizeRequest& r, const QuantizeSummary& s,
                                      const nlohmann::ordered_json& algorithms) {
  nlohmann::ordered_json j;
  j["nibble_report"] = "quantize";
  j["version"] = 2;
  j["model_dir"] = r.model_dir;
  j["output_dir"] = r.output_dir;
  j["quant_algo"] = s.quant_algo;
  j["quant_scheme"] = r.quant_config_file.empty() ? r.quant_scheme : "from --quant_config " + r.quant_config_file;
  j["group_size"] = r.group_size;
  j["seconds"] = s.seconds;
  if (s.calibrated) {
    j["calibrated"] = {{"seconds", s.calib_seconds}, {"propagate", s.propagate}};
    for (const auto& [name, section] : algorithms.items()) j[name] = section;
    j["calibration"] = {{"dataset", r.dataset}, {"chunks", s.calib_chunks}, {"seq_len", s.calib_seq_len},
                        {"available_chunks", s.calib_available_chunks}, {"stream_tokens", s.calib_total_tokens},
                        {"seed", r.seed}, {"selection", r.seed == 0 ? "first chunks in order" : "seeded shuffle"}};
    j["calib_layers"] = CalibLayersJson(s);
  }
  nlohmann::ordered_json lins = nlohmann::ordered_json::array();
  for (const auto& l : s.layers)
    lins.push_back({{"name", l.name}, {"rule", l.rule}, {"scheme", l.scheme}, {"quantized", l.quantized},
                    {"n", l.n}, {"k", l.k}, {"bytes_in", l.bytes_in}, {"bytes_out", l.bytes_out},
                    {"rel_weight_error", l.rel_error}});
  j["linears"] = lins;
  j["messages"] = s.messages;
  j["memory"] = {{"start_anon_bytes", s.start_anon_bytes}, {"peak_anon_bytes", s.peak_anon_bytes},
                 {"peak_file_bytes", s.peak_file_bytes}, {"vm_hwm_bytes", s.vm_hwm_bytes}};
  j["plan"] = nlohmann::ordered_json::parse(s.plan_json);
  return j.dump(2) + "\n";
}

// The algorithm flags of a request onto o, parsed into their types; the plan checks them, with
// any algo_config entry over them, once (quantize/algorithm.h: ResolveAlgorithms).
static Status AlgorithmOptions(const QuantizeRequest& r, QuantizeOptions& o) {
  AlgorithmFlags& f = o.algorithms;
  if (r.propagate == "fp") f.propagation = Propagation::kFp;
  else if (r.propagate == "quantized") f.propagation = Propagation::kQuantized;
  else if (!r.propagate.empty())
    return MakeErrorCode(ErrorCode::kUnsupported, "--propagate \"", r.propagate, "\" is not supported (supported: fp, quantized)");
  f.awq.clip = r.awq_clip;
  NIBBLE_ASSIGN_OR_RETURN(f.awq.duo_scaling, ParseDuoScaling(r.duo_scaling, "--duo_scaling"));
  f.awq.n_grid = r.n_grid;
  f.gptq.dampening_frac = r.dampening_frac;
  f.gptq.block_size = r.block_size;
  NIBBLE_ASSIGN_OR_RETURN(f.gptq.scale_timing, ParseGptqScaleTiming(r.gptq_scale_timing, "--gptq_scale_timing"));
  NIBBLE_ASSIGN_OR_RETURN(f.gptq.actorder, ParseGptqActOrder(r.actorder, "--actorder"));
  f.gptq.true_sequential = r.true_sequential;
  NIBBLE_ASSIGN_OR_RETURN(f.calib_dtype, ParseCalibDType(r.calib_dtype, "--calib_dtype"));
  return Status::Ok();
}

// One decoder layer's summary from the run's report.
static CalibLayerSummary LayerSummary(const CalibLayerResult& l) {
  CalibLayerSummary ls;
  ls.layer = l.layer;
  ls.seconds = l.seconds;
  for (const auto& m : l.mappings)
    ls.mappings.push_back({m.mapping.prev_op, m.mapping.layers, m.skipped, m.skip_reason, m.ratio, m.duo, m.loss_rtn,
                           m.loss_best, m.rejected, m.stopped_early, m.scale_min, m.scale_max});
  for (size_t i = 0; i < l.linears.size(); ++i) {
    const auto& e = l.linears[i];
    CalibLayerSummary::Linear li{e.name, e.quantized, e.rtn_error, e.method_error};
    if (i < l.gptq.size() && l.gptq[i].ran) {
      const GptqLinearInfo& g = l.gptq[i];
      li.gptq = true;
      li.dampening_frac = g.dampening_frac;
      li.retries = g.retries;
      li.dead_columns = g.dead_columns;
      li.fallback_rtn = g.fallback_rtn;
    }
    ls.linears.push_back(li);
  }
  return ls;
}

Result<QuantAlgoInfo> DescribeQuantAlgo(const std::string& quant_algo) {
  NIBBLE_ASSIGN_OR_RETURN(std::vector<const QuantAlgorithm*> chain, ParseAlgorithmChain(quant_algo));
  AlgorithmPlan plan;  // the names alone: no settings
  for (const QuantAlgorithm* a : chain) plan.chain.push_back({a, nullptr});
  return QuantAlgoInfo{plan.Name(), plan.Label(), plan.Calibrated()};
}

std::vector<std::string> QuantAlgoNames() {
  std::vector<std::string> names;
  for (const QuantAlgorithm& a : QuantAlgorithms()) names.emplace_back(a.name);
  return names;
}

// The flags that decide the output's bytes, by flag name, for a resumed run to match (the thread
// count and the report's flags do not change them).
Result<nlohmann::ordered_json> ResumeSettings(const QuantizeRequest& r) {
  nlohmann::ordered_json j;
  j["--quant_scheme"] = r.quant_scheme;
  j["--group_size"] = r.group_size;
  j["--quant_algo"] = r.quant_algo;
  j["--model_export"] = r.model_export;
  j["--gptq_format"] = r.gptq_format;
  j["--pack_method"] = r.pack_method;
  j["--exclude_layers"] = r.exclude_layers;
  j["--exclude_layers given"] = r.exclude_layers_given;
  j["--layer_quant_config"] = r.layer_quant_config;
  j["--quant_config"] = r.quant_config_file;
  if (!r.quant_config_file.empty()) {
    NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(r.quant_config_file));
    j["--quant_config (SHA-256 of its contents)"] = Sha256Hex(text);
  }
  j["--misaligned"] = r.misaligned;
  j["--max_shard_size"] = r.max_shard_size;
  j["--dataset"] = r.dataset;
  j["--num_calib_data"] = r.num_calib_data;
  j["--seq_len"] = r.seq_len;
  j["--seed"] = r.seed;
  j["--awq_clip"] = r.awq_clip;
  j["--propagate"] = r.propagate;
  j["--duo_scaling"] = r.duo_scaling;
  j["--n_grid"] = r.n_grid;
  j["--dampening_frac"] = r.dampening_frac;
  j["--block_size"] = r.block_size;
  j["--gptq_scale_timing"] = r.gptq_scale_timing;
  j["--actorder"] = r.actorder;
  j["--true_sequential"] = r.true_sequential;
  j["--calib_dtype"] = r.calib_dtype;
  // A calibrated run's GEMMs take the CPU's kernels (oneDNN's bf16 matmul where it has one, the
  // sgemm otherwise): their summation order is part of the bytes.
  if (r.quant_algo != "rtn") {
    const CpuFeatures cpu = DetectCpuFeatures();
    j["CPU (calibration GEMMs)"] = cpu.vendor + (cpu.avx512f ? " avx512" : cpu.avx2 ? " avx2" : "") +
                                   (cpu.avx512bf16 ? " avx512_bf16" : "") + (cpu.amx_bf16 ? " amx_bf16" : "");
  }
  return j;
}

Result<QuantizeSummary> Quantize(const QuantizeRequest& r) {
  NIBBLE_RETURN_IF_ERROR(CheckThreads(r.threads));
  ScopedThreads threads(r.threads);
  QuantizeOptions o;
  o.model_dir = r.model_dir;
  o.output_dir = r.output_dir;
  std::vector<std::string> notes;
  NIBBLE_ASSIGN_OR_RETURN(o.config, ConfigFromRequest(r, &notes));
  for (const std::string& n : notes)
    if (r.on_message) r.on_message(n);
  o.quant_algo = r.quant_algo;
  o.model_export = r.model_export;
  o.gptq_format = r.gptq_format;
  if (r.gptq_format != "v1" && r.gptq_format != "v2")  // checked for every export, not only when it is used
    return MakeErrorCode(ErrorCode::kUnsupported, "--gptq_format \"", r.gptq_format, "\" is not supported (supported: v1, v2)");
  if (r.misaligned == "error") o.misaligned = MisalignedPolicy::kError;
  else if (r.misaligned == "exclude") o.misaligned = MisalignedPolicy::kExclude;
  else if (r.misaligned == "per_channel") o.misaligned = MisalignedPolicy::kPerChannel;
  else return MakeErrorCode(ErrorCode::kUnsupported, "--misaligned \"", r.misaligned, "\" is not supported (supported: error, exclude, per_channel)");
  o.note_replaced_head_exclusion = r.exclude_layers_given && r.quant_config_file.empty();
  if (r.max_shard_size <= 0) return MakeError("--max_shard_size must be positive");
  o.max_shard_size = r.max_shard_size;
  o.overwrite = r.overwrite;
  o.tp = r.tp;
  o.progress = r.progress;
  o.on_layer = r.on_layer;
  if (r.on_stage)
    o.on_stage = [&r](int64_t layer, int64_t layers, int64_t done, const std::string& stage) {
      r.on_stage(QuantizeStage{layer, layers, done, stage, ReadProcessMemory().anon});
    };
  if (r.on_plan) o.on_plan = [&r](const ResourcePlan& p) { r.on_plan(ResourcePlanLine(p)); };
  o.max_memory = r.max_memory;
  o.message = r.on_message;
  o.cancel = r.cancel;
  o.dataset = r.dataset;
  o.num_calib_data = r.num_calib_data;
  o.calib_seq_len = r.seq_len;
  o.seed = r.seed;
  NIBBLE_RETURN_IF_ERROR(AlgorithmOptions(r, o));
  o.resumable = r.resumable || r.resume;
  o.resume = r.resume;
  if (o.resumable) {
    NIBBLE_ASSIGN_OR_RETURN(o.resume_settings, ResumeSettings(r));
  }
  Result<QuantizeReport> run = QuantizeCheckpoint(o);
  if (!run.ok()) return NoteOutputUntouched(run.error(), r.output_dir);
  QuantizeReport& rep = *run;
  QuantizeSummary s;
  s.quant_algo = rep.algorithms.Name();
  s.quant_algo_label = rep.algorithms.Label();
  s.calibrated = rep.algorithms.Calibrated();
  s.messages = notes;
  s.messages.insert(s.messages.end(), rep.messages.begin(), rep.messages.end());
  s.calib_chunks = rep.calib_chunks;
  s.calib_seq_len = rep.calib_seq_len;
  s.calib_available_chunks = rep.calib_available_chunks;
  s.calib_total_tokens = rep.calib_total_tokens;
  if (rep.calib) {
    s.calib_seconds = rep.calib->seconds;
    s.propagate = rep.propagation == Propagation::kFp ? "fp" : "quantized";
    s.hessian_peak_bytes = rep.calib->hessian_peak_bytes;
    for (const auto& l : rep.calib->layers) s.calib_layers.push_back(LayerSummary(l));
  }
  for (const auto& l : rep.layers)
    s.layers.push_back({l.name, l.rule, l.scheme, l.quantized, l.n, l.k, l.bytes_in, l.bytes_out, l.rel_error});
  s.shards = rep.shards;
  s.copied_files = rep.copied_files;
  s.total_bytes = rep.total_bytes;
  s.size = SizeOfQuantized(s.layers, rep.total_bytes);
  s.seconds = rep.seconds;
  s.start_anon_bytes = rep.memory.start_anon;
  s.peak_anon_bytes = rep.memory.peak_anon;
  s.peak_file_bytes = rep.memory.peak_file;
  s.vm_hwm_bytes = rep.memory.hwm;
  s.quantization_config_json = rep.quantization_config.dump(2);
  s.plan_line = ResourcePlanLine(rep.plan);
  s.plan_json = ResourcePlanJson(rep.plan).dump();
  s.plan_peak_anon_bytes = rep.plan.peak_bytes;
  s.report_json = QuantizeReportJson(r, s, rep.calib ? rep.algorithms.ReportJson(*rep.calib) : nlohmann::ordered_json());
  return s;
}

// The engines report of a quantized checkpoint (its config read from config.json in the file's
// key order, which vLLM's first-match lookup depends on); unused config entries become warnings.
static Status AddEngines(InspectReport& rep, const ModelConfig& mc, const TensorStore& store) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> format, OpenCheckpointFormat(rep.dir));
  std::vector<LinearShapeInfo> shapes;
  std::vector<std::string> names;
  // A tied model's stored lm_head is listed too: what each engine makes of it.
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(mc, store));
  for (const std::string& name : LinearModuleNames(mc, proj.ReadsHeadModule() || proj.head_stored)) {
    const auto [n, k] = LinearShape(mc, name);
    shapes.push_back({name, n, k});
    names.push_back(name);
  }
  NIBBLE_ASSIGN_OR_RETURN(std::vector<std::string> unused, format->UnusedConfigEntries(names));
  rep.warnings.insert(rep.warnings.end(), unused.begin(), unused.end());
  NIBBLE_ASSIGN_OR_RETURN(EnginesReport e, format->Engines(shapes, proj.tied));
  rep.engines = e.engines;
  for (const auto& l : e.linears) {
    InspectReport::EngineRow row{l.shape.name, l.meant, {}, {}};
    for (const auto& x : l.readings) {
      row.readings.push_back(x.text);
      row.agrees.push_back(x.agrees);
    }
    rep.engine_rows.push_back(std::move(row));
  }
  rep.engine_disagreements = EngineNotReadingLines(e);
  for (std::string& d : EngineDisagreementLines(e)) rep.engine_disagreements.push_back(std::move(d));
  for (const auto& t : e.tp) rep.tensor_parallel.push_back({t.tp, t.ok, t.failure});
  return Status::Ok();
}

Result<InspectReport> Inspect(const std::string& dir) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> fmt, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  InspectReport rep;
  rep.dir = dir;
  rep.format = fmt ? fmt->name() : "dense";
  rep.torch_dtype = mc.torch_dtype;
  NIBBLE_RETURN_IF_ERROR(CheckCheckpointShapes(mc, store, fmt.get()));
  NIBBLE_ASSIGN_OR_RETURN(std::string unread, CheckUnreadTensors(mc, store, fmt.get()));
  if (!unread.empty()) rep.warnings.push_back(unread);
  NIBBLE_RETURN_IF_ERROR(CheckTiedLmHead(mc, store, fmt.get(), &rep.warnings));
  if (fmt) {
    rep.format_properties = fmt->Properties();
    rep.quantization_config_json = fmt->ConfigJson().dump(2);
    NIBBLE_RETURN_IF_ERROR(AddEngines(rep, mc, store));
  }
  const int64_t elem = mc.torch_dtype == "float32" ? 4 : 2;
  for (const auto& name : store.Names()) rep.total_tensor_bytes += static_cast<int64_t>(store.Find(name)->nbytes);
  // A tied model's lm_head is the embedding (FindOutputProjection): not a linear of its own.
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(mc, store));
  const bool has_lm_head = proj.ReadsHeadModule();
  const std::vector<std::string> suffixes = fmt ? fmt->TensorSuffixes() : std::vector<std::string>{"weight"};
  for (const std::string& name : LinearModuleNames(mc, has_lm_head)) {
    InspectReport::Layer l;
    l.name = name;
    std::tie(l.n, l.k) = LinearShape(mc, name);
    for (const std::string& suffix : suffixes)
      if (const TensorView* t = store.Find(name + "." + suffix)) l.stored_bytes += static_cast<int64_t>(t->nbytes);
    if (fmt) {
      NIBBLE_ASSIGN_OR_RETURN(LinearPlan r, fmt->Resolve(name));
      l.rule = r.rule;
      if (r.spec) {
        l.quantized = true;
        l.scheme = DescribeSpec(*r.spec) + (r.spec->act_order ? " act-order (desc_act)" : "");
      }
    } else {
      l.rule = "not quantized (dense checkpoint)";
    }
    if (!l.quantized) {  // a quantized module may store no `weight` (compressed-tensors: weight_packed)
      NIBBLE_ASSIGN_OR_RETURN(const TensorView* w, store.Get(name + ".weight"));
      l.scheme = std::string("float (") + DTypeName(w->dtype) + ")";
    }
    l.float_bytes = l.n * l.k * elem;
    rep.layers.push_back(l);
  }
  rep.size = SizeOfInspected(rep.layers, rep.total_tensor_bytes, 8 * static_cast<int>(elem));
  return rep;
}

}  // namespace nibble
