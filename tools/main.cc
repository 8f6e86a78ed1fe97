// nibble — quantize LLMs to 4-bit weights and run them on the CPU.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include <nibble/eval.h>

#include "commands.h"
#include "support/bench.h"
#include "support/cancel_signal.h"
#include "support/flags.h"
#include "support/load_env.h"
#include "support/text.h"

namespace nibble_cli {
int Fail(const std::string& message) {
  std::fprintf(stderr, "nibble: error: %s\n", message.c_str());
  return kExitRuntime;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "nibble: error: %s\n", message.c_str());
  return kExitUsage;
}

int FailStatus(const nibble::Error& error) {
  if (error.code == nibble::ErrorCode::kCancelled) return FailCancelled(error.message);  // 130 / 143
  // The library names a flag's bad value "--flag ..." (checked before it reads anything).
  const bool usage = (error.code == nibble::ErrorCode::kInvalidArgument || error.code == nibble::ErrorCode::kUnsupported) &&
                     error.message.starts_with("--");
  return usage ? UsageError(error.message) : Fail(error.message);
}

void PrintWarnings(const std::string& dir, const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) {
    if (w.starts_with("note: ")) {
      std::fprintf(stderr, "note: %s: %s\n", dir.c_str(), w.c_str() + 6);
    } else {
      std::fprintf(stderr, "warning: %s: %s\n", dir.c_str(), w.c_str());
    }
  }
}

std::string ReadTextFile(const std::string& path, std::string* text) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "cannot read text file " + path + ": is a directory";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot read text file " + path + ": no such file or not readable";
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return "cannot read text file " + path + ": read error";
  *text = ss.str();
  return "";
}

std::string Bf16NotServed(const std::string& dir) {
  return "--activations bf16 (--bf16_activations): " + dir +
         " has no int4 linear the bf16-activation path serves (dense model, or group sizes that are not multiples of 32)";
}

std::string KeptFp32Note(bool int8, int64_t int4_linears, int64_t switched) {
  const int64_t kept = int4_linears - switched;
  if (kept <= 0) return "";
  return std::to_string(kept) + " int4 linears keep fp32 activations (group size " +
         (int8 ? "not 32, 64 or a multiple of 128" : "not a multiple of 32") + ")";
}

std::string Int8NotServed(const std::string& dir) {
  return "--activations int8 (--int8_activations): " + dir +
         " has no int4 linear the int8 kernels serve (dense model, or group sizes other than 32, 64, 128*j)";
}

void AddActivationsOption(CLI::App* cmd, nibble::ActivationType* type) {
  cmd->add_option_function<std::string>(
         "--activations",
         [type](const std::string& v) {
           if (!nibble::ParseActivationType(v, type))
             throw CLI::ValidationError("--activations", "expected auto, fp32, bf16 or int8, got \"" + v + "\"");
         },
         "Activations of the int4 linears: auto (bf16 where served, else fp32: W4A16 numerics, the fastest "
         "path), fp32, bf16 or int8 (W4A8, costs perplexity)")
      ->default_str("auto");
}

void AddMaxMemoryOption(CLI::App* cmd, int64_t* bytes, const std::string& help) {
  cmd->add_option_function<std::string>(
      "--max_memory",
      [bytes](const std::string& v) {
        auto r = nibble::ParseMemorySize(v);
        if (!r.ok() || *r <= 0) throw CLI::ValidationError("--max_memory", r.ok() ? "must be > 0, got \"" + v + "\"" : r.error().message);
        *bytes = *r;
      },
      help);
}

void AddKvOptions(CLI::App* cmd, KvArgs* a, const std::string& ctx_help) {
  cmd->add_option_function<std::string>(
         "--kv_dtype",
         [a](const std::string& v) {
           if (!nibble::ParseKvDtype(v, &a->kv_dtype))
             throw CLI::ValidationError("--kv_dtype", "expected bf16 or fp32, got \"" + v + "\"");
         },
         "KV cache storage: bf16 (half the bytes) or fp32")
      ->default_str("bf16");
  cmd->add_option("--ctx_size,-c", a->ctx_size, "Context size in positions (the KV cache's); " + ctx_help)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  AddMaxMemoryOption(cmd, &a->max_memory, "Refuse a KV cache larger than this (e.g. 16GB, 512MiB); default 90 % of MemAvailable");
  cmd->add_option("--weight_cache", a->weight_cache,
                  "Directory of packed int4 weights reused by later loads of the same checkpoint, or off "
                  "(default $NIBBLE_CACHE_DIR/weights, else ~/.cache/nibble/weights; checkpoints under "
                  "256 MiB are not cached)")
      ->check([](const std::string& v) { return v.empty() ? "expected a directory or off, got an empty string" : ""; });
  cmd->add_flag("--no_mmap", a->no_mmap,
                "Copy the packed int4 weights of --weight_cache into process memory (huge pages) instead of "
                "mapping the file: a slower load, weights that page-cache pressure cannot evict");
}

