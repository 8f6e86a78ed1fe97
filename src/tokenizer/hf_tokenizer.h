// Hugging Face tokenizer.json (the `tokenizers` library's format) with a BPE model: Llama 3,
// Qwen2/3 (byte-level BPE) and Llama 2 / Mistral / Gemma (SentencePiece-style BPE with byte
// fallback). Encoding runs as the library does: added tokens are matched first (longest at the
// leftmost position; those with normalized=false on the raw text, the others on the normalized
// text), the rest is normalized, pre-tokenized into words, and each word encoded by the model.
// The special tokens of the default call come from the post-processor's template (BOS before $A,
// EOS after), overridden by tokenizer_config.json's add_bos_token / add_eos_token as Transformers
// applies them (ReadSpecialTokens).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/hf_text.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

/// Leftmost-longest matching of added tokens over a byte trie.
class AddedTokenMatcher {
 public:
  void Add(const std::string& content, int32_t index);
  /// Splits `text` into pieces: [begin, end) with the matched token's index, or -1 for text
  /// between matches. lstrip / rstrip widen a match over the whitespace beside it; a
  /// single_word token only matches outside words.
  struct Piece {
    size_t begin, end;
    int32_t token;
  };
  std::vector<Piece> Split(std::string_view text, const std::vector<AddedToken>& tokens) const;
  bool empty() const { return terminal_.size() <= 1; }

 private:
  std::unordered_map<uint64_t, int32_t> edges_;  // node << 8 | byte -> child node
  std::vector<int32_t> terminal_{-1};            // node -> token index, -1 when none
  bool first_[256] = {};
};

class HfTokenizer final : public Tokenizer {
 public:
  /// Loads `dir/tokenizer.json` and the special-token settings of `dir` (tokenizer_config.json,
  /// config.json). Errors name the file, the JSON path and the value: not JSON, an unsupported
  /// model / normalizer / pre-tokenizer / decoder / post-processor type, a merge naming a token
  /// not in the vocab, an added token id out of range, a vocab larger than config.json's
  /// vocab_size.
  static Result<std::unique_ptr<HfTokenizer>> Load(const std::string& dir);
  /// The same from tokenizer.json text (named `file` in errors), with no side files.
  static Result<std::unique_ptr<HfTokenizer>> FromJsonText(const std::string& text, const std::string& file);
  ~HfTokenizer() override;

  std::string Decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  bool IsSpecial(int32_t id) const override;
  std::string Piece(int32_t id) const override;
  const char* kind_name() const override { return "tokenizer.json"; }

 protected:
  Result<std::vector<int32_t>> EncodeText(const std::string& text) const override;

 private:
  struct Parts;
  HfTokenizer(std::unique_ptr<Parts> parts, SpecialTokens special);
  static Result<std::unique_ptr<HfTokenizer>> Build(TokenizerJson& t, const std::string& file, const std::string& dir);
  bool EncodeSegment(const std::string& normalized, bool at_start, std::vector<int32_t>* out) const;
  bool EncodeWordCached(std::string_view word, std::vector<int32_t>* out) const;

  std::unique_ptr<Parts> parts_;
  std::vector<std::string> id_to_token_;
  std::vector<int8_t> added_kind_;  // per id: 0 model token, 1 added, 2 added special
  // Encoded words (bounded; cleared when full): text repeats its words.
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace nibble
