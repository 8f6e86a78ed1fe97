// Quark quantization_config parsing, writing and per-layer resolution (SPEC §1.2, §1.3).
#include "formats/quark_config.h"

#include <algorithm>
#include <set>

#include "base/check.h"
#include "base/strings.h"
#include "formats/fnmatch.h"

namespace nibble {
namespace {

using OJ = nlohmann::ordered_json;

// "found" part of messages: the JSON type and (short) value.
std::string Found(const OJ& j) {
  std::string v = j.dump();
  if (v.size() > 60) v = v.substr(0, 57) + "...";
  return std::string(j.type_name()) + " " + v;
}

// "a.b" key paths; top-level keys have an empty parent path.
std::string Join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }

// Context for one parse: errors read "<where>: <key path>: <message>".
struct Parser {
  const std::string& where;

  Error Err(const std::string& path, const std::string& msg) const {
    return MakeError(where, ": ", path, ": ", msg);
  }
  Error TypeErr(const std::string& path, const char* expected, const OJ& found) const {
    return Err(path, std::string("expected ") + expected + ", found " + Found(found));
  }

  // Member lookup; nullptr when absent.
  static const OJ* Get(const OJ& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  static bool AbsentOrNull(const OJ* v) { return v == nullptr || v->is_null(); }

  Result<std::string> String(const OJ& obj, const std::string& path, const char* key) const {
    const OJ* v = Get(obj, key);
    if (v == nullptr) return Err(Join(path, key), "missing (expected a string)");
    if (!v->is_string()) return TypeErr(Join(path, key), "a string", *v);
    return v->get<std::string>();
  }
  // Absent or null → nullopt.
  Result<std::optional<std::string>> OptString(const OJ& obj, const std::string& path, const char* key) const {
    const OJ* v = Get(obj, key);
    if (AbsentOrNull(v)) return std::optional<std::string>();
    if (!v->is_string()) return TypeErr(Join(path, key), "a string or null", *v);
    return std::optional<std::string>(v->get<std::string>());
  }
  Result<bool> Bool(const OJ& obj, const std::string& path, const char* key, std::optional<bool> dflt) const {
    const OJ* v = Get(obj, key);
    if (v == nullptr && dflt.has_value()) return *dflt;
    if (v == nullptr) return Err(Join(path, key), "missing (expected true or false)");
    if (!v->is_boolean()) return TypeErr(Join(path, key), "a boolean", *v);
    return v->get<bool>();
  }
  Result<std::vector<std::string>> StringList(const OJ& v, const std::string& path) const {
    std::vector<std::string> out;
    if (v.is_null()) return out;
    if (!v.is_array()) return TypeErr(path, "a list of strings or null", v);
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) return TypeErr(path + "[" + std::to_string(i) + "]", "a string", v[i]);
      out.push_back(v[i].get<std::string>());
    }
    return out;
  }

  Result<WeightQuantSpec> Spec(const OJ& j, const std::string& path) const;
  Result<std::optional<WeightQuantSpec>> QuantizationConfig(const OJ& j, const std::string& path) const;
  Result<QuarkExportConfig> Export(const OJ& j, const std::string& path) const;
};

