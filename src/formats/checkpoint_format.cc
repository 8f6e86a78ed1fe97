#include "formats/checkpoint_format.h"

#include "formats/compressed_tensors_format.h"
#include "formats/quark_format.h"
#include "io/file.h"
#include "io/json.h"

namespace nibble {

const std::vector<FormatEntry>& Formats() {
  static const std::vector<FormatEntry> formats = {QuarkFormatEntry(), CompressedTensorsFormatEntry()};
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

Result<std::unique_ptr<QuantizedFormat>> OpenCheckpointFormat(const std::string& dir) {
  NIBBLE_RETURN_IF_ERROR(CheckModelDir(dir));
  const std::string path = JoinPath(dir, "config.json");
  NIBBLE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(text, path));
  if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null())
    return std::unique_ptr<QuantizedFormat>{};
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
