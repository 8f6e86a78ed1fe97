// `nibble convert`: a quantized checkpoint re-written in another format through the native
// Int4Matrix, codes untouched. Every tensor is written at the position quantize gives it (the
// dense name of its module's weight in sorted order), and config.json keeps its key order, so a
// conversion A -> B -> A reproduces A's export byte for byte.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include <nibble/quantize.h>

#include "base/version.h"
#include "formats/checkpoint_format.h"
#include "formats/float_dtype.h"
#include "formats/quark_format.h"
#include "io/checkpoint_writer.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "io/staging_dir.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/model_loader.h"

namespace nibble {

namespace {

namespace fs = std::filesystem;

// What the input stores for one linear module.
struct SourceLinear {
  std::string module;
  LinearPlan plan;   // spec set: quantized
  DType scale_dtype = DType::kF32;
  bool scales_exact_in_model_dtype = true;
};

Result<const FormatEntry*> FindTarget(const std::string& to) {
  return FindExportFormat(to == "quark" ? "hf_format" : to);
}

Status CheckOutput(const ConvertRequest& r) {
  if (r.output_dir.empty()) return MakeError("--out is empty");
  NIBBLE_RETURN_IF_ERROR(CheckOutputReplaceable(r.output_dir, r.overwrite));
  if (fs::exists(r.output_dir) && fs::equivalent(r.output_dir, r.input_dir))
    return MakeError("output directory ", r.output_dir, " is the input directory");
  return Status::Ok();
}

// Resolves every linear and reads each quantized one once to learn its scales' dtype and whether
// the model's dtype holds them exactly (then they are written in it, as quantize does).
Result<std::vector<SourceLinear>> ReadSourceLinears(const QuantizedFormat& src, const ModelConfig& mc,
                                                    const TensorStore& store, DType model_dtype,
                                                    const CancellationToken* cancel) {
  std::vector<SourceLinear> out;
  // A tied model's lm_head is the float embedding (FindOutputProjection): nothing to convert.
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(mc, store));
  for (const std::string& m : LinearModuleNames(mc, proj.ReadsHeadModule())) {
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, "convert reading " + m));
    SourceLinear l;
    l.module = m;
    NIBBLE_ASSIGN_OR_RETURN(l.plan, src.Resolve(m));
    if (l.plan.spec) {
      const auto [n, k] = LinearShape(mc, m);
      NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> q, src.Import(store, m, l.plan, n, k));
      if (!q)
        return MakeErrorCode(ErrorCode::kUnsupported, store.description(), ": module ", m,
                             " is quantized by the config but stores a float weight (fake_quantized): there are no codes to convert");
      NIBBLE_ASSIGN_OR_RETURN(l.scale_dtype, src.StoredScaleDType(store, m));
      for (float s : q->scales) l.scales_exact_in_model_dtype = l.scales_exact_in_model_dtype && RoundToDType(s, model_dtype) == s;
    }
    out.push_back(std::move(l));
  }
  return out;
}