Result<WeightQuantSpec> Parser::Spec(const OJ& j, const std::string& path) const {
  if (j.is_array())
    return Err(path, "multi-stage (list-valued) quantization specs are not supported; expected one spec object");
  if (!j.is_object()) return TypeErr(path, "a QuantizationSpec object", j);
  WeightQuantSpec s;

  NIBBLE_ASSIGN_OR_RETURN(std::string dtype, String(j, path, "dtype"));
  if (dtype == "int4") {
    s.dtype = QuantDType::kInt4;
  } else if (dtype == "uint4") {
    s.dtype = QuantDType::kUint4;
  } else {
    return Err(path + ".dtype", "unsupported dtype " + Quoted(dtype) + " (expected \"int4\" or \"uint4\"; nibble reads 4-bit weight-only checkpoints)");
  }

  NIBBLE_ASSIGN_OR_RETURN(s.is_dynamic, Bool(j, path, "is_dynamic", false));
  if (s.is_dynamic) return Err(path + ".is_dynamic", "true is unsupported (expected false: static weight quantization)");

  NIBBLE_ASSIGN_OR_RETURN(std::string qscheme, String(j, path, "qscheme"));
  if (qscheme == "per_group") {
    s.qscheme = QScheme::kPerGroup;
  } else if (qscheme == "per_channel") {
    s.qscheme = QScheme::kPerChannel;
  } else {
    return Err(path + ".qscheme", "unsupported qscheme " + Quoted(qscheme) + " (expected \"per_group\" or \"per_channel\")");
  }
  const bool per_group = s.qscheme == QScheme::kPerGroup;

  // ch_axis: Quark can only pack per_group with ch_axis 1 (pack.py); per_channel uses axis 0.
  const int64_t want_axis = per_group ? 1 : 0;
  const OJ* axis = Get(j, "ch_axis");
  s.ch_axis = want_axis;
  if (!AbsentOrNull(axis)) {
    if (!axis->is_number_integer()) return TypeErr(path + ".ch_axis", "an integer", *axis);
    if (axis->get<int64_t>() != want_axis)
      return Err(path + ".ch_axis", "unsupported value " + axis->dump() + " for qscheme " + Quoted(qscheme) +
                                        " (expected " + std::to_string(want_axis) + ")");
  }

  const OJ* gs = Get(j, "group_size");
  if (per_group) {
    if (AbsentOrNull(gs))
      return Err(path + ".group_size", std::string(gs == nullptr ? "missing" : "null") +
                                           "; per_group quantization needs a positive integer group_size (or -1 for whole rows)");
    if (!gs->is_number_integer()) return TypeErr(path + ".group_size", "an integer (positive, or -1)", *gs);
    int64_t g = gs->get<int64_t>();
    if (gs->is_number_unsigned() && gs->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) g = 0;
    if (g == 0 || g < -1)
      return Err(path + ".group_size", "invalid value " + gs->dump() + " (expected a positive integer, or -1 for whole rows)");
    s.group_size = g;
  } else {
    if (!AbsentOrNull(gs) && !(gs->is_number_integer() && gs->get<int64_t>() == -1))
      return Err(path + ".group_size", "expected null or -1 for per_channel, found " + Found(*gs));
    s.group_size = -1;
  }

  NIBBLE_ASSIGN_OR_RETURN(s.symmetric, Bool(j, path, "symmetric", std::nullopt));
  if ((s.dtype == QuantDType::kInt4) != s.symmetric)
    return Err(path, std::string("unsupported combination dtype ") + Quoted(dtype) + " with symmetric " +
                         (s.symmetric ? "true" : "false") +
                         " (supported: int4 symmetric, uint4 asymmetric — Quark's own AWQ mapping)");

  NIBBLE_ASSIGN_OR_RETURN(auto round_method, OptString(j, path, "round_method"));
  s.round_method = round_method.value_or("half_even");
  if (s.round_method != "half_even" && s.round_method != "round" && s.round_method != "floor")
    return Err(path + ".round_method", "unknown value " + Quoted(s.round_method) + " (expected \"half_even\", \"round\" or \"floor\")");

  NIBBLE_ASSIGN_OR_RETURN(auto scale_type, OptString(j, path, "scale_type"));
  s.scale_type = scale_type.value_or("float");
  if (s.scale_type != "float" && s.scale_type != "float32" && s.scale_type != "float16" && s.scale_type != "bfloat16")
    return Err(path + ".scale_type", "unsupported value " + Quoted(s.scale_type) +
                                         " (expected \"float\", \"float32\", \"float16\" or \"bfloat16\")");

  NIBBLE_ASSIGN_OR_RETURN(s.scale_format, OptString(j, path, "scale_format"));
  NIBBLE_ASSIGN_OR_RETURN(s.scale_calculation_mode, OptString(j, path, "scale_calculation_mode"));
  NIBBLE_ASSIGN_OR_RETURN(s.mx_element_dtype, OptString(j, path, "mx_element_dtype"));
  NIBBLE_ASSIGN_OR_RETURN(s.observer_cls, OptString(j, path, "observer_cls"));
  NIBBLE_ASSIGN_OR_RETURN(s.is_scale_quant, Bool(j, path, "is_scale_quant", false));
  if (s.is_scale_quant) return Err(path + ".is_scale_quant", "true is unsupported (expected false)");
  return s;
}

