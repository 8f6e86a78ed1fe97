// Suggestions for misspelt names ("did you mean ...?"): flags, config keys.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace nibble {

/// Levenshtein distance (insertions, deletions and substitutions of bytes).
size_t EditDistance(const std::string& a, const std::string& b);

/// The candidate closest to `word` when it is within max(2, |word| / 3) edits, else "".
std::string ClosestOf(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace nibble
