// nibble-export-onnx (run as `nibble export-onnx`): an int4 checkpoint as an ONNX Runtime GenAI
// model. A program of its own: see include/nibble/export_onnx.h for why.
#include <cstdio>
#include <new>
#include <string>

#include <CLI/CLI.hpp>
#include <nibble/export_onnx.h>

#include "support/cancel_signal.h"
#include "support/flags.h"

int main(int argc, char** argv) {
  nibble::ExportOnnxRequest r;
  CLI::App app("nibble export-onnx: write an int4 checkpoint as an ONNX Runtime GenAI model (MatMulNBits)",
               "nibble export-onnx");
  app.add_option("--model,--model_dir", r.input_dir, "Quantized checkpoint directory (hf_format, compressed-tensors, awq, gptq)")->required();
  app.add_option("--out,--output_dir", r.output_dir, "Output directory (written staged, renamed when complete)")->required();
  app.add_option("--accuracy_level", r.accuracy_level, "MatMulNBits accuracy_level: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 (default 4)")
      ->check(CLI::Range(0, 4));
  app.add_option("--io_dtype", r.io_dtype, "Activation / KV cache / scale dtype: fp32 | fp16 (default fp32)");
  app.add_option("--execution_provider", r.execution_provider, "ONNX Runtime execution provider: cpu (default)");
  app.add_flag("--overwrite", r.overwrite, "Replace an existing output directory");
  // Exit codes as nibble's (tools/commands.h): 2 for a usage error, 1 for a runtime error.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "nibble: error: " + std::string(e.what()) + " (see nibble export-onnx --help)\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // An unknown flag is named as nibble names it, even when CLI11 stopped at a required option.
    const bool unknown_or_required = dynamic_cast<const CLI::ExtrasError*>(&e) || dynamic_cast<const CLI::RequiredError*>(&e);
    if (const std::string unknown = unknown_or_required ? nibble_cli::UnknownFlags(app, "export-onnx") : ""; !unknown.empty()) {
      std::fprintf(stderr, "nibble: error: %s\n", unknown.c_str());
      return 2;
    }
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Last resort, as `nibble`'s main: sizes are checked before allocation, so this is a bug.
  const nibble_cli::CancelOnSignal interrupt;  // Ctrl-C: nothing written, exit 130 (143 for SIGTERM)
  r.cancel = interrupt.token();
  auto s = [&r]() -> decltype(nibble::ExportOnnx(r)) {
    try {
      return nibble::ExportOnnx(r);
    } catch (const std::bad_alloc&) {
      return nibble::MakeError("out of memory while running export-onnx (an allocation failed)");
    }
  }();
  if (!s.ok() && s.error().code == nibble::ErrorCode::kCancelled) return nibble_cli::FailCancelled(s.error().message);
  if (!s.ok()) {
    std::fprintf(stderr, "nibble: error: %s\n", s.error().message.c_str());
    return s.error().message.starts_with("--") ? 2 : 1;  // a flag's value, checked before anything is read
  }
  for (const std::string& m : s->messages) std::fprintf(stderr, "%s\n", m.c_str());
  std::string blocks;
  for (const auto& [b, count] : s->block_sizes)
    blocks += (blocks.empty() ? "" : ", ") + std::to_string(count) + " x block_size " + std::to_string(b);
  const std::string head = s->lm_head_block_size > 0 ? "block_size " + std::to_string(s->lm_head_block_size) : "float";
  std::printf("exported %s (%s) -> %s: %lld MatMulNBits (%s), %lld float MatMul, lm_head %s, %.1f MB of weights, %.1f s\n",
              r.input_dir.c_str(), s->from.c_str(), r.output_dir.c_str(), static_cast<long long>(s->matmul_nbits),
              blocks.c_str(), static_cast<long long>(s->matmul_float), head.c_str(),
              static_cast<double>(s->data_bytes) / 1e6, s->seconds);
  return 0;
}