Result<std::optional<WeightQuantSpec>> Parser::QuantizationConfig(const OJ& j, const std::string& path) const {
  if (j.is_null()) return std::optional<WeightQuantSpec>();
  if (!j.is_object()) return TypeErr(path, "a QuantizationConfig object or null", j);
  const OJ* in = Get(j, "input_tensors");
  if (!AbsentOrNull(in))
    return Err(path + ".input_tensors", "is not null: activation quantization, not W4A16, unsupported; found " + Found(*in));
  for (const char* key : {"output_tensors", "bias"}) {
    const OJ* v = Get(j, key);
    if (!AbsentOrNull(v))
      return Err(Join(path, key), "is not null: output/bias quantization, not W4A16, unsupported; found " + Found(*v));
  }
  const OJ* dev = Get(j, "target_device");
  if (!AbsentOrNull(dev) && !dev->is_string()) return TypeErr(path + ".target_device", "a string or null", *dev);
  const OJ* w = Get(j, "weight");
  if (AbsentOrNull(w)) return std::optional<WeightQuantSpec>();
  NIBBLE_ASSIGN_OR_RETURN(WeightQuantSpec s, Spec(*w, path + ".weight"));
  return std::optional<WeightQuantSpec>(std::move(s));
}

Result<QuarkExportConfig> Parser::Export(const OJ& j, const std::string& path) const {
  if (!j.is_object()) return TypeErr(path, "an object", j);
  QuarkExportConfig e;
  NIBBLE_ASSIGN_OR_RETURN(auto pack, OptString(j, path, "pack_method"));
  if (pack.has_value()) {
    if (*pack == "reorder") {
      e.pack_method = PackMethod::kReorder;
    } else if (*pack == "order") {
      e.pack_method = PackMethod::kOrder;
    } else {
      return Err(path + ".pack_method", "unknown value " + Quoted(*pack) + " (expected \"reorder\" or \"order\")");
    }
  }
  NIBBLE_ASSIGN_OR_RETURN(auto fmt, OptString(j, path, "weight_format"));
  if (fmt.has_value()) {
    if (*fmt == "real_quantized") {
      e.weight_format = WeightFormat::kRealQuantized;
    } else if (*fmt == "fake_quantized") {
      e.weight_format = WeightFormat::kFakeQuantized;
    } else {
      return Err(path + ".weight_format", "unknown value " + Quoted(*fmt) + " (expected \"real_quantized\" or \"fake_quantized\")");
    }
  }
  if (const OJ* v = Get(j, "kv_cache_group")) {
    NIBBLE_ASSIGN_OR_RETURN(e.kv_cache_group, StringList(*v, path + ".kv_cache_group"));
  }
  if (const OJ* v = Get(j, "min_kv_scale"); !AbsentOrNull(v)) {
    if (!v->is_number()) return TypeErr(path + ".min_kv_scale", "a number", *v);
    e.min_kv_scale = v->get<double>();
  }
  if (const OJ* v = Get(j, "weight_merge_groups"); !AbsentOrNull(v)) {
    if (!v->is_array()) return TypeErr(path + ".weight_merge_groups", "a list of lists of strings or null", *v);
    std::vector<std::vector<std::string>> groups;
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string p = path + ".weight_merge_groups[" + std::to_string(i) + "]";
      if (!(*v)[i].is_array()) return TypeErr(p, "a list of strings", (*v)[i]);
      NIBBLE_ASSIGN_OR_RETURN(auto g, StringList((*v)[i], p));
      groups.push_back(std::move(g));
    }
    e.weight_merge_groups = std::move(groups);
  }
  return e;
}

