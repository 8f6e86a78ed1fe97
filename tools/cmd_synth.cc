// `nibble synth --config CONFIG.json --out DIR [--format quark|dense] [--group_size 128]`: a
// random-weight checkpoint with real shapes, for end-to-end decode / prefill tokens/s
// (`nibble generate --model DIR`); decode speed does not depend on the weight values.
#include <filesystem>
#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/bench.h"
#include "support/flags.h"
#include "support/llama2c.h"
#include "support/progress.h"

namespace nibble_cli {
namespace {

// The embedded default model's tokenizer: models/prose-llama-7m from the current directory, else
// from the source tree the binary was built in (build/<preset>/nibble → ../../models, or the
// tree's absolute path for an installed binary), so that synth works from any directory. Falls back to the relative path (WriteSyntheticCheckpoint then
// names it as missing).
std::string DefaultTokenizerDir() {
  namespace fs = std::filesystem;
  const fs::path rel = "models/prose-llama-7m";
  if (fs::is_regular_file(rel / "tokenizer.model")) return rel.string();
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path near = exe.parent_path() / ".." / ".." / rel;
    if (fs::is_regular_file(near / "tokenizer.model")) return fs::weakly_canonical(near, ec).string();
  }
#ifdef NIBBLE_SOURCE_DIR
  // An installed binary: the source tree it was built from, when it is still there.
  const fs::path src = fs::path(NIBBLE_SOURCE_DIR) / rel;
  if (fs::is_regular_file(src / "tokenizer.model")) return src.string();
#endif
  return rel.string();
}

}  // namespace

Runner RegisterSynth(CLI::App& app) {
  auto q = std::make_shared<nibble::SynthRequest>();
  auto threads = std::make_shared<int>(0);
  auto llama2c = std::make_shared<bool>(false);
  q->tokenizer_dir = DefaultTokenizerDir();
  CLI::App* cmd = app.add_subcommand("synth", "Write a random-weight checkpoint with the shapes of an HF config.json");
  cmd->add_option("--config", q->config_path, "HF config.json (e.g. bench/configs/tinyllama-1.1b.json)")->required();
  cmd->add_option("--out,--output_dir", q->out_dir, "Output directory")->required();
  cmd->add_option("--format", q->format, "quark (uint4 asym RTN, lm_head excluded) | dense (bf16)")->capture_default_str();
  cmd->add_option("--group_size", q->group_size, "Quark group size")->capture_default_str();
  cmd->add_option("--tokenizer_dir", q->tokenizer_dir, "Copy tokenizer.model / .json, tokenizer_config.json, special_tokens_map.json from here (those that exist)")
      ->capture_default_str();
  cmd->add_option("--seed", q->seed, "Random seed")->capture_default_str();
  cmd->add_flag("--overwrite", q->overwrite, "Replace an existing output directory");
  cmd->add_flag("--llama2c", *llama2c,
                "With --format dense: also write the same weights as llama2.c files (model.llama2c.bin, "
                "tokenizer.llama2c.bin) for llama.cpp's convert-llama2c-to-ggml");
  AddThreadsOption(cmd, threads.get());
  return [q, threads, llama2c]() {
    if (q->format != "dense" && q->format != "quark")
      return UsageError("synth: --format \"" + q->format + "\" is not a format (dense, quark)");
    if (q->group_size < 1) return UsageError("synth: --group_size " + std::to_string(q->group_size) + " must be >= 1");
    if (*llama2c && q->format != "dense") return UsageError("synth: --llama2c needs --format dense");
    nibble::SetNumThreads(*threads);
    std::unique_ptr<nibble::ProgressBar> bar;
    std::string bar_phase;
    q->progress = [&bar, &bar_phase](const std::string& phase, int64_t done, int64_t total) {
      if (!bar || phase != bar_phase) {
        bar.reset();  // ends the previous phase's line first
        bar = std::make_unique<nibble::ProgressBar>(phase == "synth" ? "synth tensors" : phase, total);
        bar_phase = phase;
      }
      bar->Update(done);
    };
    const nibble::Status s = nibble::WriteSyntheticCheckpoint(*q);
    bar.reset();
    q->progress = nullptr;
    if (!s.ok()) return Fail(s.error().message);
    if (*llama2c) {
      const std::string model = q->out_dir + "/model.llama2c.bin", vocab = q->out_dir + "/tokenizer.llama2c.bin";
      const nibble::Status w = nibble::WriteLlama2c(q->out_dir, model, vocab);
      if (!w.ok()) return Fail(w.error().message);
      std::printf("wrote %s and %s (llama2.c)\n", model.c_str(), vocab.c_str());
    }
    std::printf("wrote %s (%s)\n", q->out_dir.c_str(), q->format.c_str());
    return 0;
  };
}

}  // namespace nibble_cli
