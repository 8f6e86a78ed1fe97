// GPTQ settings (see settings.h).
#include "quantize/gptq/settings.h"

namespace nibble {

Result<GptqScaleTiming> ParseGptqScaleTiming(const std::string& text, const std::string& what) {
  if (text == "up_front") return GptqScaleTiming::kUpFront;
  if (text == "dynamic") return GptqScaleTiming::kDynamic;
  return MakeErrorCode(ErrorCode::kUnsupported, what, " \"", text, "\" is not supported (supported: up_front, dynamic)");
}

Result<GptqActOrder> ParseGptqActOrder(const std::string& text, const std::string& what) {
  if (text == "none") return GptqActOrder::kNone;
  if (text == "static") return GptqActOrder::kStatic;
  if (text == "group") return GptqActOrder::kGroup;
  return MakeErrorCode(ErrorCode::kUnsupported, what, " \"", text, "\" is not supported (supported: none, static, group)");
}

const char* GptqScaleTimingName(GptqScaleTiming t) { return t == GptqScaleTiming::kUpFront ? "up_front" : "dynamic"; }

const char* GptqActOrderName(GptqActOrder a) {
  switch (a) {
    case GptqActOrder::kNone: return "none";
    case GptqActOrder::kStatic: return "static";
    default: return "group";
  }
}

Status ValidateGptqSettings(const GptqSettings& s, const GptqSettingNames& names) {
  if (!(s.dampening_frac > 0 && s.dampening_frac < 1))
    return MakeError(names.dampening_frac, " ", s.dampening_frac, " must be in (0, 1), e.g. 0.01");
  if (s.block_size < 1) return MakeError(names.block_size, " ", s.block_size, " must be at least 1");
  if (s.scale_timing == GptqScaleTiming::kDynamic && s.actorder == GptqActOrder::kStatic)
    return MakeError(names.scale_timing, " dynamic with ", names.actorder, " static would refit groups in the permuted "
                     "order while they stay on the natural columns; use act-order group (a g_idx) or none with dynamic "
                     "scale timing, or up_front scale timing with act-order static");
  return Status::Ok();
}

namespace {

Result<bool> BoolKey(const nlohmann::ordered_json& j, const char* key, const std::string& where) {
  if (!j[key].is_boolean()) return MakeError(where, ".", key, ": expected a boolean, found ", j[key].dump());
  return j[key].get<bool>();
}

Result<std::string> StringKey(const nlohmann::ordered_json& j, const char* key, const std::string& where) {
  if (!j[key].is_string()) return MakeError(where, ".", key, ": expected a string, found ", j[key].dump());
  return j[key].get<std::string>();
}

// Quark's spelling (desc_act, static_groups) onto s; nibble's own keys are read after it.
Status ParseQuarkKeys(const nlohmann::ordered_json& j, const std::string& where, GptqSettings& s,
                      GptqSettingNames& names) {
  if (j.contains("damp_percent")) {
    if (!j["damp_percent"].is_number()) return MakeError(where, ".damp_percent: expected a number, found ", j["damp_percent"].dump());
    s.dampening_frac = j["damp_percent"].get<double>();
    names.dampening_frac = where + ".damp_percent";
  }
  if (j.contains("block_size")) {
    if (!j["block_size"].is_number_integer())
      return MakeError(where, ".block_size: expected an integer, found ", j["block_size"].dump());
    s.block_size = j["block_size"].get<int64_t>();
    names.block_size = where + ".block_size";
  }
  bool desc_act = s.actorder != GptqActOrder::kNone;
  bool static_groups = s.scale_timing == GptqScaleTiming::kUpFront;
  if (j.contains("desc_act")) {
    NIBBLE_ASSIGN_OR_RETURN(desc_act, BoolKey(j, "desc_act", where));
  }
  if (j.contains("static_groups")) {
    NIBBLE_ASSIGN_OR_RETURN(static_groups, BoolKey(j, "static_groups", where));
  }
  if (j.contains("desc_act") || j.contains("static_groups")) {
    s.scale_timing = static_groups || desc_act ? GptqScaleTiming::kUpFront : GptqScaleTiming::kDynamic;
    s.actorder = !desc_act ? GptqActOrder::kNone : static_groups ? GptqActOrder::kStatic : GptqActOrder::kGroup;
    names.scale_timing = where + ".static_groups";
    names.actorder = where + ".desc_act";
  }
  if (j.contains("true_sequential")) {
    NIBBLE_ASSIGN_OR_RETURN(s.true_sequential, BoolKey(j, "true_sequential", where));
  }
  return Status::Ok();
}

Status ParseNibbleKeys(const nlohmann::ordered_json& j, const std::string& where, GptqSettings& s,
                       GptqSettingNames& names) {
  if (j.contains("scale_timing")) {
    NIBBLE_ASSIGN_OR_RETURN(std::string v, StringKey(j, "scale_timing", where));
    NIBBLE_ASSIGN_OR_RETURN(s.scale_timing, ParseGptqScaleTiming(v, where + ".scale_timing"));
    names.scale_timing = where + ".scale_timing";
  }
  if (j.contains("actorder")) {
    NIBBLE_ASSIGN_OR_RETURN(std::string v, StringKey(j, "actorder", where));
    NIBBLE_ASSIGN_OR_RETURN(s.actorder, ParseGptqActOrder(v, where + ".actorder"));
    names.actorder = where + ".actorder";
  }
  if (j.contains("propagation")) {
    NIBBLE_ASSIGN_OR_RETURN(std::string v, StringKey(j, "propagation", where));
    if (v == "fp") s.propagation = Propagation::kFp;
    else if (v == "quantized") s.propagation = Propagation::kQuantized;
    else return MakeError(where, ".propagation: \"", v, "\" is not supported (supported: fp, quantized)");
  }
  return Status::Ok();
}

}  // namespace

Status ApplyGptqAlgoConfig(const nlohmann::ordered_json& j, const std::string& where, GptqSettings& s,
                           GptqSettingNames& names) {
  NIBBLE_RETURN_IF_ERROR(ParseQuarkKeys(j, where, s, names));
  return ParseNibbleKeys(j, where, s, names);
}

nlohmann::ordered_json GptqAlgoConfigEntry(const GptqSettings& s) {
  nlohmann::ordered_json a;
  a["name"] = "gptq";
  a["damp_percent"] = s.dampening_frac;
  a["block_size"] = s.block_size;
  a["desc_act"] = s.actorder != GptqActOrder::kNone;
  a["static_groups"] = s.scale_timing == GptqScaleTiming::kUpFront;
  a["true_sequential"] = s.true_sequential;
  a["model_decoder_layers"] = "model.layers";
  a["scale_timing"] = GptqScaleTimingName(s.scale_timing);
  a["actorder"] = GptqActOrderName(s.actorder);
  a["propagation"] = s.propagation == Propagation::kFp ? "fp" : "quantized";
  return a;
}

}  // namespace nibble