OJ SpecToJson(const std::optional<WeightQuantSpec>& spec) {
  OJ c = OJ::object();
  c["input_tensors"] = nullptr;
  c["output_tensors"] = nullptr;
  if (!spec.has_value()) {
    c["weight"] = nullptr;
  } else {
    const WeightQuantSpec& s = *spec;
    auto opt = [](const std::optional<std::string>& v) { return v.has_value() ? OJ(*v) : OJ(nullptr); };
    OJ w = OJ::object();
    w["dtype"] = QuantDTypeName(s.dtype);
    w["is_dynamic"] = s.is_dynamic;
    w["qscheme"] = QSchemeName(s.qscheme);
    w["ch_axis"] = s.ch_axis;
    w["group_size"] = s.qscheme == QScheme::kPerChannel ? OJ(nullptr) : OJ(s.group_size);
    w["symmetric"] = s.symmetric;
    w["round_method"] = s.round_method;
    w["scale_type"] = s.scale_type;
    w["scale_format"] = opt(s.scale_format);
    w["scale_calculation_mode"] = opt(s.scale_calculation_mode);
    w["mx_element_dtype"] = opt(s.mx_element_dtype);
    w["observer_cls"] = opt(s.observer_cls);
    w["is_scale_quant"] = s.is_scale_quant;
    c["weight"] = std::move(w);
  }
  c["bias"] = nullptr;
  c["target_device"] = nullptr;
  return c;
}

}  // namespace

const char* QuantDTypeName(QuantDType d) { return d == QuantDType::kInt4 ? "int4" : "uint4"; }
const char* QSchemeName(QScheme q) { return q == QScheme::kPerGroup ? "per_group" : "per_channel"; }
const char* PackMethodName(PackMethod p) { return p == PackMethod::kReorder ? "reorder" : "order"; }
const char* WeightFormatName(WeightFormat f) {
  return f == WeightFormat::kRealQuantized ? "real_quantized" : "fake_quantized";
}

Result<QuarkQuantConfig> ParseQuarkQuantConfig(const nlohmann::ordered_json& j, const std::string& where) {
  Parser p{where};
  if (!j.is_object()) return MakeError(where, ": expected a quantization_config object, found ", Found(j));
  QuarkQuantConfig c;

  NIBBLE_ASSIGN_OR_RETURN(std::string method, p.String(j, "", "quant_method"));
  if (method != "quark")
    return p.Err("quant_method", "expected \"quark\", found " + Quoted(method) + " (not an AMD Quark checkpoint)");

  const OJ* exp = Parser::Get(j, "export");
  if (exp == nullptr)
    return p.Err("export", "missing; the export key should be included in the configurations of Quark quantized "
                           "models (it carries pack_method)");
  NIBBLE_ASSIGN_OR_RETURN(c.export_config, p.Export(*exp, "export"));

  const OJ* global = Parser::Get(j, "global_quant_config");
  if (global == nullptr) return p.Err("global_quant_config", "missing (expected a QuantizationConfig object or null)");
  NIBBLE_ASSIGN_OR_RETURN(c.global, p.QuantizationConfig(*global, "global_quant_config"));

  if (const OJ* v = Parser::Get(j, "layer_quant_config"); !Parser::AbsentOrNull(v)) {
    if (!v->is_object()) return p.TypeErr("layer_quant_config", "an object (pattern -> QuantizationConfig) or null", *v);
    for (auto it = v->begin(); it != v->end(); ++it) {
      NIBBLE_ASSIGN_OR_RETURN(auto spec, p.QuantizationConfig(it.value(), "layer_quant_config[" + Quoted(it.key()) + "]"));
      c.layer_quant_config.emplace_back(it.key(), std::move(spec));
    }
  }
  if (const OJ* v = Parser::Get(j, "layer_type_quant_config"); !Parser::AbsentOrNull(v)) {
    if (!v->is_object()) return p.TypeErr("layer_type_quant_config", "an object (class name -> QuantizationConfig) or null", *v);
    for (auto it = v->begin(); it != v->end(); ++it) {
      NIBBLE_ASSIGN_OR_RETURN(auto spec, p.QuantizationConfig(it.value(), "layer_type_quant_config[" + Quoted(it.key()) + "]"));
      c.layer_type_quant_config.emplace(it.key(), std::move(spec));
    }
  }
  if (const OJ* v = Parser::Get(j, "kv_cache_quant_config"); !Parser::AbsentOrNull(v)) {
    if (!v->is_object()) return p.TypeErr("kv_cache_quant_config", "an object or null", *v);
    if (!v->empty())
      return p.Err("kv_cache_quant_config", "KV-cache quantization is not supported (expected {} for W4A16), found " + Found(*v));
  }
  if (const OJ* v = Parser::Get(j, "exclude")) {
    NIBBLE_ASSIGN_OR_RETURN(c.exclude, p.StringList(*v, "exclude"));
    for (size_t i = 0; i < c.exclude.size(); ++i) {
      Status s = ValidateExcludeEntry(c.exclude[i]);
      if (!s.ok()) return p.Err("exclude[" + std::to_string(i) + "]", s.error().message);
    }
  }
  if (const OJ* v = Parser::Get(j, "algo_config"); !Parser::AbsentOrNull(v)) {
    if (v->is_object()) {
      c.algo_config = OJ::array({*v});  // legacy: a single algo object
    } else if (v->is_array()) {
      c.algo_config = *v;
    } else {
      return p.TypeErr("algo_config", "a list of algo objects, an object or null", *v);
    }
  }
  if (const OJ* v = Parser::Get(j, "calibration"); !Parser::AbsentOrNull(v)) {
    if (!v->is_object()) return p.TypeErr("calibration", "an object or null", *v);
    c.calibration = *v;
  }
  if (const OJ* v = Parser::Get(j, "softmax_quant_spec"); !Parser::AbsentOrNull(v))
    return p.Err("softmax_quant_spec", "softmax quantization is not supported (expected null), found " + Found(*v));
  NIBBLE_ASSIGN_OR_RETURN(auto mode, p.OptString(j, "", "quant_mode"));
  c.quant_mode = mode.value_or("eager_mode");
  NIBBLE_ASSIGN_OR_RETURN(c.version, p.OptString(j, "", "version"));
  return c;
}

