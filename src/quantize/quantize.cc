#include "quantize/quantize.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "formats/int4_matrix.h"
#include "formats/quark_pack.h"
#include "formats/rtn.h"
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/staging_dir.h"
#include "model/checkpoint_format.h"
#include "model/config.h"
#include "model/weights.h"
#include "formats/float_dtype.h"
#include "quantize/calibration.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

namespace fs = std::filesystem;

namespace {

// Files of a HF model directory that are not weights and travel with the checkpoint.
constexpr const char* kSideFiles[] = {"tokenizer.model", "tokenizer_config.json", "tokenizer.json",
                                      "special_tokens_map.json", "generation_config.json"};

std::string ShardName(int64_t i, int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05lld-of-%05lld.safetensors", static_cast<long long>(i),
                static_cast<long long>(n));
  return buf;
}


// An input tensor written unchanged: borrowed from the memory-mapped input, never copied.
TensorToWrite BorrowTensor(const TensorView& t) {
  TensorToWrite w;
  w.name = t.name;
  w.dtype = t.dtype;
  w.shape = t.shape;
  w.borrowed = t.data;
  w.borrowed_size = t.nbytes;
  return w;
}

// What one input tensor becomes in the output: the tensors to write (one, or Quark's
// weight/weight_scale/weight_zero_point triple) and, for a linear's weight, its report line.
struct Produced {
  std::vector<TensorToWrite> tensors;
  std::optional<QuantizedLayerReport> layer;
};

// A float tensor written in its own dtype: borrowed unchanged, or AWQ's new fp32 values (same
// shape) converted. Values that do not fit are an error, never inf (the AWQ search rejects such
// candidates, so this is a safety net).
Result<TensorToWrite> FloatTensor(const TensorView& t, const std::vector<float>* new_values) {
  if (new_values == nullptr) return BorrowTensor(t);
  TensorToWrite w;
  w.name = t.name;
  w.dtype = t.dtype;
  w.shape = t.shape;
  const size_t es = DTypeSize(t.dtype);
  w.bytes.resize(new_values->size() * es);
  for (size_t i = 0; i < new_values->size(); ++i) {
    const float v = (*new_values)[i];
    if (!std::isfinite(RoundToDType(v, t.dtype)))
      return MakeError("tensor ", t.name, "[", i, "] = ", v, " after AWQ smoothing does not fit ", DTypeName(t.dtype));
    StoreFloatAs(v, t.dtype, w.bytes.data() + i * es);
  }
  return w;
}

// One input tensor → what is written for it. `new_values` (AWQ's fp32 result, same shape)
// replaces the stored values when given. A linear's weight (`module_of_weight`: tensor name →
// module) is quantized per `cfg` and packed as Quark's weight / weight_scale / weight_zero_point,
// or kept in float when its module is excluded; anything else is kept in float.
Result<Produced> ProduceTensor(const TensorView& t, const std::vector<float>* new_values,
                               const std::map<std::string, std::string>& module_of_weight, const QuarkQuantConfig& cfg) {
  Produced res;
  auto mod = module_of_weight.find(t.name);
  if (mod == module_of_weight.end()) {
    NIBBLE_ASSIGN_OR_RETURN(TensorToWrite w, FloatTensor(t, new_values));
    res.tensors.push_back(std::move(w));
    return res;
  }
  const std::string& name = mod->second;
  NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(cfg, name));
  QuantizedLayerReport lr;
  lr.name = name;
  lr.rule = r.rule;
  lr.n = t.shape[0];
  lr.k = t.shape[1];
  lr.bytes_in = static_cast<int64_t>(t.nbytes);
  if (!r.spec) {
    NIBBLE_ASSIGN_OR_RETURN(TensorToWrite w, FloatTensor(t, new_values));
    res.tensors.push_back(std::move(w));
    lr.bytes_out = lr.bytes_in;
    res.layer = std::move(lr);
    return res;
  }
  std::vector<float> owned;
  const std::vector<float>* w = new_values;
  if (w == nullptr) {
    NIBBLE_ASSIGN_OR_RETURN(owned, TensorToF32(t));
    w = &owned;
  }
  auto q = QuantizeRtnRef(w->data(), lr.n, lr.k, *r.spec, t.dtype);
  if (!q.ok()) return q.error().WithContext("layer " + name);
  auto packed = ExportQuarkLinear(name, *q, *r.spec, cfg.export_config.pack_method, t.dtype);
  if (!packed.ok()) return packed.error().WithContext("layer " + name);
  std::vector<float> deq(w->size());
  DequantizeRef(*q, deq.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < w->size(); ++i) {
    const double d = static_cast<double>((*w)[i]) - deq[i];
    num += d * d;
    den += static_cast<double>((*w)[i]) * (*w)[i];
  }
  lr.rel_error = den > 0 ? std::sqrt(num / den) : 0.0;
  lr.quantized = true;
  lr.scheme = DescribeSpec(*r.spec);
  lr.bytes_out = static_cast<int64_t>(packed->weight.bytes.size() + packed->weight_scale.bytes.size() +
                                      packed->weight_zero_point.bytes.size());
  res.tensors.push_back(std::move(packed->weight));
  res.tensors.push_back(std::move(packed->weight_scale));
  res.tensors.push_back(std::move(packed->weight_zero_point));
  res.layer = std::move(lr);
  return res;
}