// The request in Quark's vocabulary that resolves every module as the input does: the input's
// own config when it is Quark (algo_config and calibration records kept), else one built from
// the resolved specs (the most common one global, the others and the float modules by name).
Result<QuarkQuantConfig> RequestConfig(const QuantizedFormat& src, const std::vector<SourceLinear>& linears) {
  if (src.name() == "quark") return ParseQuarkQuantConfig(src.ConfigJson(), "the input's quantization_config");
  std::map<std::string, int64_t> count;
  std::map<std::string, QuantSpec> by_text;
  for (const SourceLinear& l : linears) {
    if (!l.plan.spec) continue;
    QuantSpec s = *l.plan.spec;
    s.scale_dtype.reset();
    const std::string key = DescribeSpec(s) + (s.act_order ? " act_order" : "");
    by_text[key] = s;
    ++count[key];
  }
  const auto best = std::max_element(count.begin(), count.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  auto quark_spec = [](const QuantSpec& q) {
    WeightQuantSpec w = QuarkSpecFor(q);
    if (q.granularity == Granularity::kPerChannel) w.observer_cls = "PerChannelMinMaxObserver";
    w.round_method = RoundingName(q.rounding);
    return w;
  };
  QuarkQuantConfig c;
  c.global = quark_spec(by_text.at(best->first));
  for (const SourceLinear& l : linears) {
    if (!l.plan.spec) {
      c.exclude.push_back(l.module);
      continue;
    }
    QuantSpec s = *l.plan.spec;
    s.scale_dtype.reset();
    if (!(s == by_text.at(best->first))) c.layer_quant_config.emplace_back(l.module, quark_spec(s));
  }
  c.algo_config = nullptr;
  c.quant_mode = "eager_mode";
  return ParseQuarkQuantConfig(ToJson(c), "the converted quantization_config");
}

// The dtype every scale is written in: the model's when it holds all of them exactly (what
// quantize writes), else the input's; a format with a fixed scale dtype gets its own.
Result<std::optional<DType>> ChooseScaleDType(const std::vector<SourceLinear>& linears, DType model_dtype,
                                              const FormatWriter& writer) {
  if (std::optional<DType> fixed = writer.ScaleDType()) return fixed;
  bool exact = true;
  std::set<DType> stored;
  for (const SourceLinear& l : linears) {
    if (!l.plan.spec) continue;
    exact = exact && l.scales_exact_in_model_dtype;
    stored.insert(l.scale_dtype);
  }
  if (exact) return std::optional<DType>{};
  if (stored.size() != 1)
    return MakeErrorCode(ErrorCode::kUnsupported, "the input stores scales in several dtypes that the model dtype ",
                         DTypeName(model_dtype), " cannot all hold exactly; nibble converts one scale dtype per checkpoint");
  return std::optional<DType>(*stored.begin());
}

// Output order: each tensor at its own name, a quantized module's tensors at "<module>.weight"
// (where quantize writes them); value = the module ("" for a tensor copied as it is).
std::map<std::string, std::string> OutputOrder(const QuantizedFormat& src, const TensorStore& store,
                                               const std::vector<SourceLinear>& linears) {
  std::set<std::string> module_tensors;
  std::map<std::string, std::string> order;
  for (const SourceLinear& l : linears) {
    if (!l.plan.spec) continue;
    for (const std::string& suffix : src.TensorSuffixes())
      if (suffix != "bias") module_tensors.insert(l.module + "." + suffix);
    order[l.module + ".weight"] = l.module;
  }
  for (const std::string& name : store.Names())
    if (!module_tensors.count(name)) order.emplace(name, "");
  return order;
}

Status WriteConverted(const QuantizedFormat& src, const FormatWriter& writer, const ModelConfig& mc,
                      const TensorStore& store, const std::vector<SourceLinear>& linears,
                      std::optional<DType> scale_dtype, DType model_dtype, CheckpointWriter& out, ConvertSummary& s,
                      const CancellationToken* cancel) {
  std::map<std::string, const SourceLinear*> by_module;
  for (const SourceLinear& l : linears) by_module[l.module] = &l;
  for (const auto& [name, module] : OutputOrder(src, store, linears)) {
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, "convert at " + name));
    if (module.empty()) {
      NIBBLE_RETURN_IF_ERROR(out.Add(BorrowTensor(*store.Find(name))));
      ++s.float_tensors;
      continue;
    }
    const SourceLinear& l = *by_module.at(module);
    const auto [n, k] = LinearShape(mc, module);
    NIBBLE_ASSIGN_OR_RETURN(std::optional<Int4Matrix> q, src.Import(store, module, l.plan, n, k));
    QuantSpec spec = *l.plan.spec;
    spec.scale_dtype = scale_dtype;
    NIBBLE_ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors, writer.WriteLinear(module, *q, spec, scale_dtype.value_or(model_dtype)));
    for (auto& t : tensors) NIBBLE_RETURN_IF_ERROR(out.Add(std::move(t)));
    ++s.quantized_linears;
  }
  return Status::Ok();
}

// A GPTQ input re-written as GPTQ keeps the quantizer settings its config records (GPTQ's writer
// reads them from a "gptq" algo_config entry, as after a nibble GPTQ run).
nlohmann::ordered_json GptqSettingsOf(const QuantizedFormat& src) {
  const nlohmann::ordered_json qc = src.ConfigJson();
  nlohmann::ordered_json e = {{"name", "gptq"}};
  for (const char* key : {"damp_percent", "true_sequential"})
    if (qc.contains(key)) e[key] = qc[key];
  return nlohmann::ordered_json::array({e});
}

// Writers phrase what they cannot hold for quantize (--model_export); convert's flag is --to.
Error InConvertTerms(const Error& e) {
  Error out = e;
  for (size_t at = 0; (at = out.message.find("--model_export", at)) != std::string::npos;) out.message.replace(at, 14, "--to");
  return out;
}

DType ModelDType(const ModelConfig& mc) {
  return mc.torch_dtype == "float16" ? DType::kF16 : mc.torch_dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
}

}  // namespace

// The note at the top of the output's README.md (io/model_card.h): a conversion, not a new
// quantization. The input's own note, if any, stays below it.
static ModelCardNote ConvertCardNote(const ConvertSummary& s, const FormatEntry& target, const std::vector<SourceLinear>& linears) {
  ModelCardNote n;
  n.heading = std::string("Converted with nibble ") + NibbleVersion();
  n.summary = "`nibble convert` rewrote this checkpoint from " + s.from + " to " + s.to +
              ": the int4 codes, scales and zero points are repacked into the target's layout, not re-quantized.";
  std::map<std::string, int64_t> schemes;
  for (const SourceLinear& l : linears)
    if (l.plan.spec) ++schemes[DescribeSpec(*l.plan.spec)];
  n.items.push_back({"scheme", SchemeCounts(schemes)});
  n.items.push_back({"export format", std::string(target.export_name) + " (" + target.description + "), quant_method " +
                                          target.quant_method + " in config.json"});
  return n;
}

