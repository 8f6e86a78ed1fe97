// `nibble export-onnx` as a library call. It lives in its own library (nibble_export_onnx) and
// program (nibble-export-onnx, which `nibble export-onnx` runs), not in nibble_api: ONNX's
// protobuf runtime and the protobuf copy inside Debian's libsentencepiece export the same
// symbols, so the two cannot share a process. Not included by <nibble/nibble.h>.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nibble/cancel.h>
#include <nibble/error.h>

namespace nibble {

/// `nibble export-onnx`: an int4 checkpoint of any format nibble reads written as the ONNX decoder
/// ONNX Runtime GenAI runs on the CPU execution provider: model.onnx (com.microsoft.MatMulNBits
/// per quantized linear, each with its own block size; GroupQueryAttention), its weights in
/// model.onnx.data, genai_config.json and the tokenizer files. Codes are repacked, not re-derived.
struct ExportOnnxRequest {
  std::string input_dir;
  std::string output_dir;
  int64_t accuracy_level = 4;   // MatMulNBits accuracy_level: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8
  std::string io_dtype = "fp32";  // fp32 | fp16: activations, KV cache, scales and float weights
  std::string execution_provider = "cpu";
  bool overwrite = false;
  std::function<void(const std::string&)> on_message;
  /// When set and cancelled (from any thread): the export stops at its next check (every decoder
  /// layer and linear) with ErrorCode::kCancelled; the staging directory is removed and
  /// output_dir is left as it was.
  const CancellationToken* cancel = nullptr;
};

struct ExportOnnxSummary {
  std::string from;  // the input's format
  int64_t matmul_nbits = 0, matmul_float = 0;
  std::map<int64_t, int64_t> block_sizes;  // MatMulNBits block_size -> how many linears
  int64_t lm_head_block_size = 0;          // 0: lm_head is a float MatMul
  int64_t data_bytes = 0;                  // model.onnx.data
  std::vector<std::string> copied_files;
  std::vector<std::string> messages;
  double seconds = 0;
};

/// Errors, before anything is written: a dense input, an unknown flag value, a group size
/// MatMulNBits cannot take (naming the layer), a config feature the graph cannot express;
/// while writing: an act-order g_idx that is not natural (naming the layer), read errors.
/// The output is staged and renamed into place only when complete and checked by onnx::checker.
Result<ExportOnnxSummary> ExportOnnx(const ExportOnnxRequest& request);

}  // namespace nibble