// The per-channel replacement used by MisalignedPolicy::kPerChannel: one group per row written as
// per_group with group_size = K, which every Quark W4A16 loader accepts (vLLM requires a positive
// group_size).
WeightQuantSpec PerRowSpec(const WeightQuantSpec& s, int64_t k) {
  WeightQuantSpec r = s;
  r.qscheme = QScheme::kPerGroup;
  r.ch_axis = 1;
  r.group_size = k;
  return r;
}

}  // namespace

Result<QuantizeReport> QuantizeToQuark(const QuantizeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.quant_algo != "rtn" && o.quant_algo != "awq")
    return MakeError("--quant_algo \"", o.quant_algo, "\" is not supported (supported: rtn, awq)");
  if (o.quant_algo == "awq" && o.dataset.empty()) return MakeError("--quant_algo awq needs calibration data: --dataset FILE");
  NIBBLE_ASSIGN_OR_RETURN(CheckpointInfo fmt, DetectCheckpointFormat(o.model_dir));
  if (fmt.format != CheckpointFormat::kDense)
    return MakeError(o.model_dir, ": the checkpoint is already quantized; quantize a float checkpoint");
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(o.model_dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(o.model_dir));
  const std::string config_path = JoinPath(o.model_dir, "config.json");
  NIBBLE_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(config_path));
  nlohmann::ordered_json config_json;
  try {
    config_json = nlohmann::ordered_json::parse(config_text);
  } catch (const std::exception& e) {
    return MakeError(config_path, ": not valid JSON (", e.what(), ")");
  }
  if (fs::exists(o.output_dir) && !o.overwrite)
    return MakeError("output directory ", o.output_dir, " exists; pass --overwrite to replace it");
  if (fs::exists(o.output_dir) && fs::equivalent(o.output_dir, o.model_dir))
    return MakeError("output directory ", o.output_dir, " is the input model directory");

  QuantizeReport report;
  QuarkQuantConfig cfg = o.config;
  const bool has_lm_head = store.Find("lm_head.weight") != nullptr;
  const std::vector<std::string> modules = LinearModuleNames(mc, has_lm_head);

  // Pass 1: resolve every module, applying the misaligned-K policy to the written config.
  for (const std::string& name : modules) {
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* w, store.Get(name + ".weight"));
    if (w->shape.size() != 2) return MakeError(w->file, ": tensor ", w->name, " has shape ", w->ShapeString(), ", expected 2-D");
    const int64_t k = w->shape[1];
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(cfg, name));
    if (!r.spec) continue;
    const int64_t g = r.spec->EffectiveGroupSize(k);
    if (k % g == 0) continue;
    switch (o.misaligned) {
      case MisalignedPolicy::kError:
        return MakeError("layer ", name, ": in_features K = ", k, " is not divisible by group_size ", g, " (", r.rule,
                         "); use --misaligned exclude|per_channel, --exclude_layers, or a --layer_quant_config override");
      case MisalignedPolicy::kExclude:
        cfg.exclude.push_back(name);
        break;
      case MisalignedPolicy::kPerChannel:
        cfg.layer_quant_config.insert(cfg.layer_quant_config.begin(), {name, PerRowSpec(*r.spec, k)});
        break;
    }
  }

  std::map<std::string, std::string> module_of_weight;
  for (const auto& m : modules) module_of_weight[m + ".weight"] = m;

  // AWQ: calibration data and the sequential layer pipeline. Each layer's smoothed fp32 tensors
  // are quantized / stored as soon as AWQ finishes the layer and then freed, so memory never holds
  // the model in fp32.
  auto note = [&](const std::string& m) {
    report.messages.push_back(m);
    if (o.message) o.message(m);
  };
  std::map<std::string, Produced> from_awq;
  if (o.quant_algo == "awq") {
    NIBBLE_ASSIGN_OR_RETURN(std::optional<AwqSettings> from_cfg, ParseAwqAlgoConfig(cfg.algo_config, o.awq));
    report.awq_settings = from_cfg ? *from_cfg : o.awq;
    NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(o.model_dir));
    NIBBLE_ASSIGN_OR_RETURN(std::vector<std::string> texts, ReadCalibrationTexts(o.dataset));
    auto calib = BuildCalibrationData(*tok, texts, o.num_calib_data, o.calib_seq_len, o.seed);
    if (!calib.ok()) return calib.error().WithContext("--dataset " + o.dataset);
    for (const auto& w : calib->warnings) note("warning: " + w);
    report.calib_chunks = calib->num_chunks;
    report.calib_seq_len = calib->seq_len;
    report.calib_available_chunks = calib->available_chunks;
    report.calib_total_tokens = calib->total_tokens;
    auto sink = [&](const std::string& tname, std::vector<float> values) -> Status {
      NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, store.Get(tname));
      NIBBLE_ASSIGN_OR_RETURN(Produced p, ProduceTensor(*t, &values, module_of_weight, cfg));
      from_awq[tname] = std::move(p);
      return Status::Ok();
    };
    auto awq = RunAwq(mc, store, cfg, calib->tokens, calib->num_chunks, calib->seq_len, report.awq_settings, sink, o.progress);
    if (!awq.ok()) return awq.error().WithContext("AWQ");
    for (const auto& m : awq->messages) note(m);
    cfg.algo_config = AwqAlgoConfigJson(report.awq_settings, awq->used, mc);
    report.awq = std::move(awq).value();
  }

  // Pass 2: every tensor in input order (sorted names); AWQ's are already produced.
  std::vector<TensorToWrite> out;
  int64_t done = 0;
  for (const std::string& tname : store.Names()) {
    Produced p;
    if (auto it = from_awq.find(tname); it != from_awq.end()) {
      p = std::move(it->second);
      from_awq.erase(it);
    } else {
      NIBBLE_ASSIGN_OR_RETURN(p, ProduceTensor(*store.Find(tname), nullptr, module_of_weight, cfg));
    }
    for (auto& t : p.tensors) out.push_back(std::move(t));
    if (p.layer) {
      report.layers.push_back(std::move(*p.layer));
      if (o.progress && o.quant_algo == "rtn") o.progress(++done, static_cast<int64_t>(modules.size()));
    }
  }

  // Shards: consecutive tensors up to max_shard_size bytes each (a larger tensor gets its own).
  std::vector<std::vector<const TensorToWrite*>> shards(1);
  int64_t shard_bytes = 0;
  for (const auto& t : out) {
    const int64_t b = static_cast<int64_t>(t.data().size());
    if (!shards.back().empty() && shard_bytes + b > o.max_shard_size) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += b;
    report.total_bytes += b;
  }
  report.shards = static_cast<int64_t>(shards.size());

  if (o.output_dir.empty()) return MakeError("--output_dir is empty");
  NIBBLE_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Create(o.output_dir));
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    NIBBLE_RETURN_IF_ERROR(WriteSafetensors(JoinPath(staging.path(), "model.safetensors"), shards[0], meta));
  } else {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", report.total_bytes}};
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string fname = ShardName(static_cast<int64_t>(i + 1), static_cast<int64_t>(shards.size()));
      NIBBLE_RETURN_IF_ERROR(WriteSafetensors(JoinPath(staging.path(), fname), shards[i], meta));
      for (const TensorToWrite* t : shards[i]) weight_map[t->name] = fname;
    }
    index["weight_map"] = weight_map;
    const std::string text = index.dump(2) + "\n";
    NIBBLE_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging.path(), "model.safetensors.index.json"), text.data(), text.size()));
  }
  config_json["quantization_config"] = ToJson(cfg);
  const std::string config_out = config_json.dump(2) + "\n";
  NIBBLE_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging.path(), "config.json"), config_out.data(), config_out.size()));
  for (const char* f : kSideFiles) {
    const std::string src = JoinPath(o.model_dir, f);
    if (!PathExists(src)) continue;
    NIBBLE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(src));
    NIBBLE_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging.path(), f), bytes.data(), bytes.size()));
  }
  NIBBLE_RETURN_IF_ERROR(staging.Commit(o.overwrite));
  report.written_config = std::move(cfg);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace nibble
