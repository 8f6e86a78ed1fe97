#include <nibble/tokenizer.h>

#include "api/model_impl.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

struct TextTokenizer::Impl {
  std::unique_ptr<Tokenizer> tok;
};

const char* TokenizerTypeName(TokenizerType t) {
  switch (t) {
    case TokenizerType::kHf: return "hf";
    case TokenizerType::kSpm: return "spm";
    case TokenizerType::kAuto: break;
  }
  return "auto";
}

bool ParseTokenizerType(const std::string& name, TokenizerType* out) {
  for (TokenizerType t : {TokenizerType::kAuto, TokenizerType::kHf, TokenizerType::kSpm}) {
    if (name == TokenizerTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

TextTokenizer::TextTokenizer() : impl_(std::make_unique<Impl>()) {}
TextTokenizer::~TextTokenizer() = default;

Result<std::unique_ptr<TextTokenizer>> TextTokenizer::Load(const std::string& dir, TokenizerType type) {
  auto tok = Tokenizer::Load(dir, ToTokenizerKind(type));
  if (!tok.ok()) return tok.error().WithContext("loading tokenizer of " + dir);
  std::unique_ptr<TextTokenizer> t(new TextTokenizer());
  t->impl_->tok = std::move(tok).value();
  return t;
}

Result<std::vector<int32_t>> TextTokenizer::Encode(const std::string& text, bool add_special_tokens) const {
  return impl_->tok->Encode(text, add_special_tokens);
}
std::string TextTokenizer::Decode(const std::vector<int32_t>& ids) const { return impl_->tok->Decode(ids); }
std::string TextTokenizer::Piece(int32_t id) const { return impl_->tok->Piece(id); }
int32_t TextTokenizer::vocab_size() const { return impl_->tok->vocab_size(); }
const char* TextTokenizer::kind() const { return impl_->tok->kind_name(); }

}  // namespace nibble
