// GPTQ config parsing and per-module resolution (see gptq_config.h).
#include "formats/gptq_config.h"

#include "base/strings.h"
#include "formats/fnmatch.h"
#include "formats/packed_linear.h"

namespace nibble {
namespace {

Result<GptqOverride> ParseOverride(const std::string& key, const nlohmann::json& v, const std::string& where) {
  GptqOverride o;
  o.key = key;
  o.exclude = key.starts_with("-:");
  o.pattern = key.starts_with("-:") || key.starts_with("+:") ? key.substr(2) : key;
  const std::string at = where + ": dynamic[" + Quoted(key) + "]";
  const Status valid = ValidateExcludeEntry("re:" + o.pattern);
  if (!valid.ok()) return MakeErrorCode(ErrorCode::kCorruptInput, at, ": not a valid regular expression: ", valid.error().message);
  if (!v.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, at, ": expected an object, found ", v.dump());
  NIBBLE_ASSIGN_OR_RETURN(std::optional<int64_t> bits, ConfigInt(v, "bits", at));
  if (bits && *bits != 4) return MakeErrorCode(ErrorCode::kUnsupported, at, ": bits ", *bits, " is not supported (expected 4)");
  NIBBLE_ASSIGN_OR_RETURN(o.group_size, ConfigInt(v, "group_size", at));
  if (o.group_size) NIBBLE_RETURN_IF_ERROR(CheckGroupSizeValue(*o.group_size, at));
  NIBBLE_ASSIGN_OR_RETURN(o.sym, ConfigBool(v, "sym", at));
  NIBBLE_ASSIGN_OR_RETURN(o.desc_act, ConfigBool(v, "desc_act", at));
  return o;
}

Result<bool> ParseCheckpointFormat(const nlohmann::json& qc, const std::string& where) {
  NIBBLE_ASSIGN_OR_RETURN(std::optional<std::string> cf, ConfigString(qc, "checkpoint_format", where));
  if (!cf) {
    NIBBLE_ASSIGN_OR_RETURN(cf, ConfigString(qc, "format", where));
  }
  const std::string f = cf.value_or("gptq");
  if (f == "gptq" || f == "gptq_v2") return f == "gptq_v2";
  return MakeErrorCode(ErrorCode::kUnsupported, where, ": checkpoint_format ", Quoted(f), " is not supported (nibble reads "
                       "\"gptq\" (v1) and \"gptq_v2\"; marlin, bitblas, ipex, qqq and other kernel layouts are not read)");
}

QuantSpec SpecFor(int64_t group_size, bool sym, bool desc_act) {
  QuantSpec q;
  q.group_size = group_size;
  q.symmetric = sym;
  q.act_order = desc_act;
  q.scale_dtype = DType::kF16;
  return q;
}

}  // namespace

Result<GptqConfig> ParseGptqConfig(const nlohmann::ordered_json& ordered, const std::string& where) {
  GptqConfig c;
  const nlohmann::json qc = nlohmann::json::parse(ordered.dump());
  NIBBLE_ASSIGN_OR_RETURN(std::optional<int64_t> bits, ConfigInt(qc, "bits", where));
  if (bits.value_or(4) != 4) return MakeErrorCode(ErrorCode::kUnsupported, where, ": bits ", *bits, " is not supported (expected 4)");
  NIBBLE_ASSIGN_OR_RETURN(std::optional<int64_t> g, ConfigInt(qc, "group_size", where));
  c.group_size = g.value_or(128);
  NIBBLE_RETURN_IF_ERROR(CheckGroupSizeValue(c.group_size, where));
  NIBBLE_ASSIGN_OR_RETURN(std::optional<bool> sym, ConfigBool(qc, "sym", where));
  c.sym = sym.value_or(true);
  NIBBLE_ASSIGN_OR_RETURN(std::optional<bool> desc_act, ConfigBool(qc, "desc_act", where));
  c.desc_act = desc_act.value_or(false);
  NIBBLE_ASSIGN_OR_RETURN(std::optional<bool> lm_head, ConfigBool(qc, "lm_head", where));
  c.lm_head = lm_head.value_or(false);
  NIBBLE_ASSIGN_OR_RETURN(c.v2, ParseCheckpointFormat(qc, where));
  if (qc.contains("modules_in_block_to_quantize") && !qc["modules_in_block_to_quantize"].is_null() &&
      !qc["modules_in_block_to_quantize"].empty())
    return MakeErrorCode(ErrorCode::kUnsupported, where, ": modules_in_block_to_quantize is not supported (found ",
                         qc["modules_in_block_to_quantize"].dump(), "); express float modules with dynamic \"-:\" entries");
  if (qc.contains("dynamic") && !qc["dynamic"].is_null()) {
    const nlohmann::ordered_json& d = ordered["dynamic"];
    if (!d.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": key \"dynamic\": expected an object, found ", d.dump());
    // The first matching entry decides, so the file's key order is kept (ordered_json).
    for (const auto& [key, v] : d.items()) {
      NIBBLE_ASSIGN_OR_RETURN(GptqOverride o, ParseOverride(key, nlohmann::json::parse(v.dump()), where));
      c.dynamic.push_back(std::move(o));
    }
  }
  return c;
}

Status CheckGptqConfigsAgree(const nlohmann::ordered_json& a, const std::string& a_path, const nlohmann::ordered_json& b,
                             const std::string& b_path) {
  for (const char* key : {"quant_method", "bits", "group_size", "desc_act", "sym", "checkpoint_format", "format", "lm_head",
                          "dynamic", "static_groups"}) {
    if (!a.contains(key) || !b.contains(key) || a[key] == b[key]) continue;
    return MakeErrorCode(ErrorCode::kCorruptInput, a_path, ": quantization_config.", key, " is ", a[key].dump(), " but ", b_path,
                         " says ", b[key].dump(), "; the two GPTQ configs must agree");
  }
  return Status::Ok();
}

Result<LinearPlan> ResolveGptq(const GptqConfig& c, const std::string& module) {
  if (module == "lm_head" && !c.lm_head) return LinearPlan{std::nullopt, "lm_head stays float (\"lm_head\" is not true)"};
  for (const GptqOverride& o : c.dynamic) {
    auto hit = MatchesExcludeEntry(module, "re:" + o.pattern);
    if (!hit.ok()) return hit.error().WithContext("dynamic " + Quoted(o.key));
    if (!*hit) continue;
    if (o.exclude) return LinearPlan{std::nullopt, "dynamic " + Quoted(o.key)};
    return LinearPlan{SpecFor(o.group_size.value_or(c.group_size), o.sym.value_or(c.sym), o.desc_act.value_or(c.desc_act)),
                      "dynamic " + Quoted(o.key)};
  }
  return LinearPlan{SpecFor(c.group_size, c.sym, c.desc_act),
                    "global (group_size " + std::to_string(c.group_size) + ", sym " + (c.sym ? "true" : "false") + ")"};
}

Result<std::optional<QuantSpec>> ResolveGptqSpec(const GptqConfig& c, const std::string& module) {
  NIBBLE_ASSIGN_OR_RETURN(LinearPlan p, ResolveGptq(c, module));
  return p.spec;
}

}  // namespace nibble
