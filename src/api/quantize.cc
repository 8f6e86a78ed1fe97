// Public API: flags in Quark's vocabulary -> QuarkQuantConfig -> quantize pipeline; inspect.
#include <cstdlib>
#include <tuple>

#include "api/model_impl.h"
#include "formats/quant_config.h"
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/checkpoint_format.h"
#include "model/config.h"
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
    return MakeError("--quant_scheme \"", scheme,
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

Result<QuarkQuantConfig> ConfigFromRequest(const QuantizeRequest& r) {
  if (!r.quant_config_file.empty()) {
    NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(r.quant_config_file));
    NIBBLE_RETURN_IF_ERROR(ParseJsonText(text, r.quant_config_file));  // duplicate keys, syntax
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
    if (j.is_object() && j.contains("quantization_config")) j = j["quantization_config"];
    return ParseQuarkQuantConfig(j, r.quant_config_file);
  }
  QuarkQuantConfig c;
  NIBBLE_ASSIGN_OR_RETURN(c.global, SpecForScheme(r.quant_scheme, r.group_size));
  for (const auto& o : r.layer_quant_config) {
    NIBBLE_ASSIGN_OR_RETURN(auto entry, ParseLayerOverride(o, r.quant_scheme, r.group_size));
    c.layer_quant_config.emplace_back(entry.first, entry.second);
  }
  c.exclude = r.exclude_layers;
  if (r.pack_method == "reorder") c.export_config.pack_method = PackMethod::kReorder;
  else if (r.pack_method == "order") c.export_config.pack_method = PackMethod::kOrder;
  else return MakeError("--pack_method \"", r.pack_method, "\" is not supported (supported: reorder, order)");
  c.algo_config = nullptr;
  c.quant_mode = "eager_mode";
  // Validate through the same parser a loader uses (exclude regexes, spec invariants).
  return ParseQuarkQuantConfig(ToJson(c), "quantize flags");
}

}  // namespace

Result<QuantizeSummary> Quantize(const QuantizeRequest& r) {
  QuantizeOptions o;
  o.model_dir = r.model_dir;
  o.output_dir = r.output_dir;
  NIBBLE_ASSIGN_OR_RETURN(o.config, ConfigFromRequest(r));
  o.quant_algo = r.quant_algo;
  if (r.misaligned == "error") o.misaligned = MisalignedPolicy::kError;
  else if (r.misaligned == "exclude") o.misaligned = MisalignedPolicy::kExclude;
  else if (r.misaligned == "per_channel") o.misaligned = MisalignedPolicy::kPerChannel;
  else return MakeError("--misaligned \"", r.misaligned, "\" is not supported (supported: error, exclude, per_channel)");
  if (r.max_shard_size <= 0) return MakeError("--max_shard_size must be positive");
  o.max_shard_size = r.max_shard_size;
  o.overwrite = r.overwrite;
  o.progress = r.progress;
  NIBBLE_ASSIGN_OR_RETURN(QuantizeReport rep, QuantizeToQuark(o));
  QuantizeSummary s;
  for (const auto& l : rep.layers)
    s.layers.push_back({l.name, l.rule, l.scheme, l.quantized, l.n, l.k, l.bytes_in, l.bytes_out, l.rel_error});
  s.shards = rep.shards;
  s.total_bytes = rep.total_bytes;
  s.seconds = rep.seconds;
  s.quantization_config_json = ToJson(rep.written_config).dump(2);
  return s;
}

Result<InspectReport> Inspect(const std::string& dir) {
  NIBBLE_ASSIGN_OR_RETURN(CheckpointInfo fmt, DetectCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  InspectReport rep;
  rep.dir = dir;
  rep.format = fmt.format == CheckpointFormat::kQuark ? "quark" : "dense";
  rep.torch_dtype = mc.torch_dtype;
  if (fmt.quark) {
    rep.pack_method = PackMethodName(fmt.quark->export_config.pack_method);
    rep.quantization_config_json = ToJson(*fmt.quark).dump(2);
  }
  const int64_t elem = mc.torch_dtype == "float32" ? 4 : 2;
  for (const auto& name : store.Names()) rep.total_tensor_bytes += static_cast<int64_t>(store.Find(name)->nbytes);
  const bool has_lm_head = store.Find("lm_head.weight") != nullptr;
  for (const std::string& name : LinearModuleNames(mc, has_lm_head)) {
    InspectReport::Layer l;
    l.name = name;
    std::tie(l.n, l.k) = LinearShape(mc, name);
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* w, store.Get(name + ".weight"));
    for (const char* suffix : {".weight", ".weight_scale", ".weight_zero_point"})
      if (const TensorView* t = store.Find(name + suffix)) l.stored_bytes += static_cast<int64_t>(t->nbytes);
    if (fmt.quark) {
      NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(*fmt.quark, name));
      l.rule = r.rule;
      if (r.spec) {
        l.quantized = true;
        l.scheme = DescribeSpec(*r.spec);
      }
    } else {
      l.rule = "not quantized (dense checkpoint)";
    }
    if (!l.quantized) {
      l.scheme = std::string("float (") + DTypeName(w->dtype) + ")";
    }
    l.float_bytes = l.n * l.k * elem;
    rep.layers.push_back(l);
  }
  return rep;
}

}  // namespace nibble
