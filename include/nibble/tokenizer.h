// A model directory's tokenizer on its own (no config.json or weights needed): SentencePiece
// tokenizer.model or Hugging Face tokenizer.json, with the special-token rules of the HF
// tokenizer's default call. `nibble tokenize` runs on it; Model::Load uses the same choice.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nibble/error.h>

namespace nibble {

/// Which tokenizer file a model directory is read with.
enum class TokenizerType {
  kAuto,  // tokenizer.json when present and tokenizer.model absent, else tokenizer.model
  kHf,    // tokenizer.json (Hugging Face tokenizers format; BPE models)
  kSpm,   // tokenizer.model (SentencePiece)
};
/// "auto" | "hf" | "spm".
const char* TokenizerTypeName(TokenizerType t);
/// The type named `name` ("auto" | "hf" | "spm"); false for any other string.
bool ParseTokenizerType(const std::string& name, TokenizerType* out);

class TextTokenizer {
 public:
  /// Loads the tokenizer of `dir` (plus tokenizer_config.json / config.json when present).
  /// Errors: the file `type` needs is missing (names it), malformed files (name the file, the
  /// JSON path or key and the value).
  static Result<std::unique_ptr<TextTokenizer>> Load(const std::string& dir, TokenizerType type = TokenizerType::kAuto);
  ~TextTokenizer();

  /// As the HF tokenizer's default call: BOS / EOS per the template and add_bos_token /
  /// add_eos_token with add_special_tokens. Errors: text that is not valid UTF-8 (names the offset).
  Result<std::vector<int32_t>> Encode(const std::string& text, bool add_special_tokens = true) const;
  /// UTF-8 text; special tokens render as nothing.
  std::string Decode(const std::vector<int32_t>& ids) const;
  /// The vocabulary string of `id` ("▁Hello", "Ġworld"); empty when out of range.
  std::string Piece(int32_t id) const;
  int32_t vocab_size() const;
  /// "sentencepiece" or "tokenizer.json".
  const char* kind() const;

 private:
  struct Impl;
  TextTokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble
