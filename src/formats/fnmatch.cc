// Python fnmatch, reimplemented without regexes.
//
// The pattern is compiled into tokens: `*` or a 256-entry byte set (a literal is a one-member set,
// `?` the full set). Character classes are translated the way CPython's fnmatch.translate does it
// (same chunking of hyphens, same removal of reversed ranges, same special cases for an empty or
// "!"-only result), and the resulting regex class body is then interpreted the way `sre_parse`
// would. Matching is the classic two-pointer glob algorithm that backtracks only to the most recent
// `*`, which is exact for patterns whose other tokens each consume one byte.
#include "formats/fnmatch.h"

#include <bitset>
#include <exception>
#include <memory>
#include <re2/re2.h>
#include <unordered_map>
#include <vector>

namespace nibble {
namespace {

using ByteSet = std::bitset<256>;

struct Token {
  bool star = false;
  ByteSet set;  // used when !star
};

// An item of the translated class body: a literal byte or a range operator between two atoms.
struct ClassItem {
  bool range_op = false;
  unsigned char c = 0;
};

// Interprets a translated class body like sre_parse (after fnmatch's own special cases).
ByteSet InterpretClass(std::vector<ClassItem> items) {
  ByteSet set;
  if (items.empty()) return set;  // CPython emits "(?!)": never matches
  if (items.size() == 1 && !items[0].range_op && items[0].c == '!') {
    set.set();  // CPython emits ".": any character
    return set;
  }
  bool negate = false;
  if (!items[0].range_op && items[0].c == '!') {
    negate = true;
    items.erase(items.begin());
  }
  auto atom = [](const ClassItem& it) { return it.range_op ? static_cast<unsigned char>('-') : it.c; };
  size_t i = 0;
  while (i < items.size()) {
    unsigned char lo = atom(items[i]);
    if (i + 2 < items.size() && items[i + 1].range_op) {  // lo '-' hi
      unsigned char hi = atom(items[i + 2]);
      for (int c = lo; c <= hi; ++c) set.set(static_cast<size_t>(c));  // lo > hi: empty
      i += 3;
    } else {
      set.set(lo);  // includes a trailing '-' (sre: "trailing hyphen" is literal)
      i += 1;
    }
  }
  if (negate) set.flip();
  return set;
}

// Translates pat[i..j) (the text between '[' and its closing ']') like CPython 3.9+.
ByteSet TranslateClass(std::string_view pat, size_t i, size_t j) {
  std::string_view stuff = pat.substr(i, j - i);
  std::vector<ClassItem> items;
  if (stuff.find('-') == std::string_view::npos) {
    for (char c : stuff) items.push_back({false, static_cast<unsigned char>(c)});
    return InterpretClass(std::move(items));
  }
  // Split on hyphens that can form ranges: the search starts after the first member (or after
  // "!x"), and after a range "a-b" the next hyphen is searched from the byte after b + 1.
  std::vector<std::string> chunks;
  size_t k = pat[i] == '!' ? i + 2 : i + 1;
  while (true) {
    size_t h = k < j ? pat.substr(0, j).find('-', k) : std::string_view::npos;
    if (h == std::string_view::npos) break;
    chunks.emplace_back(pat.substr(i, h - i));
    i = h + 1;
    k = h + 3;
  }
  std::string last(pat.substr(i, j - i));
  if (!last.empty()) {
    chunks.push_back(std::move(last));
  } else {
    chunks.back() += '-';  // trailing hyphen is literal
  }
  // Remove empty (reversed) ranges: drop both endpoints and the hyphen between them.
  for (size_t c = chunks.size() - 1; c > 0; --c) {
    if (static_cast<unsigned char>(chunks[c - 1].back()) > static_cast<unsigned char>(chunks[c].front())) {
      chunks[c - 1] = chunks[c - 1].substr(0, chunks[c - 1].size() - 1) + chunks[c].substr(1);
      chunks.erase(chunks.begin() + static_cast<std::ptrdiff_t>(c));
    }
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (c > 0) items.push_back({true, '-'});
    for (char ch : chunks[c]) items.push_back({false, static_cast<unsigned char>(ch)});
  }
  return InterpretClass(std::move(items));
}

std::vector<Token> Compile(std::string_view pat) {
  std::vector<Token> tokens;
  const size_t n = pat.size();
  size_t i = 0;
  while (i < n) {
    char c = pat[i++];
    Token t;
    if (c == '*') {
      if (tokens.empty() || !tokens.back().star) {
        t.star = true;
        tokens.push_back(t);
      }
      continue;
    }
    if (c == '?') {
      t.set.set();
    } else if (c == '[') {
      size_t j = i;
      if (j < n && pat[j] == '!') ++j;
      if (j < n && pat[j] == ']') ++j;
      while (j < n && pat[j] != ']') ++j;
      if (j >= n) {
        t.set.set(static_cast<unsigned char>('['));  // unclosed: literal '['
      } else {
        t.set = TranslateClass(pat, i, j);
        i = j + 1;
      }
    } else {
      t.set.set(static_cast<unsigned char>(c));
    }
    tokens.push_back(t);
  }
  return tokens;
}

}  // namespace

bool FnMatch(std::string_view name, std::string_view pattern) {
  const std::vector<Token> tokens = Compile(pattern);
  size_t ni = 0, ti = 0;
  size_t star_ti = std::string_view::npos, star_ni = 0;
  while (ni < name.size()) {
    if (ti < tokens.size() && !tokens[ti].star && tokens[ti].set.test(static_cast<unsigned char>(name[ni]))) {
      ++ni;
      ++ti;
    } else if (ti < tokens.size() && tokens[ti].star) {
      star_ti = ti++;
      star_ni = ni;
    } else if (star_ti != std::string_view::npos) {
      ti = star_ti + 1;
      ni = ++star_ni;
    } else {
      return false;
    }
  }
  while (ti < tokens.size() && tokens[ti].star) ++ti;
  return ti == tokens.size();
}

namespace {

// RE2 options for `re:` entries: byte strings (layer names are ASCII; Latin-1 mode never rejects
// a pattern for its encoding), errors returned instead of logged.
RE2::Options RegexOptions() {
  RE2::Options o;
  o.set_encoding(RE2::Options::EncodingLatin1);
  o.set_log_errors(false);
  return o;
}

// The compiled pattern of a `re:` entry, cached per thread (a config resolves every layer against
// the same few entries). Bounded: cleared when it reaches kMaxCached patterns.
const RE2& CompiledRegex(const std::string& pattern) {
  constexpr size_t kMaxCached = 256;
  thread_local std::unordered_map<std::string, std::unique_ptr<RE2>> cache;
  auto it = cache.find(pattern);
  if (it != cache.end()) return *it->second;
  if (cache.size() >= kMaxCached) cache.clear();
  return *cache.emplace(pattern, std::make_unique<RE2>(pattern, RegexOptions())).first->second;
}

}  // namespace

bool IsRegexEntry(std::string_view entry) { return entry.substr(0, 3) == "re:"; }

Status ValidateExcludeEntry(const std::string& entry) {
  if (!IsRegexEntry(entry)) return Status::Ok();
  const RE2& re = CompiledRegex(entry.substr(3));
  if (!re.ok())
    return MakeError("exclude entry \"", entry, "\": invalid regular expression (RE2 syntax): ", re.error());
  return Status::Ok();
}

Result<bool> MatchesExcludeEntry(const std::string& name, const std::string& entry) {
  if (!IsRegexEntry(entry)) return FnMatch(name, entry);
  const RE2& re = CompiledRegex(entry.substr(3));
  if (!re.ok())
    return MakeError("exclude entry \"", entry, "\" against layer \"", name,
                     "\": invalid regular expression (RE2 syntax): ", re.error());
  // Python re.match: anchored at the start, not at the end.
  return re.Match(name, 0, name.size(), RE2::ANCHOR_START, nullptr, 0);
}

}  // namespace nibble