namespace {

// Every key of object `j` (at `path`) must be in `known`.
Status CheckKeys(const OJ& j, const std::string& where, const std::string& path, const std::vector<std::string>& known) {
  if (!j.is_object()) return Status::Ok();  // the parser reports the type
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    const std::string near = ClosestOf(it.key(), known);
    return MakeError(where, ": ", Join(path, it.key().c_str()), ": unknown key",
                     near.empty() ? std::string() : " (did you mean \"" + near + "\"?)");
  }
  return Status::Ok();
}

Status CheckQuantizationConfigKeys(const OJ& j, const std::string& where, const std::string& path) {
  static const std::vector<std::string> config = {"input_tensors", "output_tensors", "weight", "bias", "target_device"};
  static const std::vector<std::string> spec = {"dtype", "is_dynamic", "qscheme", "ch_axis", "group_size", "symmetric",
                                                "round_method", "scale_type", "scale_format", "scale_calculation_mode",
                                                "mx_element_dtype", "observer_cls", "is_scale_quant"};
  NIBBLE_RETURN_IF_ERROR(CheckKeys(j, where, path, config));
  if (j.is_object() && j.contains("weight")) NIBBLE_RETURN_IF_ERROR(CheckKeys(j["weight"], where, path + ".weight", spec));
  return Status::Ok();
}

}  // namespace

Status CheckQuarkConfigKeys(const OJ& j, const std::string& where) {
  static const std::vector<std::string> top = {
      "quant_method", "export", "global_quant_config", "layer_quant_config", "layer_type_quant_config",
      "kv_cache_quant_config", "exclude", "algo_config", "softmax_quant_spec", "quant_mode", "version",
      "pre_quant_opt_config", "log_severity_level", "custom_mode", "calibration"};
  static const std::vector<std::string> exp = {"pack_method", "weight_format", "kv_cache_group", "min_kv_scale",
                                               "weight_merge_groups"};
  NIBBLE_RETURN_IF_ERROR(CheckKeys(j, where, "", top));
  if (!j.is_object()) return Status::Ok();
  if (j.contains("export")) NIBBLE_RETURN_IF_ERROR(CheckKeys(j["export"], where, "export", exp));
  if (j.contains("global_quant_config"))
    NIBBLE_RETURN_IF_ERROR(CheckQuantizationConfigKeys(j["global_quant_config"], where, "global_quant_config"));
  for (const char* map : {"layer_quant_config", "layer_type_quant_config"}) {
    if (!j.contains(map) || !j[map].is_object()) continue;
    for (auto it = j[map].begin(); it != j[map].end(); ++it)
      NIBBLE_RETURN_IF_ERROR(CheckQuantizationConfigKeys(it.value(), where, std::string(map) + "[" + Quoted(it.key()) + "]"));
  }
  return Status::Ok();
}

