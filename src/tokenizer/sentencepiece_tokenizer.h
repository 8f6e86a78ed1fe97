// SentencePiece tokenizer: tokenizer.model through libsentencepiece, the special-token rules of
// the HF Llama tokenizer (ReadSpecialTokens) with the model's own BOS/EOS ids as defaults.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace nibble {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Loads `dir/tokenizer.model` and the special-token settings of `dir` (ReadSpecialTokens).
  /// Errors: unreadable tokenizer.model, a file that is not a SentencePiece model (names it).
  static Result<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& dir);
  ~SentencePieceTokenizer() override;

  std::string Decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override;
  bool IsSpecial(int32_t id) const override;
  std::string Piece(int32_t id) const override;
  const char* kind_name() const override { return "sentencepiece"; }

 protected:
  Result<std::vector<int32_t>> EncodeText(const std::string& text) const override;

 private:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp, SpecialTokens special);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace nibble
