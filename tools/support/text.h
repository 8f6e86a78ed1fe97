// Text helpers of the CLI.
#pragma once

#include <string>
#include <vector>

namespace nibble_cli {

/// The candidate closest to `word` (base/strings.h ClosestOf): within max(2, |word| / 3) edits,
/// else "".
std::string ClosestOf(const std::string& word, const std::vector<std::string>& candidates);

/// "1 thread", "2 threads": `n` and `noun`, with an "s" unless n is 1.
std::string Plural(long long n, const std::string& noun);

}  // namespace nibble_cli
