#include "formats/checkpoint_format.h"

#include "formats/autoawq_format.h"
#include "formats/compressed_tensors_format.h"
#include "formats/gptq_format.h"
#include "formats/quark_format.h"
#include "io/file.h"
#include "io/json.h"

namespace nibble {

const std::vector<FormatEntry>& Formats() {
  static const std::vector<FormatEntry> formats = {QuarkFormatEntry(), CompressedTensorsFormatEntry(), AutoAwqFormatEntry(),
                                                   GptqFormatEntry()};
  return formats;
}

Result<const FormatEntry*> FindExportFormat(const std::string& export_name) {
  std::string names;
  for (const FormatEntry& e : Formats()) {
    if (export_name == e.export_name) return &e;
    names += std::string(names.empty() ? "" : ", ") + e.export_name;
  }
  return MakeErrorCode(ErrorCode::kUnsupported, "--model_export \"", export_name, "\" is not supported (supported: ", names, ")");
}

Result<std::vector<LinearPlan>> ModulePlans(const ExportRequest& r) {
  if (!r.plans.empty()) {
    if (r.plans.size() != r.modules.size())
      return MakeError("export request: ", r.plans.size(), " plans for ", r.modules.size(), " modules");
    return r.plans;
  }
  std::vector<LinearPlan> out;
  for (const std::string& m : r.modules) {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan p, ResolveQuarkLinear(r.config, m));
    out.push_back(std::move(p));
  }
  return out;
}

void SetScaleDType(ExportRequest& r, DType dt) {
  SetScaleDType(r.config, dt);
  for (LinearPlan& p : r.plans)
    if (p.spec) p.spec->scale_dtype = dt;
}

namespace {

// AutoGPTQ-era checkpoints keep their config only in quantize_config.json; without one the
// checkpoint is dense (nullptr).
Result<std::unique_ptr<QuantizedFormat>> OpenSideConfig(const std::string& dir, const std::string& config_text,
                                                        const std::string& config_path) {
  const std::string side = JoinPath(dir, "quantize_config.json");
  if (!PathExists(side)) return std::unique_ptr<QuantizedFormat>{};
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json q, ReadJsonFile(side));
  const std::string method = q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
                                 ? q["quant_method"].get<std::string>() : "gptq";
  for (const FormatEntry& e : Formats())
    if (method == "gptq" && method == e.quant_method) return e.open(config_text, config_path);
  return MakeErrorCode(ErrorCode::kUnsupported, side, ": quant_method \"", method, "\" without a quantization_config in ",
                       config_path, " is not supported (only GPTQ keeps its config in quantize_config.json alone)");
}

}  // namespace

Result<std::unique_ptr<QuantizedFormat>> OpenCheckpointFormat(const std::string& dir) {
  NIBBLE_RETURN_IF_ERROR(CheckModelDir(dir));
  const std::string path = JoinPath(dir, "config.json");
  NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(text, path));
  if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null())
    return OpenSideConfig(dir, text, path);
  const auto& qc = j["quantization_config"];
  if (!qc.is_object()) return MakeError(path, ": key \"quantization_config\": expected an object, found ", qc.type_name());
  const std::string method = qc.contains("quant_method") && qc["quant_method"].is_string() ? qc["quant_method"].get<std::string>() : "";
  std::string supported;
  for (const FormatEntry& e : Formats()) {
    if (method == e.quant_method) return e.open(text, path);
    supported += std::string(supported.empty() ? "" : ", ") + "\"" + e.quant_method + "\", " + e.description;
  }
  return MakeErrorCode(ErrorCode::kUnsupported, path, ": quantization_config.quant_method \"", method, "\" is not supported (supported: ", supported, ")");
}

}  // namespace nibble
