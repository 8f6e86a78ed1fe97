// compressed-tensors quantization_config parsing and module resolution (see the header).
#include "formats/compressed_tensors_config.h"

#include <set>

#include "formats/fnmatch.h"

namespace nibble {

namespace {

using OJ = nlohmann::ordered_json;

Error Unsupported(const std::string& where, const std::string& key, const std::string& what) {
  return MakeErrorCode(ErrorCode::kUnsupported, where, ".", key, ": ", what);
}
Error WrongType(const std::string& where, const std::string& key, const char* expected, const OJ& found) {
  return MakeErrorCode(ErrorCode::kCorruptInput, where, ".", key, ": expected ", expected, ", found ", found.type_name(),
                       " ", found.dump());
}
bool Null(const OJ& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

// A key that must be absent, null or empty ({} / []): the features nibble does not run.
Status CheckAbsent(const OJ& j, const std::string& where, const char* key, const char* what) {
  if (Null(j, key) || (j[key].is_object() && j[key].empty()) || (j[key].is_array() && j[key].empty()))
    return Status::Ok();
  return Unsupported(where, key, std::string(what) + " is not supported (found " + j[key].dump() + ")");
}

Result<std::vector<std::string>> StringList(const OJ& j, const std::string& where, const std::string& key) {
  std::vector<std::string> out;
  if (j.is_null()) return out;
  if (!j.is_array()) return WrongType(where, key, "a list of strings", j);
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = key + "[" + std::to_string(i) + "]";
    if (!j[i].is_string()) return WrongType(where, at, "a string", j[i]);
    out.push_back(j[i].get<std::string>());
    const Status s = ValidateExcludeEntry(out.back());  // a `re:` entry must compile (RE2)
    if (!s.ok()) return MakeErrorCode(ErrorCode::kUnsupported, where, ".", at, ": ", s.error().message);
  }
  return out;
}

// The effective format of a group: its own `format` key, else the top-level one.
Status CheckFormat(const OJ& top, const OJ& group, const std::string& where, const std::string& key) {
  const bool own = !Null(group, "format");
  const OJ& f = own ? group["format"] : top.contains("format") ? top["format"] : OJ();
  const std::string at = own ? key + ".format" : "format";
  if (!f.is_string()) return WrongType(where, at, "a string (\"pack-quantized\")", f);
  const std::string name = f.get<std::string>();
  if (name == "pack-quantized") return Status::Ok();
  return Unsupported(where, at, "format \"" + name + "\" is not supported (nibble reads compressed-tensors \"pack-quantized\" int4 weights only)");
}

Result<CtActOrder> ParseActOrder(const OJ& w, const std::string& where, const std::string& key) {
  if (Null(w, "actorder")) return CtActOrder::kNone;
  const OJ& a = w["actorder"];
  if (a.is_boolean()) return a.get<bool>() ? CtActOrder::kGroup : CtActOrder::kNone;  // legacy bool form
  if (!a.is_string()) return WrongType(where, key + ".actorder", "null, \"group\" or \"weight\"", a);
  const std::string s = a.get<std::string>();
  if (s == "group" || s == "dynamic") return CtActOrder::kGroup;
  if (s == "weight" || s == "static") return CtActOrder::kWeight;
  return Unsupported(where, key + ".actorder", "\"" + s + "\" is not an actorder (expected null, \"group\" or \"weight\")");
}

// Strategy and group size: explicit strategy "group" (group_size > 0) or "channel" (group_size
// null or −1); an absent strategy is inferred from group_size as the library does.
Status ParseGranularity(const OJ& w, const std::string& where, const std::string& key, CtWeightArgs& a) {
  std::optional<int64_t> g;
  if (!Null(w, "group_size")) {
    if (!w["group_size"].is_number_integer()) return WrongType(where, key + ".group_size", "an integer or null", w["group_size"]);
    g = w["group_size"].get<int64_t>();
  }
  std::string strategy;
  if (!Null(w, "strategy")) {
    if (!w["strategy"].is_string()) return WrongType(where, key + ".strategy", "a string", w["strategy"]);
    strategy = w["strategy"].get<std::string>();
  } else {
    strategy = !g ? "tensor" : *g == -1 ? "channel" : "group";
  }
  if (strategy == "group") {
    if (!g || *g <= 0)
      return MakeErrorCode(ErrorCode::kCorruptInput, where, ".", key, ".group_size: strategy \"group\" needs a positive group_size, found ",
                           g ? std::to_string(*g) : "null");
    a.granularity = Granularity::kPerGroup;
    a.group_size = *g;
    return Status::Ok();
  }
  if (strategy == "channel") {
    if (g && *g != -1)
      return MakeErrorCode(ErrorCode::kCorruptInput, where, ".", key, ".group_size: strategy \"channel\" needs group_size null or -1, found ", *g);
    a.granularity = Granularity::kPerChannel;
    a.group_size = -1;
    return Status::Ok();
  }
  return Unsupported(where, key + ".strategy", "strategy \"" + strategy + "\" is not supported (expected \"group\" or \"channel\")");
}

Result<CtWeightArgs> ParseWeights(const OJ& w, const std::string& where, const std::string& key) {
  if (!w.is_object()) return WrongType(where, key, "an object (QuantizationArgs)", w);
  CtWeightArgs a;
  const OJ bits = w.contains("num_bits") ? w["num_bits"] : OJ(8);  // the library's default is 8
  if (!bits.is_number_integer()) return WrongType(where, key + ".num_bits", "an integer", bits);
  if (bits.get<int64_t>() != 4) return Unsupported(where, key + ".num_bits", bits.dump() + " is not supported (expected 4)");
  const OJ type = w.contains("type") ? w["type"] : OJ("int");
  if (!type.is_string()) return WrongType(where, key + ".type", "a string", type);
  if (type.get<std::string>() != "int")
    return Unsupported(where, key + ".type", "\"" + type.get<std::string>() + "\" is not supported (expected \"int\")");
  if (w.contains("symmetric")) {
    if (!w["symmetric"].is_boolean()) return WrongType(where, key + ".symmetric", "a boolean", w["symmetric"]);
    a.symmetric = w["symmetric"].get<bool>();
  }
  if (!Null(w, "dynamic") && !(w["dynamic"].is_boolean() && !w["dynamic"].get<bool>()))
    return Unsupported(where, key + ".dynamic", "dynamic weights (" + w["dynamic"].dump() + ") are not supported (expected false)");
  if (!Null(w, "block_structure"))
    return Unsupported(where, key + ".block_structure", "block quantization (" + w["block_structure"].dump() + ") is not supported");
  NIBBLE_RETURN_IF_ERROR(ParseGranularity(w, where, key, a));
  NIBBLE_ASSIGN_OR_RETURN(a.actorder, ParseActOrder(w, where, key));
  return a;
}

Result<CtGroup> ParseGroup(const OJ& top, const std::string& name, const OJ& g, const std::string& where) {
  const std::string key = "config_groups." + name;
  if (!g.is_object()) return WrongType(where, key, "an object", g);
  NIBBLE_RETURN_IF_ERROR(CheckAbsent(g, where + "." + key, "input_activations", "input activation quantization"));
  NIBBLE_RETURN_IF_ERROR(CheckAbsent(g, where + "." + key, "output_activations", "output activation quantization"));
  CtGroup out;
  out.name = name;
  if (!g.contains("targets")) return MakeErrorCode(ErrorCode::kCorruptInput, where, ".", key, ".targets: missing");
  NIBBLE_ASSIGN_OR_RETURN(out.targets, StringList(g["targets"], where, key + ".targets"));
  if (out.targets.empty()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ".", key, ".targets: empty");
  if (!Null(g, "weights")) {
    NIBBLE_RETURN_IF_ERROR(CheckFormat(top, g, where, key));
    NIBBLE_ASSIGN_OR_RETURN(out.weights, ParseWeights(g["weights"], where, key + ".weights"));
  }
  return out;
}

// Top-level keys that change what the stored tensors mean.
Status CheckTopLevel(const OJ& qc, const std::string& where) {
  if (!Null(qc, "quantization_status")) {
    const OJ& s = qc["quantization_status"];
    if (!s.is_string()) return WrongType(where, "quantization_status", "a string", s);
    if (s.get<std::string>() != "compressed")
      return Unsupported(where, "quantization_status", "\"" + s.get<std::string>() +
                                                           "\" is not supported (expected \"compressed\": packed weights)");
  }
  NIBBLE_RETURN_IF_ERROR(CheckAbsent(qc, where, "kv_cache_scheme", "KV-cache quantization"));
  NIBBLE_RETURN_IF_ERROR(CheckAbsent(qc, where, "transform_config", "a transform (rotation) config"));
  if (!Null(qc, "sparsity_config") && !(qc["sparsity_config"].is_object() && qc["sparsity_config"].empty())) {
    const OJ& sp = qc["sparsity_config"];
    const bool dense = sp.is_object() && sp.contains("format") && sp["format"] == "dense";
    if (!dense) return Unsupported(where, "sparsity_config", "a sparse weight layout is not supported (found " + sp.dump() + ")");
  }
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty())
    return MakeErrorCode(ErrorCode::kCorruptInput, where, ".config_groups: expected a non-empty object, found ",
                         qc.contains("config_groups") ? qc["config_groups"].dump() : std::string("nothing"));
  return Status::Ok();
}

}  // namespace

