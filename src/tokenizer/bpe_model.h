// tokenizer.json's model "BPE": vocab, ranked merges, and the encoding of one pre-tokenized word.
// Both families: byte-level BPE (words arrive as GPT-2 byte-level characters) and SentencePiece
// BPE (characters missing from the vocab fall back to <0xXX> byte tokens, or to unk, fused when
// fuse_unk). Merges are applied lowest rank first through a heap over the adjacent pairs of a
// linked list of symbols, so a word of n characters costs O(n log n). The merges live in a flat
// open-addressing table keyed by the pair of ids (one probe sequence, no node per merge).
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
#include "tokenizer/tokenizer_json.h"

namespace nibble {

/// (left id, right id) -> (rank, merged id); ids are < 2^30.
class MergeTable {
 public:
  void Reserve(size_t n);
  /// Adds the merge unless the pair is there already (the first rank wins).
  void Insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  void Prefetch(int32_t left, int32_t right) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[Slot0(Key(left, right))]);
  }
  /// The merged id of the pair and its rank in *rank, or -1 when the pair does not merge.
  int32_t Find(int32_t left, int32_t right, int32_t* rank) const {
    if (slots_.empty()) return -1;
    const uint64_t key = Key(left, right);
    for (size_t i = Slot0(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *rank = s.rank;
        return s.merged;
      }
      if (s.key == kEmpty) return -1;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, merged = 0;
  };
  static uint64_t Key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
  size_t Slot0(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

class BpeModel {
 public:
  /// Builds the model from tokenizer.json's "model" object (`t.doc["model"]`) and the vocab and
  /// merges streamed out of it (taken from `t`). Errors (naming where and the value): a type
  /// other than BPE (Unigram, WordPiece, WordLevel are named as unsupported), a malformed vocab
  /// or merges, a merge naming a token not in the vocab, continuing_subword_prefix /
  /// end_of_word_suffix / dropout (not supported), an unk_token not in the vocab.
  static Result<BpeModel> Parse(TokenizerJson& t, const JsonWhere& where);

  /// Appends the ids of `word`. False when a character has no token, no byte fallback and there
  /// is no unk token.
  bool EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  /// With ignore_merges, the id of a word that is itself a token (what EncodeWord gives), else -1.
  int32_t WholeWordId(std::string_view word) const {
    if (!ignore_merges_) return -1;
    return vocab_.Find(word);
  }
  const TokenVocab& vocab() const { return vocab_; }
  /// One past the largest vocab id.
  int32_t id_end() const { return id_end_; }

 private:
  bool InitialSymbols(std::string_view word, std::vector<int32_t>* ids, std::vector<uint32_t>* lens) const;

  TokenVocab vocab_;
  int32_t id_end_ = 0;
  MergeTable merges_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> token ids, -1 when absent
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
};

}  // namespace nibble
