// Layer-name matching as Quark and vLLM do it: Python `fnmatch.fnmatch` globs and `re:` regexes.
//
// Goals: exactly the semantics of CPython's fnmatch.translate (3.9+) on POSIX — whole-string
// match, `*` crosses dots, `?` any one character, `[seq]` / `[!seq]` classes with ranges, no
// escape character, case-sensitive — with an iterative matcher (no regex, no exponential
// backtracking: O(len(name) * len(pattern)) worst case).
// Non-goals: Unicode code points (names are matched byte-wise; HF module names are ASCII);
// Python-only regex syntax in `re:` entries (they are RE2 regexes, see below).
#pragma once

#include <string>
#include <string_view>

#include "base/result.h"

namespace nibble {

/// Python `fnmatch.fnmatch(name, pattern)` on POSIX (no case folding). Source: SPEC §1.3
/// ("fnmatch semantics to implement in C++"), CPython Lib/fnmatch.py translate():
/// * `*` matches any run (including empty, including '.'), `?` exactly one byte;
/// * `[` opens a class only if a closing `]` follows (a `]` right after `[` or `[!` is a member);
///   an unclosed `[` is a literal '['; `[!...]` negates; `a-z` ranges; reversed ranges such as
///   `z-a` are empty (CPython removes them, which can leave `[!]`-like sets: see the .cc);
/// * every other byte, including `\`, is literal.
/// Never fails; any byte string is a valid pattern.
bool FnMatch(std::string_view name, std::string_view pattern);

/// One `exclude` entry of a Quark config tested against a layer name (SPEC §1.3):
/// * `re:<regex>` — RE2 regex (the Python `re` syntax Quark and vLLM configs use, minus
///   backreferences and lookaround, which RE2 rejects with an error) with Python `re.match`
///   semantics: anchored at the start of the name only, so `re:model\.layers\.1` also matches
///   `model.layers.10.mlp`. RE2 matches in time linear in the name, so no pattern can hang the
///   loader (a backtracking engine took minutes on a fuzzer-found pattern);
/// * anything else — an fnmatch pattern (FnMatch), so a plain name matches exactly.
/// Errors: invalid or unsupported regex ("exclude entry \"re:(\": invalid regular expression
/// (RE2 syntax): missing ): ("). Never throws.
Result<bool> MatchesExcludeEntry(const std::string& name, const std::string& entry);

/// Whether an exclude or target entry is a `re:` regex (else an fnmatch pattern).
bool IsRegexEntry(std::string_view entry);

/// Checks that a `re:` entry compiles (no-op Ok for glob entries). Used when parsing a config so
/// that a bad entry is reported once, with its JSON location, before any layer is resolved.
Status ValidateExcludeEntry(const std::string& entry);

}  // namespace nibble
