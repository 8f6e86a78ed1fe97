// Llama-family decoder forward pass (Llama, Mistral, Qwen2, Qwen3): embeddings, RMSNorm, RoPE in HF's
// rotate_half convention, GQA attention with a KV cache, SwiGLU MLP, lm_head. fp32 compute.
//
// Design: every projection is a Linear (dense or int4), created by a LinearLoader so that
// checkpoint formats plug in without touching the forward pass; each decoder layer runs
// model/decoder_layer.h. One code path, ForwardBatch, runs every step: sequences with their own
// KV caches, each with its own chunk of tokens at its own position (decode = 1 token, prefill =
// the prompt or a chunk of it), all rows through one GEMM per projection; Forward (one sequence)
// is its special case.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nibble/cancel.h>

#include "base/result.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/decoder_layer.h"
#include "model/linear.h"
#include "model/workspace.h"

namespace nibble {

/// Creates the Linear for HF module `prefix` (e.g. "model.layers.0.self_attn.q_proj") with
/// N = out_features, K = in_features, reading `prefix.bias` when `has_bias`.
using LinearLoader = std::function<Result<std::unique_ptr<Linear>>(
    const TensorStore& store, const std::string& prefix, int64_t n, int64_t k, bool has_bias)>;

/// The default loader: fp weights (F32/F16/BF16) converted once to fp32.
Result<std::unique_ptr<Linear>> LoadDenseLinear(const TensorStore& store, const std::string& prefix,
                                                int64_t n, int64_t k, bool has_bias);

/// Names of the seven projections of a decoder layer, HF module names relative to the layer.
const std::vector<std::string>& DecoderLinearNames();

/// Every linear module name of a model with this config, in execution order (decoder
/// projections of each layer, then "lm_head" when `has_lm_head`: see FindOutputProjection
/// (model/output_projection.h) for which tensor a model's lm_head is).
std::vector<std::string> LinearModuleNames(const ModelConfig& c, bool has_lm_head);

/// {N = out_features, K = in_features} of a linear module named as LinearModuleNames does.
std::pair<int64_t, int64_t> LinearShape(const ModelConfig& c, const std::string& name);

/// Positions a KV cache grows by: storage follows the filled length, not the capacity.
inline constexpr int64_t kKvBlock = 256;

/// Per-sequence key/value cache: per layer [allocated, num_key_value_heads * head_dim] for K and V,
/// as bf16 bits (k16 / v16, the default) or fp32 (k / v); the other pair stays empty.
struct KvCache {
  int64_t capacity = 0;   // max positions (the session's ctx_size)
  int64_t length = 0;     // positions filled
  int64_t allocated = 0;  // positions with storage: a multiple of kKvBlock (or capacity), >= length
  int64_t row = 0;        // num_key_value_heads * head_dim
  bool bf16 = true;
  std::vector<std::vector<float>> k, v;
  std::shared_ptr<const RopeTables> rope;  // covers [0, capacity) at least (shared with the model)
  std::vector<std::vector<uint16_t>> k16, v16;
  /// Scratch of the forward passes that extend this cache (a batch runs in its first cache's):
  /// the session's own, never shared between threads; a copied cache starts with an empty one.
  Workspace workspace;
  /// Grows the storage to hold `positions` (<= capacity), rounded up to a block; keeps the rows.
  void Reserve(int64_t positions);
  /// Bytes of K and V storage held now.
  int64_t bytes() const;
};
/// Bytes of K and V for `positions` positions: 2 · layers · kv_heads · head_dim · positions · (2 | 4).
int64_t KvBytes(const ModelConfig& c, int64_t positions, bool bf16);

class LlamaModel {
 public:
  /// Loads config.json and tensors of `dir`; projections through `loader`.
  /// Errors: config errors, missing tensors, shape / dtype mismatches (named), refused pickles.
  static Result<std::unique_ptr<LlamaModel>> Load(const std::string& dir, const LinearLoader& loader = LoadDenseLinear);
  /// Builds from an already opened store and parsed config (quantizers, tests).
  static Result<std::unique_ptr<LlamaModel>> FromStore(const ModelConfig& config, const TensorStore& store,
                                                       const LinearLoader& loader);

  const ModelConfig& config() const { return config_; }
  const std::vector<DecoderLayerWeights>& layers() const { return layers_; }
  const Linear& lm_head() const { return *lm_head_; }
  const std::vector<float>& final_norm() const { return norm_; }  // [hidden_size]
  /// Bytes of every weight the model holds, each table once (a tied lm_head shares the
  /// embedding): embeddings, norms, each linear's WeightBytes. Zero-copy bf16 tables count in
  /// full, though only the pages read are resident.
  int64_t WeightBytes() const;