Result<CtConfig> ParseCtConfig(const OJ& qc, const std::string& where) {
  if (!qc.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": expected an object, found ", qc.type_name());
  NIBBLE_RETURN_IF_ERROR(CheckTopLevel(qc, where));
  CtConfig c;
  c.json = qc;
  for (const auto& [name, g] : qc["config_groups"].items()) {
    NIBBLE_ASSIGN_OR_RETURN(CtGroup group, ParseGroup(qc, name, g, where));
    c.groups.push_back(std::move(group));
  }
  for (size_t gi = 0; gi < c.groups.size(); ++gi)
    for (const std::string& t : c.groups[gi].targets) {
      bool seen = false;
      for (auto& [target, index] : c.targets)
        if (target == t) {
          index = gi;  // dict semantics: the later group's scheme, the first position
          seen = true;
        }
      if (!seen) c.targets.emplace_back(t, gi);
    }
  if (qc.contains("ignore")) {
    NIBBLE_ASSIGN_OR_RETURN(c.ignore, StringList(qc["ignore"], where, "ignore"));
  }
  return c;
}

QuantSpec CtSpecFor(const CtWeightArgs& a) {
  QuantSpec q;
  q.granularity = a.granularity;
  q.group_size = a.group_size;
  q.symmetric = a.symmetric;
  q.act_order = a.actorder == CtActOrder::kGroup;
  return q;
}