Result<QuarkQuantConfig> ParseQuarkQuantConfigFromConfigJson(const std::string& text, const std::string& where) {
  // Same duplicate-key rule as io/json.cc, but keeping key order.
  std::vector<std::set<std::string>> keys_per_depth;
  std::string duplicate;
  OJ::parser_callback_t cb = [&](int depth, OJ::parse_event_t event, OJ& parsed) {
    size_t d = static_cast<size_t>(depth);
    if (keys_per_depth.size() <= d + 1) keys_per_depth.resize(d + 2);
    if (event == OJ::parse_event_t::object_start) {
      keys_per_depth[d + 1].clear();
    } else if (event == OJ::parse_event_t::key) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys_per_depth[d].insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  OJ j;
  try {
    j = OJ::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const OJ::exception& e) {
    return MakeError(where, ": not valid JSON (", PrintableBytes(e.what()), ")");
  }
  if (!duplicate.empty()) return MakeError(where, ": duplicate key \"", duplicate, "\"");
  if (!j.is_object()) return MakeError(where, ": expected a JSON object, found ", j.type_name());
  auto it = j.find("quantization_config");
  if (it == j.end()) return MakeError(where, ": no \"quantization_config\" key (not a quantized checkpoint)");
  return ParseQuarkQuantConfig(*it, where + ": quantization_config");
}

nlohmann::ordered_json ToJson(const QuarkQuantConfig& c) {
  OJ j = OJ::object();
  j["quant_method"] = "quark";
  OJ e = OJ::object();
  e["kv_cache_group"] = c.export_config.kv_cache_group;
  e["min_kv_scale"] = c.export_config.min_kv_scale;
  e["pack_method"] = PackMethodName(c.export_config.pack_method);
  e["weight_format"] = WeightFormatName(c.export_config.weight_format);
  e["weight_merge_groups"] = c.export_config.weight_merge_groups.has_value()
                                 ? OJ(*c.export_config.weight_merge_groups) : OJ(nullptr);
  j["export"] = std::move(e);
  j["global_quant_config"] = SpecToJson(c.global);
  OJ layers = OJ::object();
  for (const auto& [pattern, spec] : c.layer_quant_config) layers[pattern] = SpecToJson(spec);
  j["layer_quant_config"] = std::move(layers);
  OJ types = OJ::object();
  for (const auto& [cls, spec] : c.layer_type_quant_config) types[cls] = SpecToJson(spec);
  j["layer_type_quant_config"] = std::move(types);
  j["kv_cache_quant_config"] = OJ::object();
  j["exclude"] = c.exclude;
  j["algo_config"] = c.algo_config;
  j["softmax_quant_spec"] = nullptr;
  j["quant_mode"] = c.quant_mode;
  if (c.version.has_value()) j["version"] = *c.version;
  if (!c.calibration.is_null()) j["calibration"] = c.calibration;
  return j;
}

std::vector<std::string> LayerKeyPatterns(const std::string& key) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos <= key.size()) {
    size_t comma = key.find(',', pos);
    if (comma == std::string::npos) comma = key.size();
    std::string part = key.substr(pos, comma - pos);
    const size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    if (b != std::string::npos) parts.push_back(part.substr(b, e - b + 1));
    pos = comma + 1;
  }
  return parts;
}

bool LayerKeyMatches(const std::string& layer_name, const std::string& key) {
  if (key.find(',') == std::string::npos) return FnMatch(layer_name, key);
  for (const std::string& p : LayerKeyPatterns(key))
    if (FnMatch(layer_name, p)) return true;
  return false;
}

