// How the CLI prints evaluation results (perplexity, compare) and sizes: llama-perplexity's
// statistics block, the running perplexity per window on a terminal, and the --json objects.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include <nibble/nibble.h>

namespace nibble_cli {

/// "PPL = 62.6720 +/- 0.8123" (the estimate and its standard error).
std::string PplWithError(const nibble::PerplexityReport& p);

/// llama-perplexity's "KL divergence statistics" block for one model against the base.
void PrintKldStatistics(std::FILE* out, const nibble::ComparisonRow& row, const nibble::PerplexityReport& base);

/// An on_window callback that prints llama-perplexity's running value "[1]62.12,[2]61.80,..."
/// after the time to the first window and an ETA, on stderr, when stderr is a terminal; a no-op
/// (nullptr) otherwise.
/// `before_print` runs before the first output (e.g. to close a progress bar).
std::function<void(int64_t, int64_t, double)> RunningPerplexityPrinter(std::function<void()> before_print = nullptr);

/// The library's JSON forms (nibble::PerplexityJson, ComparisonRowJson, SizeSummaryJson) as objects.
nlohmann::ordered_json PerplexityValue(const nibble::PerplexityReport& p);
/// One compared model: perplexity and the KLD statistics.
nlohmann::ordered_json ComparisonRowValue(const nibble::ComparisonRow& row);
nlohmann::ordered_json SizeJson(const nibble::SizeSummary& s);

}  // namespace nibble_cli