void ApplyKvArgs(const KvArgs& a, nibble::LoadOptions* lo) {
  lo->kv_dtype = a.kv_dtype;
  lo->weight_cache = a.weight_cache != "off";
  if (lo->weight_cache) lo->weight_cache_dir = a.weight_cache;
  lo->weight_cache_pages = a.no_mmap ? nibble::WeightCachePages::kOwned : nibble::WeightCachePages::kMapped;
}

std::string ReportKvMemory(const nibble::Model& model, int64_t ctx, const KvArgs& a) {
  const nibble::ModelInfo& i = model.info();
  const int64_t bytes = nibble::KvCacheBytes(model, ctx);
  std::fprintf(stderr, "KV cache: ctx %lld x %lld layers x %lld kv heads x %lld head_dim x 2 (K, V) = %.1f MiB (%s)\n",
               static_cast<long long>(ctx), static_cast<long long>(i.num_hidden_layers),
               static_cast<long long>(i.num_key_value_heads), static_cast<long long>(i.head_dim),
               static_cast<double>(bytes) / (1024.0 * 1024.0), nibble::KvDtypeName(i.kv_dtype));
  const nibble::Status st = nibble::CheckKvMemory(model, ctx, a.max_memory);
  return st.ok() ? "" : st.error().message;
}

std::string CheckWindowContext(const nibble::Model& model, int64_t seq_len, const KvArgs& a) {
  if (const nibble::Status fits = nibble::CheckWindowFits(model, seq_len); !fits.ok()) return fits.error().message;
  if (a.ctx_size > 0 && a.ctx_size < seq_len)
    return "--ctx_size " + std::to_string(a.ctx_size) + " is smaller than the window (--seq_len " +
           std::to_string(seq_len) + "): raise --ctx_size or lower --seq_len";
  return ReportKvMemory(model, seq_len, a);
}

void AddTokenizerOption(CLI::App* cmd, nibble::TokenizerType* type) {
  cmd->add_option_function<std::string>(
         "--tokenizer",
         [type](const std::string& v) {
           if (!nibble::ParseTokenizerType(v, type))
             throw CLI::ValidationError("--tokenizer", "expected auto, hf or spm, got \"" + v + "\"");
         },
         "Tokenizer file: auto (tokenizer.json when there is no tokenizer.model), hf (tokenizer.json) or spm "
         "(tokenizer.model)")
      ->default_str("auto");
}

std::string ReportActivations(const std::string& dir, nibble::ActivationType requested, const nibble::ModelInfo& info) {
  using nibble::ActivationType;
  const int64_t n = info.activation_linears;
  if (requested == ActivationType::kInt8 && n == 0) return Int8NotServed(dir);
  if (requested == ActivationType::kBf16 && n == 0) return Bf16NotServed(dir);
  const char* how = requested == ActivationType::kAuto ? " (auto)" : "";
  if (info.int4_linears == 0) {
    std::fprintf(stderr, "activations: fp32%s (no int4 linears)\n", how);
    return "";
  }
  const nibble::KernelDispatchReport k = nibble::DescribeKernels();
  if (info.activations == ActivationType::kBf16)
    std::fprintf(stderr, "activations: bf16%s (W4A16) in %lld int4 linears (%s kernels below %lld rows, bf16 matmul from %lld)\n",
                 how, static_cast<long long>(n), k.bf16_act_kernel.c_str(), static_cast<long long>(k.bf16_matmul_min_rows),
                 static_cast<long long>(k.bf16_matmul_min_rows));
  else if (info.activations == ActivationType::kInt8)
    std::fprintf(stderr, "activations: int8 (W4A8) in %lld int4 linears (%s kernels)\n", static_cast<long long>(n),
                 k.int8_kernel.c_str());
  else
    std::fprintf(stderr, "activations: fp32%s (W4A32) in %lld int4 linears (%s kernels)\n", how,
                 static_cast<long long>(info.int4_linears), k.chosen.c_str());
  if (info.activations == ActivationType::kFp32) return "";
  const std::string kept = KeptFp32Note(info.activations == ActivationType::kInt8, info.int4_linears, n);
  if (!kept.empty()) std::fprintf(stderr, "activations: %s\n", kept.c_str());
  return "";
}

