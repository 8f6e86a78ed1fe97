// tokenizer.json's model "BPE": vocab, ranked merges, and the encoding of one pre-tokenized word.
// Both families: byte-level BPE (words arrive as GPT-2 byte-level characters) and SentencePiece
// BPE (characters missing from the vocab fall back to <0xXX> byte tokens, or to unk, fused when
// fuse_unk). Merges are applied lowest rank first through a heap over the adjacent pairs of a
// linked list of symbols, so a word of n characters costs O(n log n).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "tokenizer/hf_text.h"

namespace nibble {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  /// Parses tokenizer.json's "model" object. Errors (naming where and the value): a type other
  /// than BPE (Unigram, WordPiece, WordLevel are named as unsupported), a malformed vocab or
  /// merge, a merge naming a token not in the vocab, continuing_subword_prefix /
  /// end_of_word_suffix / dropout (not supported), an unk_token not in the vocab.
  static Result<BpeModel> Parse(const nlohmann::json& j, const JsonWhere& where);

  /// Appends the ids of `word`. False when a character has no token, no byte fallback and there
  /// is no unk token.
  bool EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  /// With ignore_merges, the id of a word that is itself a token (what EncodeWord gives), else -1.
  int32_t WholeWordId(std::string_view word) const {
    if (!ignore_merges_) return -1;
    auto it = vocab_.find(word);
    return it != vocab_.end() ? it->second : -1;
  }
  const TokenMap& vocab() const { return vocab_; }
  /// One past the largest vocab id.
  int32_t id_end() const { return id_end_; }

 private:
  bool InitialSymbols(std::string_view word, std::vector<int32_t>* ids, std::vector<uint32_t>* lens) const;
  const int32_t* Merge(int32_t a, int32_t b, int32_t* rank) const;

  TokenMap vocab_;
  int32_t id_end_ = 0;
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> token ids, -1 when absent
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
};

}  // namespace nibble
