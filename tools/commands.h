// The `nibble` CLI: one file per subcommand, each registering itself on the CLI11 app and
// returning a callback that runs it. Tools use only the public API (<nibble/...>).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <nibble/model.h>
#include <nibble/session.h>

namespace nibble_cli {

/// A subcommand's runner: returns the process exit code.
using Runner = std::function<int()>;

Runner RegisterGenerate(CLI::App& app);
Runner RegisterPerplexity(CLI::App& app);
Runner RegisterQuantize(CLI::App& app);
Runner RegisterInspect(CLI::App& app);
Runner RegisterBench(CLI::App& app);
Runner RegisterSynth(CLI::App& app);
Runner RegisterCompare(CLI::App& app);
Runner RegisterReport(CLI::App& app);
Runner RegisterBenchModel(CLI::App& app);
Runner RegisterConvert(CLI::App& app);
Runner RegisterVerify(CLI::App& app);
Runner RegisterExportOnnx(CLI::App& app);
Runner RegisterTokenize(CLI::App& app);
Runner RegisterServe(CLI::App& app);

/// `nibble --version`: "nibble X.Y.Z (commit abc1234)", the kernels compiled in and those chosen.
std::string VersionText();
/// The commit the binary was built from ("unknown" outside a git tree).
std::string BuildCommit();

/// Exit codes of every command (`verify` adds 1 = the checkpoints differ): 0 success, 1 a runtime
/// error (a file missing or malformed, a model it cannot run), 2 a usage error (unknown flag, a
/// value out of range, a missing or conflicting flag), reported before anything is loaded; 130 / 143
/// a long command (quantize, convert, export-onnx, perplexity, compare) stopped by SIGINT / SIGTERM
/// (128 + the signal, the shell's convention), its output not written.
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitUsage = 2;

/// A CLI11 parse error's text, reworded where CLI11's is obscure (a flag given twice).
std::string UsageMessage(const CLI::Error& e);
/// An integer flag's "must be >= min" check (CLI11's NonNegativeNumber prints its whole range).
CLI::Validator AtLeast(int64_t min);

/// Prints "nibble: error: <message>" to stderr and returns kExitRuntime.
int Fail(const std::string& message);
/// The same for a usage error: returns kExitUsage.
int UsageError(const std::string& message);
/// A library error: a usage error when it is kInvalidArgument or kUnsupported naming a flag
/// ("--..."); kCancelled (Ctrl-C, support/cancel_signal.h) exits 128 + the signal; else Fail.
int FailStatus(const nibble::Error& error);

/// Prints each of a loaded model's warnings to stderr as "warning: <dir>: <text>" (a text that
/// starts with "note: " as "note: <dir>: <rest>").
void PrintWarnings(const std::string& dir, const std::vector<std::string>& warnings);

/// Reads a whole text file (--text) into `text`. Returns "" on success, else the error message
/// naming the file ("cannot read text file X: is a directory" / "...: no such file or not readable").
std::string ReadTextFile(const std::string& path, std::string* text);

/// The --int8_activations refusal for a model (directory `dir`) none of whose linears the int8
/// kernels serve.
std::string Int8NotServed(const std::string& dir);
/// The --bf16_activations refusal, likewise (group sizes that are not multiples of 32).
std::string Bf16NotServed(const std::string& dir);
/// "N int4 linears keep fp32 activations (group size ...)" for an opt-in that switched `switched`
/// of `int4_linears` int4 linears ("" when it switched them all); `int8` picks the group-size rule.
std::string KeptFp32Note(bool int8, int64_t int4_linears, int64_t switched);

/// `--activations auto|fp32|bf16|int8` (default auto) on `cmd`, parsed into `type`.
void AddActivationsOption(CLI::App* cmd, nibble::ActivationType* type);
/// `--tokenizer auto|hf|spm` (default auto) on `cmd`, parsed into `type`.
void AddTokenizerOption(CLI::App* cmd, nibble::TokenizerType* type);
/// Prints to stderr which activation path a loaded model runs ("activations: bf16 (W4A16) in N
/// int4 linears (kernels: ...)", the linears kept at fp32, or fp32 with no int4 linears).
/// Returns the refusal when an explicit bf16 / int8 request serves none of them, else "".
std::string ReportActivations(const std::string& dir, nibble::ActivationType requested, const nibble::ModelInfo& info);

/// The memory flags of every command that runs a model: KV cache and packed-weight cache.
struct KvArgs {
  nibble::KvDtype kv_dtype = nibble::KvDtype::kBf16;
  int64_t ctx_size = 0;      // 0 = the command's default
  int64_t max_memory = 0;    // bytes; 0 = 90 % of MemAvailable
  std::string weight_cache;  // --weight_cache: "" = the default directory, "off" = none
  bool no_mmap = false;      // --no_mmap: the cache's weights copied into memory
};
/// `--max_memory SIZE` on `cmd` (ParseMemorySize's sizes, > 0) into `bytes`: the one spelling of
/// every command's memory limit.
void AddMaxMemoryOption(CLI::App* cmd, int64_t* bytes, const std::string& help);
/// `--kv_dtype bf16|fp32`, `--ctx_size N`, `--max_memory SIZE`, `--weight_cache DIR|off`, `--no_mmap` on
/// `cmd`; `ctx_help` says what --ctx_size defaults to for this command.
void AddKvOptions(CLI::App* cmd, KvArgs* a, const std::string& ctx_help);
/// The LoadOptions these flags set (kv_dtype, weight cache).
void ApplyKvArgs(const KvArgs& a, nibble::LoadOptions* lo);
/// Prints the KV cache a run of `ctx` positions takes ("KV cache: ctx 8192 x ... = N MiB (bf16)")
/// to stderr, then checks it against --max_memory. Returns the refusal, else "".
std::string ReportKvMemory(const nibble::Model& model, int64_t ctx, const KvArgs& a);

/// For commands that run windows of `seq_len` tokens: a seq_len beyond the model's context
/// (nibble::CheckWindowFits) and --ctx_size below seq_len are refused (0 = seq_len); the window's
/// KV cache is reported and checked as ReportKvMemory does.
std::string CheckWindowContext(const nibble::Model& model, int64_t seq_len, const KvArgs& a);

}  // namespace nibble_cli