  /// Switches every projection and lm_head to (or back from) the opt-in W4A8 path
  /// (Linear::SetInt8Activations). Returns how many linears now run int8 activations.
  int64_t SetInt8Activations(bool on);
  /// Switches every projection and lm_head to (or back from) the opt-in bf16-activation path
  /// (Linear::SetBf16Activations). Returns how many linears now run bf16 activations.
  int64_t SetBf16Activations(bool on);

  /// Whether new caches store K/V as bf16 or fp32 (the default here: the exact forward the
  /// reference tests check; Model::Load sets LoadOptions::kv_dtype, bf16 unless asked).
  void SetKvBf16(bool on) { kv_bf16_ = on; }
  bool kv_bf16() const { return kv_bf16_; }
  /// A cache for up to `capacity` positions (clamped to [1, max_position_embeddings]), with RoPE
  /// tables for those positions: tables are sized by the context a caller uses, never by
  /// max_position_embeddings alone. No K/V storage yet: it grows by kKvBlock positions as Forward
  /// fills it. Errors: the full cache and tables need more memory than is available
  /// (base/memory.h), naming the positions and the sizes.
  Result<KvCache> NewCache(int64_t capacity) const;

  /// One step of `batch` sequences together (continuous batching): sequence b runs its tokens
  /// tokens[query_start_loc[b] .. query_start_loc[b + 1]) (at least one) at positions
  /// caches[b]->length .. of its own cache and appends their K/V. All rows go through each
  /// projection at once (each weight read once per step); attention and RoPE are per sequence.
  /// logits: [query_start_loc[batch], vocab_size] when all_logits, else [batch, vocab_size] (each
  /// sequence's last position). A sequence's logits equal what it gets alone up to the kernels'
  /// summation order for the step's row count (the int4 kernels switch paths at M thresholds).
  /// Errors (nothing appended to any cache): a sequence without tokens, a cache listed twice,
  /// Forward's errors, all naming the sequence; kCancelled when `cancel` is cancelled (checked
  /// before each layer): every cache keeps its length.
  Status ForwardBatch(const int32_t* tokens, const int64_t* query_start_loc, int64_t batch, KvCache* const* caches,
                      float* logits, bool all_logits, const CancellationToken* cancel = nullptr) const;

  /// Runs `tokens[0..t)` at positions cache.length .. cache.length + t - 1 and appends their K/V
  /// (ForwardBatch of one sequence). logits: [t, vocab_size] when all_logits, else [vocab_size].
  /// Errors: token id out of range, cache capacity exceeded (names position and limit);
  /// kCancelled when `cancel` is cancelled (checked before each layer): the cache keeps its length.
  Status Forward(const int32_t* tokens, int64_t t, KvCache& cache, float* logits, bool all_logits,
                 const CancellationToken* cancel = nullptr) const;

 private:
  // Checks token ids and capacity of `t` new tokens at the cache's position (seq < 0: a lone
  // sequence, not named).
  Status CheckAppend(const int32_t* tokens, int64_t t, const KvCache& cache, int64_t seq) const;
  // Embeds tokens [rows] into x [rows, hidden] (rows = qsl[batch]) and runs every layer, sequence
  // b on caches[b] (its rows [qsl[b], qsl[b + 1]) at that cache's position), which it extends by
  // its row count. Cancelled before a layer: returns kCancelled with every cache at its old length
  // (rows past it are overwritten later).
  Status RunLayers(const int32_t* tokens, int64_t batch, const int64_t* qsl, KvCache* const* caches, float* x,
                   const CancellationToken* cancel) const;
  // RunLayers, then the final norm and lm_head on the rows logits are asked for (inputs checked).
  Status RunChecked(const int32_t* tokens, int64_t batch, const int64_t* qsl, KvCache* const* caches, float* logits,
                    bool all_logits, const CancellationToken* cancel) const;

  ModelConfig config_;
  std::shared_ptr<const std::vector<float>> embed_tokens_;  // [vocab_size, hidden_size], shared with a tied lm_head
  // bf16 checkpoints keep the table as bf16 bit patterns instead (rows are widened exactly at
  // lookup; embed_tokens_ is then null): half the bytes. A tied lm_head runs on the same table
  // (Bf16DenseLinear) where the dispatch has a bf16 GEMV. Zero-copy in the mapped checkpoint:
  // only the rows looked up become resident.
  std::shared_ptr<const Bf16Weights> embed_bf16_;  // [vocab_size, hidden_size]
  std::vector<float> norm_;          // [hidden_size]
  std::vector<DecoderLayerWeights> layers_;
  std::unique_ptr<Linear> lm_head_;
  // RoPE tables for the longest cache made so far (NewCache grows them; sessions share them).
  mutable std::mutex rope_mu_;
  mutable std::shared_ptr<const RopeTables> rope_;
  bool kv_bf16_ = false;

  // How many of the projections and lm_head `f(Linear&)` returns true for (applied to each once).
  template <class F>
  int64_t CountLinears(F&& f);
};

}  // namespace nibble