bool IsCtLinearClass(const std::string& entry) { return entry == "Linear" || entry == "Module"; }

Result<bool> CtEntryMatches(const std::string& name, const std::string& entry, bool class_names) {
  if (IsRegexEntry(entry)) return MatchesExcludeEntry(name, entry);
  return entry == name || (class_names && IsCtLinearClass(entry));
}

Result<CtResolved> ResolveCt(const CtConfig& c, const std::string& module) {
  for (const std::string& e : c.ignore) {
    NIBBLE_ASSIGN_OR_RETURN(bool hit, CtEntryMatches(module, e));
    if (hit) return CtResolved{std::nullopt, -1, "ignore \"" + e + "\""};
  }
  for (bool by_class : {false, true})
    for (const auto& [t, gi] : c.targets) {
      bool hit = false;
      if (by_class) {
        hit = IsCtLinearClass(t);
      } else if (!IsCtLinearClass(t)) {
        NIBBLE_ASSIGN_OR_RETURN(hit, CtEntryMatches(module, t, false));
      }
      if (!hit) continue;
      const CtGroup& g = c.groups[gi];
      CtResolved r;
      r.group = static_cast<int64_t>(gi);
      r.rule = "config_groups." + g.name + ".targets \"" + t + "\"";
      if (g.weights) r.spec = CtSpecFor(*g.weights);
      else r.rule += " (weights null)";
      return r;
    }
  return CtResolved{std::nullopt, -1, "no config group targets it"};
}

Result<std::vector<std::string>> CtUnusedEntries(const CtConfig& c, const std::vector<std::string>& modules) {
  std::vector<std::string> out;
  for (const std::string& e : c.ignore) {
    NIBBLE_ASSIGN_OR_RETURN(bool head, CtEntryMatches("lm_head", e));  // a tied model lists no lm_head
    if (head) continue;
    bool any = false;
    for (const std::string& m : modules) {
      NIBBLE_ASSIGN_OR_RETURN(bool hit, CtEntryMatches(m, e));
      if ((any = hit)) break;
    }
    if (!any) out.push_back("ignore entry \"" + e + "\" matched no layer");
  }
  std::set<int64_t> deciding;
  for (const std::string& m : modules) {
    NIBBLE_ASSIGN_OR_RETURN(CtResolved r, ResolveCt(c, m));
    deciding.insert(r.group);
  }
  for (const auto& [t, gi] : c.targets) {
    bool any = false;
    for (const std::string& m : modules) {
      NIBBLE_ASSIGN_OR_RETURN(bool hit, CtEntryMatches(m, t));
      if ((any = hit)) break;
    }
    if (!any) out.push_back("config_groups." + c.groups[gi].name + " target \"" + t + "\" matched no layer");
  }
  for (size_t gi = 0; gi < c.groups.size(); ++gi)
    if (deciding.count(static_cast<int64_t>(gi)) == 0)
      out.push_back("config_groups." + c.groups[gi].name + " decides no layer (every layer it targets is ignored or taken by another group)");
  return out;
}

OJ CtWeightArgsJson(const QuantSpec& spec, bool g_idx) {
  // One group per row is the channel strategy, however the request spelt it.
  const bool channel = spec.granularity == Granularity::kPerChannel || spec.group_size == -1;
  OJ w = OJ::object();
  w["actorder"] = g_idx ? OJ("group") : OJ();
  w["block_structure"] = nullptr;
  w["dynamic"] = false;
  w["group_size"] = channel ? OJ() : OJ(spec.group_size);
  w["num_bits"] = 4;
  w["observer"] = "minmax";
  w["observer_kwargs"] = OJ::object();
  w["strategy"] = channel ? "channel" : "group";
  w["symmetric"] = spec.symmetric;
  w["type"] = "int";
  return w;
}

}  // namespace nibble
