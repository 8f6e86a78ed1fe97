// Loading a model directory of any supported format: the checkpoint format comes from the
// registry (formats/checkpoint_format.h); each linear module is resolved by the format, decoded
// into the native Int4Matrix and run as an Int4Linear, or loaded dense.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/checkpoint_format.h"
#include "model/llama.h"
#include "model/output_projection.h"
#include "model/weight_cache.h"

namespace nibble {

/// The loader for a checkpoint in `format` (nullptr: dense): quantized modules become
/// Int4Linear, the others dense; errors as QuantizedFormat::Import. `act_order`, when set, counts
/// the linears whose non-natural g_idx Int4Linear sorts by group at load. `cache`, when set: a
/// hit serves the linears it holds from its mapped file; a miss packs into its file and records.
LinearLoader MakeLinearLoader(std::shared_ptr<const QuantizedFormat> format,
                              std::shared_ptr<std::atomic<int64_t>> act_order = nullptr,
                              std::shared_ptr<WeightCache> cache = nullptr);

/// Checks, without converting any data, that `store` holds every tensor a model with config `c`
/// reads, with the shape config.json implies: embeddings, norms and biases as float tensors, each
/// linear as `format` stores it (nullptr: dense, float [N, K]). First, before anything is sized by
/// them, num_hidden_layers against the stored model.layers.<i> tensors and vocab_size / hidden_size
/// against model.embed_tokens.weight (errors name config.json, the key, expected and found). Every
/// command that reads a model calls it before anything else. Errors name the file, tensor,
/// expected and found, and the config keys a linear's expected shape comes from.
Status CheckCheckpointShapes(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format);

/// Every tensor of `store` should be one the model reads: embeddings, norms, each linear's weight
/// and bias and, for a quantized checkpoint, the format's tensors of it. An unread tensor named
/// after a quantized module (`<module>.<anything else>`) is an error naming it: it may change how
/// the module's codes are meant to be decoded. The other unread tensors come back as one warning
/// listing them ("" when none).
Result<std::string> CheckUnreadTensors(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format);

/// Tied embeddings (tie_word_embeddings true) against the lm_head the checkpoint stores
/// (FindOutputProjection, model/output_projection.h: the embedding is the projection):
/// * no lm_head tensor while the config resolves lm_head to a quantized spec: error (the config
///   declares a quantized lm_head that is not there);
/// * a stored lm_head that is not a copy of the embedding (quantized, or a float one with other
///   values): a warning that it is ignored, as Transformers and vLLM ignore it.
/// Warnings are appended to `warnings`. Errors: FindOutputProjection's.
Status CheckTiedLmHead(const ModelConfig& c, const TensorStore& store, const QuantizedFormat* format,
                       std::vector<std::string>* warnings);

/// What LoadAnyModel found besides the model.
struct LoadReport {
  std::string format_name;            // "dense" or the format's name
  std::vector<std::string> warnings;  // CheckUnreadTensors', CheckTiedLmHead's; "note: " lines (act-order, cache)
  std::string weight_cache;           // the packed-weight cache entry used or written ("" when none)
  bool weight_cache_hit = false;      // the linears were read from it (no repacking)
};

/// Loads a model directory of any supported format. A quantized checkpoint goes through the
/// packed-weight cache in `cache_options.dir` (model/weight_cache.h; "" = no cache): mapped when
/// an entry for it exists, else packed into a new entry. A cache that cannot be written is a
/// "note: " in the report, never an error.
Result<std::unique_ptr<LlamaModel>> LoadAnyModel(const std::string& dir, LoadReport* report = nullptr,
                                                 const WeightCacheOptions& cache_options = {});

}  // namespace nibble