void SetScaleDType(QuarkQuantConfig& c, DType dt) {
  NIBBLE_CHECK(dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16);
  const std::string scale_type = dt == DType::kF32 ? "float32" : dt == DType::kF16 ? "float16" : "bfloat16";
  auto set = [&](std::optional<WeightQuantSpec>& s) {
    if (s) s->scale_type = scale_type;
  };
  set(c.global);
  for (auto& [name, s] : c.layer_quant_config) set(s);
  for (auto& [name, s] : c.layer_type_quant_config) set(s);
}

Result<std::vector<std::string>> UnusedConfigEntries(const QuarkQuantConfig& c, const std::vector<std::string>& modules) {
  std::vector<std::string> out;
  // A mistyped exclude quantizes what it meant to keep. An entry matching lm_head is not reported:
  // a tied model may list no such module (as compressed-tensors' ignore).
  for (const std::string& e : c.exclude) {
    NIBBLE_ASSIGN_OR_RETURN(bool head, MatchesExcludeEntry("lm_head", e));
    if (head) continue;
    bool any = false;
    for (const std::string& m : modules) {
      NIBBLE_ASSIGN_OR_RETURN(bool hit, MatchesExcludeEntry(m, e));
      if ((any = hit)) break;
    }
    if (!any) out.push_back("exclude entry " + Quoted(e) + " matched no layer");
  }
  for (const auto& [key, spec] : c.layer_quant_config) {
    const std::vector<std::string> parts = LayerKeyPatterns(key);
    std::vector<std::string> matched;
    for (const std::string& part : parts) {
      bool any = false;
      for (const std::string& m : modules)
        if (FnMatch(m, part)) {
          any = true;
          if (std::find(matched.begin(), matched.end(), m) == matched.end()) matched.push_back(m);
        }
      if (!any && parts.size() > 1)
        out.push_back("layer_quant_config key " + Quoted(key) + ": pattern " + Quoted(part) + " matched no layer");
    }
    if (matched.empty()) {
      if (parts.size() <= 1) out.push_back("layer_quant_config pattern " + Quoted(key) + " matched no layer");
      continue;
    }
    bool decides = false;
    std::string excluded_by;
    for (const std::string& m : matched) {
      NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(c, m));
      decides = decides || r.rule == "layer_quant_config[" + Quoted(key) + "]";
      if (!r.spec && r.rule.rfind("excluded by ", 0) == 0 && excluded_by.empty()) excluded_by = m + " is " + r.rule;
    }
    if (decides) continue;
    out.push_back("layer_quant_config pattern " + Quoted(key) + " decides no layer: " +
                  (excluded_by.empty() ? "every layer it matches is decided by an earlier key"
                                       : excluded_by + ", and exclude wins over layer_quant_config"));
  }
  for (const auto& [type, spec] : c.layer_type_quant_config)
    if (type != "Linear")
      out.push_back("layer_type_quant_config type " + Quoted(type) +
                    " matches no layer (nibble's layers are Quark type \"Linear\", the only type accepted)");
  return out;
}

Result<ResolvedLayerConfig> ResolveLayer(const QuarkQuantConfig& c, const std::string& layer_name) {
  for (const std::string& entry : c.exclude) {
    NIBBLE_ASSIGN_OR_RETURN(bool hit, MatchesExcludeEntry(layer_name, entry));
    if (hit) return ResolvedLayerConfig{std::nullopt, "excluded by " + Quoted(entry)};
  }
  for (const auto& [pattern, spec] : c.layer_quant_config) {
    if (LayerKeyMatches(layer_name, pattern)) return ResolvedLayerConfig{spec, "layer_quant_config[" + Quoted(pattern) + "]"};
  }
  if (auto it = c.layer_type_quant_config.find("Linear"); it != c.layer_type_quant_config.end())
    return ResolvedLayerConfig{it->second, "layer_type_quant_config[\"Linear\"]"};
  return ResolvedLayerConfig{c.global, "global_quant_config"};
}

}  // namespace nibble
