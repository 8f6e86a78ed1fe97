// Text helpers for messages: suggestions for misspelt names ("did you mean ...?": flags, config
// keys) and quoting of names and values.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace nibble {

/// Levenshtein distance (insertions, deletions and substitutions of bytes).
size_t EditDistance(const std::string& a, const std::string& b);

/// The candidate closest to `word` when it is within max(2, |word| / 3) edits, else "".
std::string ClosestOf(const std::string& word, const std::vector<std::string>& candidates);

/// `s` in double quotes, as error messages show names and values: Quoted("g128") == "\"g128\"".
std::string Quoted(const std::string& s);

/// `s` with every byte outside printable ASCII written as \xNN: a parser's excerpt of a damaged
/// file (nlohmann's "last read: '...'") shown in a message without raw bytes reaching a terminal.
std::string PrintableBytes(std::string_view s);

/// The text of the current errno, for "cannot open X: <why>" messages; read it before any other call.
std::string ErrnoText();

}  // namespace nibble