static Result<ConvertSummary> ConvertChecked(const ConvertRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  NIBBLE_ASSIGN_OR_RETURN(const FormatEntry* target, FindTarget(r.to));
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> src, OpenCheckpointFormat(r.input_dir));
  if (src == nullptr)
    return MakeError(r.input_dir, ": a dense checkpoint has no codes to convert; nibble quantize makes a quantized one");
  NIBBLE_RETURN_IF_ERROR(CheckOutput(r));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(r.input_dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(r.input_dir));
  NIBBLE_RETURN_IF_ERROR(CheckCheckpointShapes(mc, store, src.get()));
  const DType model_dtype = ModelDType(mc);
  NIBBLE_ASSIGN_OR_RETURN(std::vector<SourceLinear> linears, ReadSourceLinears(*src, mc, store, model_dtype, r.cancel));
  ConvertSummary s;
  s.from = src->name();
  ExportRequest request;
  NIBBLE_ASSIGN_OR_RETURN(request.config, RequestConfig(*src, linears));
  if (!r.pack_method.empty()) {
    if (r.pack_method != "reorder" && r.pack_method != "order")
      return MakeErrorCode(ErrorCode::kUnsupported, "--pack_method \"", r.pack_method, "\" is not supported (supported: reorder, order)");
    request.config.export_config.pack_method = r.pack_method == "order" ? PackMethod::kOrder : PackMethod::kReorder;
  }
  if (!r.gptq_format.empty()) request.gptq_format = r.gptq_format;
  if (src->name() == "gptq" && std::string(target->quant_method) == "gptq") request.config.algo_config = GptqSettingsOf(*src);
  for (const SourceLinear& l : linears) request.modules.push_back(l.module);
  if (request.modules.empty() || request.modules.back() != "lm_head") request.absent_modules = {"lm_head"};
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<FormatWriter> writer, target->writer(request));
  NIBBLE_ASSIGN_OR_RETURN(std::optional<DType> scale_dtype, ChooseScaleDType(linears, model_dtype, *writer));
  if (scale_dtype && *scale_dtype != model_dtype) SetScaleDType(request.config, *scale_dtype);
  NIBBLE_ASSIGN_OR_RETURN(CheckpointWriter out, CheckpointWriter::Create(r.output_dir, r.max_shard_size));
  NIBBLE_RETURN_IF_ERROR(WriteConverted(*src, *writer, mc, store, linears, scale_dtype, model_dtype, out, s, r.cancel));
  NIBBLE_RETURN_IF_ERROR(out.Finish());
  s.shards = out.shards();
  s.total_bytes = out.total_bytes();
  const nlohmann::ordered_json qc = writer->QuantizationConfig(request);
  s.to = target->quant_method;
  s.quantization_config_json = qc.dump(2);
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::ordered_json config_json, ReadConfigJsonOrdered(r.input_dir));
  config_json["quantization_config"] = qc;
  NIBBLE_RETURN_IF_ERROR(out.WriteFile("config.json", config_json.dump(2) + "\n"));
  std::set<std::string> written;
  for (const auto& [name, text] : writer->ExtraFiles(request)) {
    NIBBLE_RETURN_IF_ERROR(out.WriteFile(name, text));
    written.insert(name);
  }
  std::vector<std::string> side;
  for (const std::string& f : CheckpointSideFiles(r.input_dir))
    if (f != "quantize_config.json" && !written.count(f)) side.push_back(f);
  NIBBLE_ASSIGN_OR_RETURN(s.copied_files, out.CopyFiles(r.input_dir, side));
  NIBBLE_RETURN_IF_ERROR(out.WriteModelCard(r.input_dir, ConvertCardNote(s, *target, linears)));
  if (!r.gptq_format.empty() && s.to != "gptq")
    s.messages.push_back("warning: --gptq_format " + r.gptq_format + " is used only by --to gptq");
  if (!r.pack_method.empty() && s.to != "quark")
    s.messages.push_back("warning: --pack_method " + r.pack_method + " is used only by --to hf_format");
  if (s.from == "quark" && s.to != "quark" && !request.config.algo_config.is_null())
    s.messages.push_back("note: the input's algo_config is not written: " + std::string(target->description) + " has no place for it");
  for (const std::string& m : s.messages)
    if (r.on_message) r.on_message(m);
  NIBBLE_RETURN_IF_ERROR(CheckCancelled(r.cancel, "convert before the output was committed"));
  NIBBLE_RETURN_IF_ERROR(out.Commit(r.overwrite));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

Result<ConvertSummary> Convert(const ConvertRequest& r) {
  Result<ConvertSummary> s = ConvertChecked(r);
  if (!s.ok()) return NoteOutputUntouched(InConvertTerms(s.error()), r.output_dir);
  return s;
}

}  // namespace nibble
