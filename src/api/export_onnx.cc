// `nibble export-onnx`: the ONNX Runtime GenAI decoder (onnx/decoder_graph.h) of a quantized
// checkpoint, written into a staging directory, checked with onnx::checker, then renamed.
#include <chrono>
#include <filesystem>
#include <map>

#include <nibble/export_onnx.h>
#include <onnx/checker.h>

#include "base/version.h"
#include "formats/checkpoint_format.h"
#include "io/checkpoint_writer.h"
#include "io/file.h"
#include "io/json.h"
#include "io/staging_dir.h"
#include "model/config.h"
#include "model/model_loader.h"
#include "onnx/decoder_graph.h"
#include "onnx/genai_config.h"
#include "onnx/onnx_writer.h"

namespace nibble {

namespace {

namespace fs = std::filesystem;

Result<DecoderGraphOptions> GraphOptions(const ExportOnnxRequest& r) {
  if (r.execution_provider != "cpu")
    return MakeErrorCode(ErrorCode::kUnsupported, "--execution_provider \"", r.execution_provider,
                         "\" is not supported (supported: cpu)");
  DecoderGraphOptions o;
  o.accuracy_level = r.accuracy_level;
  o.cancel = r.cancel;
  if (r.io_dtype == "fp32") {
    o.io_dtype = DType::kF32;
  } else if (r.io_dtype == "fp16") {
    o.io_dtype = DType::kF16;
  } else {
    return MakeErrorCode(ErrorCode::kUnsupported, "--io_dtype \"", r.io_dtype,
                         "\" is not supported (supported: fp32, fp16; ONNX Runtime's CPU kernels for "
                         "GroupQueryAttention and MatMulNBits have no bf16)");
  }
  return o;
}

Status CheckOutputDir(const ExportOnnxRequest& r) {
  if (r.output_dir.empty()) return MakeError("--out is empty");
  std::error_code ec;
  NIBBLE_RETURN_IF_ERROR(CheckOutputReplaceable(r.output_dir, r.overwrite));
  if (fs::exists(r.output_dir) && fs::equivalent(r.output_dir, r.input_dir, ec))
    return MakeError("output directory ", r.output_dir, " is the input directory");
  return Status::Ok();
}

// onnx::checker over the written model.onnx (it also checks the external data references).
Status CheckWrittenModel(const std::string& path) {
  RegisterContribSchemasForChecker();
  try {
    onnx::checker::check_model(path);
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kInternal, "onnx::checker rejects the written ", fs::path(path).filename().string(),
                         ": ", e.what());
  }
  return Status::Ok();
}

// A JSON file of the model dir through io/json.h, or an empty object when the file is absent.
Result<nlohmann::json> ReadJsonOrEmpty(const std::string& path) {
  if (!PathExists(path)) return nlohmann::json::object();
  return ReadJsonFile(path);
}

void Summarize(const DecoderGraphStats& g, ExportOnnxSummary& s) {
  s.matmul_nbits = g.matmul_nbits;
  s.matmul_float = g.matmul_float;
  for (const auto& [module, b] : g.block_size) ++s.block_sizes[b];
  auto head = g.block_size.find("lm_head");
  s.lm_head_block_size = head == g.block_size.end() ? 0 : head->second;
}

// The note at the top of the output's README.md (io/model_card.h): a re-layout for ONNX Runtime,
// not a new quantization. The input's own note, if any, stays below it.
ModelCardNote OnnxCardNote(const ExportOnnxRequest& r, const ExportOnnxSummary& s) {
  ModelCardNote n;
  n.heading = std::string("Exported to ONNX with nibble ") + NibbleVersion();
  n.summary = "`nibble export-onnx` wrote this ONNX Runtime GenAI model from a " + s.from +
              " checkpoint: its int4 codes, scales and zero points are repacked into MatMulNBits, not re-quantized.";
  std::map<std::string, int64_t> blocks;
  for (const auto& [b, count] : s.block_sizes) blocks["MatMulNBits block_size " + std::to_string(b)] = count;
  if (s.matmul_float > 0) blocks["float MatMul"] = s.matmul_float;
  n.items.push_back({"scheme", SchemeCounts(blocks)});
  n.items.push_back({"export format", "ONNX (model.onnx, weights in model.onnx.data, genai_config.json), execution provider " +
                                          r.execution_provider + ", accuracy_level " + std::to_string(r.accuracy_level) +
                                          ", io_dtype " + r.io_dtype});
  return n;
}

}  // namespace

static Result<ExportOnnxSummary> ExportOnnxChecked(const ExportOnnxRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  NIBBLE_ASSIGN_OR_RETURN(DecoderGraphOptions options, GraphOptions(r));
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> format, OpenCheckpointFormat(r.input_dir));
  if (format == nullptr)
    return MakeError(r.input_dir, ": a dense checkpoint has no int4 codes to export; quantize it first ",
                     "(nibble quantize --model ", r.input_dir, " --out DIR) and export that");
  NIBBLE_RETURN_IF_ERROR(CheckOutputDir(r));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(r.input_dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(r.input_dir));
  NIBBLE_RETURN_IF_ERROR(CheckCheckpointShapes(mc, store, format.get()));
  NIBBLE_RETURN_IF_ERROR(CheckDecoderGraph(mc, format.get(), options));
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json config_json, ReadJsonOrEmpty(JoinPath(r.input_dir, "config.json")));
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json generation, ReadJsonOrEmpty(JoinPath(r.input_dir, "generation_config.json")));

  NIBBLE_ASSIGN_OR_RETURN(CheckpointWriter out, CheckpointWriter::Create(r.output_dir, 1, "onnx"));
  NIBBLE_ASSIGN_OR_RETURN(OnnxWriter w, OnnxWriter::Create(out.path(), "model.onnx.data"));
  NIBBLE_ASSIGN_OR_RETURN(DecoderGraphStats g, WriteDecoderGraph(mc, store, format.get(), options, w));
  NIBBLE_RETURN_IF_ERROR(CheckCancelled(r.cancel, "export-onnx before model.onnx was written"));
  NIBBLE_RETURN_IF_ERROR(w.Finish("model.onnx"));
  NIBBLE_RETURN_IF_ERROR(CheckWrittenModel(JoinPath(out.path(), "model.onnx")));
  ExportOnnxSummary s;
  s.from = format->name();
  Summarize(g, s);
  s.data_bytes = w.data_bytes();
  NIBBLE_RETURN_IF_ERROR(out.WriteFile("genai_config.json", GenaiConfig(mc, config_json, generation).dump(4) + "\n"));
  std::vector<std::string> side = CheckpointSideFiles(r.input_dir);
  side.push_back("config.json");
  NIBBLE_ASSIGN_OR_RETURN(s.copied_files, out.CopyFiles(r.input_dir, side));
  NIBBLE_RETURN_IF_ERROR(out.WriteModelCard(r.input_dir, OnnxCardNote(r, s)));
  NIBBLE_RETURN_IF_ERROR(CheckCancelled(r.cancel, "export-onnx before the output was committed"));
  NIBBLE_RETURN_IF_ERROR(out.Commit(r.overwrite));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

Result<ExportOnnxSummary> ExportOnnx(const ExportOnnxRequest& r) {
  Result<ExportOnnxSummary> s = ExportOnnxChecked(r);
  if (!s.ok()) return NoteOutputUntouched(s.error(), r.output_dir);
  return s;
}

}  // namespace nibble
