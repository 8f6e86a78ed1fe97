// SentencePiece tokenizer (tokenizer.model through libsentencepiece) with the BOS/EOS rules of
// the HF Llama tokenizer: tokenizer_config.json `add_bos_token` / `add_eos_token`, ids from
// config.json (`bos_token_id`, `eos_token_id`) falling back to the SentencePiece model's own.
// Non-goal (for now): HF tokenizer.json BPE.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace nibble {

class Tokenizer {
 public:
  /// Loads `dir/tokenizer.model` and BOS/EOS settings from `dir/tokenizer_config.json` and
  /// `dir/config.json` (both optional). Errors: missing tokenizer.model, a file that is not a
  /// SentencePiece model, malformed JSON (each names the file).
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  ~Tokenizer();

  /// Encodes UTF-8 text; prepends BOS when add_bos_token (HF default call, add_special_tokens).
  /// Errors: text that is not valid UTF-8 (names the byte offset).
  Result<std::vector<int32_t>> Encode(const std::string& text) const;
  /// Decodes ids to text (special tokens dropped, byte-fallback pieces joined into UTF-8).
  std::string Decode(const std::vector<int32_t>& ids) const;

  int32_t bos_id() const { return bos_id_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool add_bos() const { return add_bos_; }
  int32_t vocab_size() const;

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  bool add_bos_ = true;
  bool add_eos_ = false;
};

/// Byte offset of the first invalid UTF-8 sequence in `s`, or -1 when valid.
int64_t FirstInvalidUtf8(const std::string& s);

}  // namespace nibble
