#include "model/output_projection.h"

#include <cstring>

namespace nibble {

namespace {

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// The stored lm_head is lm_head.weight alone, a float tensor with the embedding's dtype, shape
// and bytes (what save_pretrained writes for a tied model that does not drop the copy).
bool HeadIsEmbeddingCopy(const TensorStore& store) {
  const TensorView* lm = store.Find("lm_head.weight");
  const TensorView* et = store.Find(kEmbedTokensWeight);
  if (lm == nullptr || et == nullptr || !IsFloat(lm->dtype)) return false;
  for (const std::string& name : store.Names())
    if (name.starts_with("lm_head.") && name != "lm_head.weight") return false;
  return lm->dtype == et->dtype && lm->shape == et->shape && lm->nbytes == et->nbytes &&
         std::memcmp(lm->data, et->data, lm->nbytes) == 0;
}

}  // namespace

std::string OutputProjection::IgnoredHeadWarning() const {
  if (!stored_head_ignored) return "";
  if (stored_head_quantized)
    return "tie_word_embeddings is true but lm_head is stored quantized: nibble uses model.embed_tokens.weight as the "
           "output projection, as Transformers and vLLM do, and ignores the stored lm_head; set "
           "tie_word_embeddings false in config.json to run it (nibble quantize writes it so)";
  return "tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight: nibble uses "
         "model.embed_tokens.weight as the output projection, as Transformers and vLLM do";
}

Result<OutputProjection> FindOutputProjection(const ModelConfig& c, const TensorStore& store) {
  OutputProjection p;
  p.tied = c.tie_word_embeddings;
  for (const std::string& name : store.Names())
    if (name.starts_with("lm_head.")) p.head_stored = true;
  if (!p.tied && !p.head_stored)
    return MakeErrorCode(ErrorCode::kCorruptInput, store.description(),
                         ": missing tensor lm_head.weight: no lm_head tensor (the output projection) is stored and "
                         "config.json has "
                         "tie_word_embeddings false (the default when the key is absent); set \"tie_word_embeddings\": "
                         "true if the model uses model.embed_tokens.weight as its output projection");
  if (p.tied && p.head_stored) {
    const TensorView* lm = store.Find("lm_head.weight");
    p.stored_head_quantized = lm == nullptr || !IsFloat(lm->dtype);
    p.stored_head_ignored = !HeadIsEmbeddingCopy(store);
  }
  return p;
}

}  // namespace nibble
