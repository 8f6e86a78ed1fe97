// tokenizer.json read in one pass of nlohmann's SAX parser. model.vocab and model.merges, nearly
// all of the file (128k-262k tokens, 150k-515k merges), go straight into flat tables instead of a
// DOM of one node per token and per merge; everything else becomes the DOM ParseJsonText would
// build, under the same checks (valid UTF-8 JSON, a duplicate key at any depth, nesting depth).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace nibble {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

/// token -> id: the token bytes in one arena and an open-addressing table of (hash tag, offset,
/// length, id) over them: a lookup touches one slot and the token's bytes, with no node or string
/// allocation per token.
class TokenVocab {
 public:
  /// Adds `token` -> `id` (id >= 0); false (nothing added) when the token is there already.
  bool Add(std::string_view token, int32_t id);
  /// Room for `n` tokens without rehashing.
  void Reserve(size_t n) {
    if (2 * n > slots_.size()) Grow(2 * n);
  }
  /// The id of `token`, or -1.
  int32_t Find(std::string_view token) const { return FindHashed(token, Hash(token)); }
  int32_t FindHashed(std::string_view token, uint64_t h) const {
    if (slots_.empty()) return -1;
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.tag == tag && s.len == token.size() && Equal(bytes_.data() + s.offset, token)) return s.id;
    }
  }
  /// Hints the cache with the slot a lookup of hash `h` starts at.
  void Prefetch(uint64_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[h & mask_]);
  }
  size_t size() const { return size_; }
  /// Calls fn(token, id) for every entry, in no particular order.
  template <class Fn>
  void ForEach(Fn fn) const {
    for (const Slot& s : slots_)
      if (s.id >= 0) fn(std::string_view(bytes_).substr(s.offset, s.len), s.id);
  }
  static uint64_t Hash(std::string_view s) {  // FNV-1a, then a multiply to spread the low bits
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull;
  }

 private:
  struct Slot {
    uint32_t tag = 0, offset = 0, len = 0;
    int32_t id = -1;  // -1: free
  };
  // Tokens are a few bytes long: a loop beats a call to memcmp.
  static bool Equal(const char* a, std::string_view b) {
    for (size_t i = 0; i < b.size(); ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
  void Grow(size_t min_slots = 0);
  std::string bytes_;
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

/// model.merges as written, without one allocation per merge: the two sides of each merge stored
/// back to back in `bytes`, so that the merged token is the span of both.
struct RawMerges {
  struct Entry {
    uint32_t offset, left_len, right_len;
    bool pair_form;  // ["a", "b"] (else "a b")
  };
  std::string bytes;
  std::vector<Entry> entries;
  std::string_view left(const Entry& e) const { return std::string_view(bytes).substr(e.offset, e.left_len); }
  std::string_view right(const Entry& e) const { return std::string_view(bytes).substr(e.offset + e.left_len, e.right_len); }
  std::string_view merged(const Entry& e) const { return std::string_view(bytes).substr(e.offset, e.left_len + e.right_len); }
  /// The merge as the file spells it (for errors).
  std::string Json(const Entry& e) const;
};

struct TokenizerJson {
  nlohmann::json doc;         // the file, without model.vocab / model.merges when they were streamed
  bool has_vocab = false;     // model.vocab was an object: in `vocab`
  TokenVocab vocab;
  int32_t vocab_id_end = 0;   // one past the largest id in `vocab`
  bool has_merges = false;    // model.merges was an array: in `merges`
  RawMerges merges;
};

/// Parses tokenizer.json text; `file` names it in errors. Errors: ParseJsonText's (not valid JSON
/// or UTF-8, duplicate key, too deep) plus, naming the JSON path: a vocab id that is not an
/// integer in [0, 2^30), a merge that is neither "a b" (one space, both sides non-empty) nor
/// ["a", "b"].
Result<TokenizerJson> ParseTokenizerJson(const std::string& text, const std::string& file);

}  // namespace nibble
