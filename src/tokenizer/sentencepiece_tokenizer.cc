#include "tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "io/file.h"

namespace nibble {

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp,
                                               SpecialTokens special)
    : Tokenizer(std::move(special)), sp_(std::move(sp)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

Result<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(const std::string& dir) {
  const std::string path = JoinPath(dir, "tokenizer.model");
  NIBBLE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  auto st = sp->LoadFromSerializedProto(bytes);
  if (!st.ok()) return MakeError(path, ": not a SentencePiece model (", st.ToString(), ")");
  if (sp->GetPieceSize() <= 0) return MakeError(path, ": SentencePiece model has no pieces");
  SpecialTokens defaults;
  defaults.bos_id = sp->bos_id();
  if (sp->eos_id() >= 0) defaults.eos_ids = {sp->eos_id()};
  defaults.pad_id = sp->pad_id();
  NIBBLE_ASSIGN_OR_RETURN(SpecialTokens special, ReadSpecialTokens(dir, sp->GetPieceSize(), std::move(defaults)));
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(sp), std::move(special)));
}

Result<std::vector<int32_t>> SentencePieceTokenizer::EncodeText(const std::string& text) const {
  std::vector<int> ids;
  auto st = sp_->Encode(text, &ids);
  if (!st.ok()) return MakeError("tokenizer: ", st.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  std::string out;
  sp_->Decode(v, &out);  // control ids (BOS/EOS) decode to nothing
  return out;
}

int32_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

bool SentencePieceTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < sp_->GetPieceSize() && sp_->IsControl(id);
}

std::string SentencePieceTokenizer::Piece(int32_t id) const {
  return id >= 0 && id < sp_->GetPieceSize() ? sp_->IdToPiece(id) : std::string();
}

}  // namespace nibble
