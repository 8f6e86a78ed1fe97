// Flags every command spells the same way (--threads), and unknown-flag messages shared by `nibble`
// and `nibble export-onnx` (a program of its own), so both name a misspelt flag the same way, with
// the closest known one.
#pragma once

#include <string>

#include <CLI/CLI.hpp>
#include <nibble/model.h>

namespace nibble_cli {

/// `--threads,-t` on `cmd` into *threads: 0 (all cores) .. nibble::kMaxThreads, checked as the
/// flags are parsed, the same range in every command.
CLI::Option* AddThreadsOption(CLI::App* cmd, int* threads, const std::string& help = "Worker threads (0 = all cores)");

/// The flags `app` was given but does not know, each with the closest known flag:
/// "<command>: unknown option --seqlen (did you mean --seq_len?) (see nibble <command> --help)".
/// "" when there are none. CLI11 checks required options before unexpected ones, so this is
/// asked first, whether it stopped at a RequiredError or an ExtrasError.
std::string UnknownFlags(const CLI::App& app, const std::string& command);

}  // namespace nibble_cli
