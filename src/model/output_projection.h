// Which tensor is a checkpoint's output projection (HF's lm_head). The one answer that the
// forward (LlamaModel::FromStore), quantize, convert, verify, export-onnx and the engines report
// all ask, so that nibble's model is the one Transformers and vLLM run.
//
// tie_word_embeddings true: the projection is model.embed_tokens.weight, whatever lm_head tensors
// the checkpoint also stores (Transformers' tie_weights points lm_head at the embedding; vLLM
// skips "lm_head.*" when it loads a tied model). false: it is the lm_head module as stored
// (lm_head.weight, or the format's quantized tensors), which must then be present.
#pragma once

#include <string>

#include "base/result.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace nibble {

inline constexpr char kEmbedTokensWeight[] = "model.embed_tokens.weight";

struct OutputProjection {
  bool tied = false;         // tie_word_embeddings: the embedding is the projection
  bool head_stored = false;  // some "lm_head.*" tensor is stored
  // Tied, and the stored lm_head is not a bit-identical float copy of the embedding (other values,
  // dtype or shape, or quantized tensors): every engine ignores it.
  bool stored_head_ignored = false;
  bool stored_head_quantized = false;  // the stored lm_head has no float lm_head.weight

  /// Whether the stored lm_head module is what runs (untied).
  bool ReadsHeadModule() const { return !tied; }
  /// The float tensor a float checkpoint's projection is read from: the embedding when tied,
  /// else lm_head.weight.
  std::string FloatTensor() const { return tied ? kEmbedTokensWeight : "lm_head.weight"; }
  /// "" or one warning sentence about a stored lm_head that the tie makes every engine ignore.
  std::string IgnoredHeadWarning() const;
};

/// The output projection of the checkpoint `store` with config `c`. Error (kCorruptInput): untied
/// with no lm_head tensor stored, naming the key that would fix it.
Result<OutputProjection> FindOutputProjection(const ModelConfig& c, const TensorStore& store);

/// The quantize decision for a tied model whose lm_head is quantized, as the output states it.
inline constexpr char kTiedHeadQuantizedNote[] =
    "lm_head: tie_word_embeddings is true; quantized from model.embed_tokens.weight and written untied "
    "(tie_word_embeddings false in the written config.json; model.embed_tokens.weight kept as it is)";

}  // namespace nibble
