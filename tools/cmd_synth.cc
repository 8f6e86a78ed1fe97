// `nibble synth --config CONFIG.json --out DIR [--format quark|dense] [--group_size 128]`: a
// random-weight checkpoint with real shapes, for end-to-end decode / prefill tokens/s
// (`nibble generate --model DIR`); decode speed does not depend on the weight values.
#include <filesystem>
#include <memory>
#include <string>

#include <nibble/nibble.h>

#include "commands.h"
#include "support/bench.h"

namespace nibble_cli {
namespace {

// The embedded default model's tokenizer: models/prose-llama-7m from the current directory, else
// from the source tree the binary was built in (build/<preset>/nibble → ../../models), so that
// synth works from any directory. Falls back to the relative path (WriteSyntheticCheckpoint then
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
  return rel.string();
}

}  // namespace

Runner RegisterSynth(CLI::App& app) {
  auto q = std::make_shared<nibble::SynthRequest>();
  auto threads = std::make_shared<int>(0);
  q->tokenizer_dir = DefaultTokenizerDir();
  CLI::App* cmd = app.add_subcommand("synth", "Write a random-weight checkpoint with the shapes of an HF config.json");
  cmd->add_option("--config", q->config_path, "HF config.json (e.g. bench/configs/tinyllama-1.1b.json)")->required();
  cmd->add_option("--out", q->out_dir, "Output directory")->required();
  cmd->add_option("--format", q->format, "quark (uint4 asym RTN, lm_head excluded) | dense (bf16)")->capture_default_str();
  cmd->add_option("--group_size", q->group_size, "Quark group size")->capture_default_str();
  cmd->add_option("--tokenizer_dir", q->tokenizer_dir, "Copy tokenizer.model / .json, tokenizer_config.json, special_tokens_map.json from here (those that exist)")
      ->capture_default_str();
  cmd->add_option("--seed", q->seed, "Random seed")->capture_default_str();
  cmd->add_flag("--overwrite", q->overwrite, "Replace an existing output directory");
  cmd->add_option("--threads,-t", *threads, "Worker threads (0 = all cores)")->capture_default_str();
  return [q, threads]() {
    nibble::SetNumThreads(*threads);
    const nibble::Status s = nibble::WriteSyntheticCheckpoint(*q);
    if (!s.ok()) return Fail(s.error().message);
    std::printf("wrote %s (%s)\n", q->out_dir.c_str(), q->format.c_str());
    return 0;
  };
}

}  // namespace nibble_cli
