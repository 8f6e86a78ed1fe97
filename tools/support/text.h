// Text helpers of the CLI.
#pragma once

#include <string>
#include <vector>

namespace nibble_cli {

/// The candidate closest to `word` (base/strings.h ClosestOf): within max(2, |word| / 3) edits,
/// else "".
std::string ClosestOf(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace nibble_cli