std::string UsageMessage(const CLI::Error& e) {
  // CLI11 words a repeated single-value flag "--seed: At Most 1 required but received 2".
  const std::string what = e.what();
  const std::string at_most = ": At Most 1 required but received ";
  if (const size_t at = what.find(at_most); at != std::string::npos)
    return what.substr(0, at) + " given " + what.substr(at + at_most.size()) + " times (once expected)";
  return what;
}

CLI::Validator AtLeast(int64_t min) {
  return CLI::Validator(
      [min](std::string& v) -> std::string {
        int64_t n = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec == std::errc{} && end == v.data() + v.size() && n >= min) return "";
        return "must be an integer >= " + std::to_string(min) + ", got \"" + v + "\"";
      },
      "INT >= " + std::to_string(min));
}

namespace {

// Last resort: the library checks the sizes it allocates by before allocating (base/memory.h), so
// an exception escaping a command is a bug; it is named with exit code 1, never an abort.
int RunGuarded(const std::string& name, const Runner& run) {
  try {
    return run();
  } catch (const std::bad_alloc&) {
    return Fail("out of memory while running " + name + " (an allocation failed)");
  } catch (const std::exception& e) {
    return Fail("internal error while running " + name + ": " + e.what());
  }
}

}  // namespace
}  // namespace nibble_cli

int main(int argc, char** argv) {
  nibble_cli::UseLoadTimeDefaults(argv);
  nibble_cli::StartWorkersWithSignalsBlocked();
  CLI::App app{"nibble: quantize LLMs to 4-bit weights (Quark hf_format) and run them on the CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return nibble_cli::VersionText(); });
  std::vector<std::pair<CLI::App*, nibble_cli::Runner>> commands;
  auto add = [&](nibble_cli::Runner (*reg)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    nibble_cli::Runner r = reg(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(r));
  };
  add(nibble_cli::RegisterGenerate);
  add(nibble_cli::RegisterPerplexity);
  add(nibble_cli::RegisterQuantize);
  add(nibble_cli::RegisterInspect);
  add(nibble_cli::RegisterBench);
  add(nibble_cli::RegisterSynth);
  add(nibble_cli::RegisterCompare);
  add(nibble_cli::RegisterReport);
  add(nibble_cli::RegisterBenchModel);
  add(nibble_cli::RegisterConvert);
  add(nibble_cli::RegisterVerify);
  add(nibble_cli::RegisterExportOnnx);
  add(nibble_cli::RegisterTokenize);
  add(nibble_cli::RegisterServe);
  // Name an unknown command instead of CLI11's generic "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (auto& [sub, run] : commands) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) return nibble_cli::UsageError(std::string("unknown command \"") + argv[1] + "\" (commands: " + names + ")");
  }
  // A misspelt flag is named with the closest known one, whether CLI11 stops at it (ExtrasError:
  // "The following arguments were not expected: 128 --seqlen") or at a required option it left
  // unset (RequiredError).
  auto unknown_flags = [&]() -> std::string {
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return nibble_cli::UnknownFlags(*sub, sub->get_name());
    return "";
  };
  // Usage errors (unknown flag, bad value, missing required flag) exit with 2, whatever CLI11's
  // own code for them (105, 106, 109, ...); --help and --version exit with 0.
  app.failure_message([&commands](const CLI::App*, const CLI::Error& e) {
    std::string cmd;
    for (auto& [sub, run] : commands)
      if (sub->parsed()) cmd = " " + sub->get_name();
    return "nibble: error: " + nibble_cli::UsageMessage(e) + " (see nibble" + cmd + " --help)\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    const std::string unknown = unknown_flags();
    if (unknown.empty()) return app.exit(e) == 0 ? 0 : nibble_cli::kExitUsage;
    return nibble_cli::UsageError(unknown);
  } catch (const CLI::ExtrasError& e) {
    const std::string unknown = unknown_flags();
    if (unknown.empty()) return app.exit(e) == 0 ? 0 : nibble_cli::kExitUsage;
    return nibble_cli::UsageError(unknown);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : nibble_cli::kExitUsage;
  }
  for (auto& [sub, run] : commands)
    if (sub->parsed()) return nibble_cli::RunGuarded(sub->get_name(), run);
  return 1;
}
