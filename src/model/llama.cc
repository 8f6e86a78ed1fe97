#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/memory.h"
#include "base/half.h"
#include "kernels/int4_dispatch.h"
#include "model/ops.h"
#include "model/output_projection.h"
#include "model/weights.h"

namespace nibble {

const std::vector<std::string>& DecoderLinearNames() {
  static const std::vector<std::string> names = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                 "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                 "mlp.down_proj"};
  return names;
}

std::pair<int64_t, int64_t> LinearShape(const ModelConfig& c, const std::string& name) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  auto ends = [&](const char* s) { return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0; };
  if (name == "lm_head") return {c.vocab_size, h};
  if (ends("q_proj")) return {q, h};
  if (ends("k_proj") || ends("v_proj")) return {kv, h};
  if (ends("o_proj")) return {h, q};
  if (ends("gate_proj") || ends("up_proj")) return {c.intermediate_size, h};
  if (ends("down_proj")) return {h, c.intermediate_size};
  return {0, 0};
}

std::vector<std::string> LinearModuleNames(const ModelConfig& c, bool has_lm_head) {
  std::vector<std::string> names;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const auto& n : DecoderLinearNames()) names.push_back("model.layers." + std::to_string(l) + "." + n);
  if (has_lm_head) names.push_back("lm_head");
  return names;
}

Result<std::unique_ptr<Linear>> LoadDenseLinear(const TensorStore& store, const std::string& prefix, int64_t n,
                                                int64_t k, bool has_bias) {
  std::vector<float> bias;
  if (has_bias) {
    NIBBLE_ASSIGN_OR_RETURN(bias, LoadF32(store, prefix + ".bias", {n}));
  }
  // bf16 weights stay bf16 where the dispatch has a bf16 GEMV: half the bytes per decode step.
  const Bf16GemvKernel gemv = ActiveW4Dispatch().kernels.gemv_bf16;
  if (const TensorView* t = store.Find(prefix + ".weight"); gemv != nullptr && t != nullptr && t->dtype == DType::kBF16) {
    NIBBLE_ASSIGN_OR_RETURN(std::shared_ptr<const Bf16Weights> w, ShareBf16(store, prefix + ".weight", {n, k}));
    return std::unique_ptr<Linear>(new Bf16DenseLinear(n, k, std::move(w), std::move(bias), gemv));
  }
  NIBBLE_ASSIGN_OR_RETURN(std::vector<float> w, LoadF32(store, prefix + ".weight", {n, k}));
  return std::unique_ptr<Linear>(
      new DenseLinear(n, k, std::make_shared<const std::vector<float>>(std::move(w)), std::move(bias)));
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& dir, const LinearLoader& loader) {
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  return FromStore(config, store, loader);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::FromStore(const ModelConfig& c, const TensorStore& store,
                                                          const LinearLoader& loader) {
  auto m = std::unique_ptr<LlamaModel>(new LlamaModel());
  m->config_ = c;
  const int64_t h = c.hidden_size, q_dim = c.num_attention_heads * c.head_dim,
                kv_dim = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(c, store));
  // The table stays bf16 when the checkpoint stores bf16, unless a tied lm_head needs it as fp32
  // (no bf16 GEMV in the dispatch): then one fp32 table serves both.
  const Bf16GemvKernel gemv = ActiveW4Dispatch().kernels.gemv_bf16;
  std::shared_ptr<const std::vector<float>> embed_shared;
  const TensorView* et = store.Find(kEmbedTokensWeight);
  if (et != nullptr && et->dtype == DType::kBF16 && (!proj.tied || gemv != nullptr)) {
    NIBBLE_ASSIGN_OR_RETURN(m->embed_bf16_, ShareBf16(store, kEmbedTokensWeight, {c.vocab_size, h}));
  } else {
    auto embed = LoadF32(store, kEmbedTokensWeight, {c.vocab_size, h});
    if (!embed.ok()) return embed.error();
    embed_shared = std::make_shared<const std::vector<float>>(std::move(embed).value());
  }
  NIBBLE_ASSIGN_OR_RETURN(m->norm_, LoadF32(store, "model.norm.weight", {h}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayerWeights layer;
    NIBBLE_ASSIGN_OR_RETURN(layer.input_layernorm, LoadF32(store, p + "input_layernorm.weight", {h}));
    NIBBLE_ASSIGN_OR_RETURN(layer.post_attention_layernorm, LoadF32(store, p + "post_attention_layernorm.weight", {h}));
    if (c.qk_norm) {
      NIBBLE_ASSIGN_OR_RETURN(layer.q_norm, LoadF32(store, p + "self_attn.q_norm.weight", {c.head_dim}));
      NIBBLE_ASSIGN_OR_RETURN(layer.k_norm, LoadF32(store, p + "self_attn.k_norm.weight", {c.head_dim}));
    }
    NIBBLE_ASSIGN_OR_RETURN(layer.q_proj, loader(store, p + "self_attn.q_proj", q_dim, h, c.qkv_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.k_proj, loader(store, p + "self_attn.k_proj", kv_dim, h, c.qkv_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.v_proj, loader(store, p + "self_attn.v_proj", kv_dim, h, c.qkv_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.o_proj, loader(store, p + "self_attn.o_proj", h, q_dim, c.o_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.gate_proj, loader(store, p + "mlp.gate_proj", inter, h, c.mlp_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.up_proj, loader(store, p + "mlp.up_proj", inter, h, c.mlp_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.down_proj, loader(store, p + "mlp.down_proj", h, inter, c.mlp_bias));
    m->layers_.push_back(std::move(layer));
  }
  // Tied (FindOutputProjection): the embedding table itself is the output projection, shared and
  // never copied; a bf16 table runs the same bf16 GEMV as an untied bf16 lm_head.
  if (proj.tied && m->embed_bf16_ != nullptr) {
    m->lm_head_ = std::make_unique<Bf16DenseLinear>(c.vocab_size, h, m->embed_bf16_, std::vector<float>{}, gemv);
  } else if (proj.tied) {
    m->lm_head_ = std::make_unique<DenseLinear>(c.vocab_size, h, embed_shared, std::vector<float>{});
  } else {
    NIBBLE_ASSIGN_OR_RETURN(m->lm_head_, loader(store, "lm_head", c.vocab_size, h, false));
  }
  m->embed_tokens_ = embed_shared;  // shared, not copied (a tied lm_head holds the same table)
  return m;
}

template <class F>
int64_t LlamaModel::CountLinears(F&& f) {
  int64_t n = 0;
  for (DecoderLayerWeights& l : layers_)
    for (Linear* p : {l.q_proj.get(), l.k_proj.get(), l.v_proj.get(), l.o_proj.get(), l.gate_proj.get(), l.up_proj.get(),
                      l.down_proj.get()})
      n += f(*p) ? 1 : 0;
  n += f(*lm_head_) ? 1 : 0;
  return n;
}

int64_t LlamaModel::WeightBytes() const {
  const auto floats = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * sizeof(float)); };
  int64_t bytes = floats(norm_);
  if (embed_tokens_ != nullptr) bytes += static_cast<int64_t>(embed_tokens_->size() * sizeof(float));
  if (embed_bf16_ != nullptr) bytes += static_cast<int64_t>(embed_bf16_->size() * sizeof(uint16_t));
  for (const DecoderLayerWeights& l : layers_) {
    bytes += floats(l.input_layernorm) + floats(l.post_attention_layernorm) + floats(l.q_norm) + floats(l.k_norm);
    for (const Linear* p : {l.q_proj.get(), l.k_proj.get(), l.v_proj.get(), l.o_proj.get(), l.gate_proj.get(),
                            l.up_proj.get(), l.down_proj.get()})
      bytes += p->WeightBytes();
  }
  if (!config_.tie_word_embeddings) bytes += lm_head_->WeightBytes();  // tied: the embedding itself
  return bytes;
}

int64_t LlamaModel::SetBf16Activations(bool on) {
  return CountLinears([on](Linear& l) { return l.SetBf16Activations(on); });
}

int64_t LlamaModel::SetInt8Activations(bool on) {
  return CountLinears([on](Linear& l) { return l.SetInt8Activations(on); });
}

int64_t KvBytes(const ModelConfig& c, int64_t positions, bool bf16) {
  return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * positions * (bf16 ? 2 : 4);
}

void KvCache::Reserve(int64_t positions) {
  NIBBLE_CHECK(positions <= capacity);
  if (positions <= allocated) return;
  allocated = std::min(capacity, (positions + kKvBlock - 1) / kKvBlock * kKvBlock);
  const size_t n = static_cast<size_t>(allocated * row);
  for (auto* layers : {&k, &v})
    for (auto& l : *layers) l.resize(n);
  for (auto* layers : {&k16, &v16})
    for (auto& l : *layers) l.resize(n);
}

int64_t KvCache::bytes() const {
  const int64_t layers = static_cast<int64_t>(bf16 ? k16.size() : k.size());
  return 2 * layers * allocated * row * (bf16 ? 2 : 4);
}

Result<KvCache> LlamaModel::NewCache(int64_t capacity) const {
  const ModelConfig& c = config_;
  KvCache cache;
  cache.capacity = std::clamp<int64_t>(capacity, 1, c.max_position_embeddings);
  cache.row = c.num_key_value_heads * c.head_dim;
  cache.bf16 = kv_bf16_;
  std::lock_guard<std::mutex> lock(rope_mu_);
  const bool new_rope = rope_ == nullptr || rope_->positions() < cache.capacity;
  // In double: the sizes are checked against the tensors, but their product may exceed int64.
  const double bytes = 2.0 * (cache.bf16 ? 2 : 4) * static_cast<double>(c.num_hidden_layers) *
                           static_cast<double>(cache.row) * static_cast<double>(cache.capacity) +
                       (new_rope ? 4.0 * static_cast<double>(cache.capacity) * static_cast<double>(c.head_dim) : 0.0);
  NIBBLE_RETURN_IF_ERROR(CheckMemoryFor(bytes, "a KV cache of " + std::to_string(cache.capacity) + " positions (" +
                                                   std::to_string(c.num_hidden_layers) + " layers of 2 x " +
                                                   std::to_string(cache.row) + (cache.bf16 ? " bf16" : " fp32") +
                                                   " values each)"));
  if (new_rope) rope_ = std::make_shared<const RopeTables>(BuildRopeTables(c, cache.capacity));
  cache.rope = rope_;
  const size_t layers = static_cast<size_t>(c.num_hidden_layers);
  if (cache.bf16) {
    cache.k16.resize(layers);
    cache.v16.resize(layers);
  } else {
    cache.k.resize(layers);
    cache.v.resize(layers);
  }
  return cache;
}

Status LlamaModel::CheckAppend(const int32_t* tokens, int64_t t, const KvCache& cache, int64_t seq) const {
  const ModelConfig& c = config_;
  const int64_t p0 = cache.length;
  const std::string who = seq < 0 ? "" : "sequence " + std::to_string(seq) + ": ";
  if (p0 + t > cache.capacity)
    return MakeError(who, "sequence of ", p0 + t, " tokens exceeds the context limit of ", cache.capacity,
                     " positions (max_position_embeddings = ", c.max_position_embeddings, ")");
  for (int64_t i = 0; i < t; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return MakeError(who, "token id ", tokens[i], " at position ", p0 + i, " is outside the vocabulary [0, ",
                       c.vocab_size, ")");
  return Status::Ok();
}

Status LlamaModel::RunLayers(const int32_t* tokens, int64_t batch, const int64_t* qsl, KvCache* const* caches, float* x,
                             const CancellationToken* cancel) const {
  const int64_t h = config_.hidden_size, rows = qsl[batch];
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = static_cast<int64_t>(tokens[i]) * h;
    if (embed_tokens_ != nullptr) {
      std::copy_n(embed_tokens_->data() + row, h, x + i * h);
    } else {
      const uint16_t* e = embed_bf16_->data() + row;
      for (int64_t j = 0; j < h; ++j) x[i * h + j] = Bf16ToF32(e[j]);
    }
  }
  // Every cache's table covers its own capacity, so the longest one covers every position here.
  const RopeTables* rope = caches[0]->rope.get();
  for (int64_t b = 1; b < batch; ++b)
    if (caches[b]->rope->positions() > rope->positions()) rope = caches[b]->rope.get();
  for (int64_t b = 0; b < batch; ++b) caches[b]->Reserve(caches[b]->length + qsl[b + 1] - qsl[b]);
  std::vector<LayerKv> kv(static_cast<size_t>(batch));
  LayerRun run;
  run.batch = batch;
  run.query_start_loc = qsl;
  run.kv = kv.data();
  run.workspace = &caches[0]->workspace;
  for (size_t l = 0; l < layers_.size(); ++l) {
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, "forward pass before layer " + std::to_string(l)));
    for (int64_t b = 0; b < batch; ++b) {
      KvCache& cb = *caches[b];
      kv[b] = cb.bf16 ? LayerKv{nullptr, nullptr, cb.length, cb.k16[l].data(), cb.v16[l].data()}
                      : LayerKv{cb.k[l].data(), cb.v[l].data(), cb.length, nullptr, nullptr};
    }
    DecoderLayerForward(config_, ViewOf(layers_[l]), *rope, x, run, x);
  }
  for (int64_t b = 0; b < batch; ++b) caches[b]->length += qsl[b + 1] - qsl[b];
  return Status::Ok();
}

Status LlamaModel::RunChecked(const int32_t* tokens, int64_t batch, const int64_t* qsl, KvCache* const* caches,
                              float* logits, bool all_logits, const CancellationToken* cancel) const {
  const int64_t h = config_.hidden_size, rows = qsl[batch];
  std::vector<float> x(static_cast<size_t>(rows * h));
  NIBBLE_RETURN_IF_ERROR(RunLayers(tokens, batch, qsl, caches, x.data(), cancel));
  if (all_logits) {
    RmsNorm(x.data(), norm_.data(), rows, h, config_.rms_norm_eps, x.data());
    lm_head_->Forward(x.data(), rows, logits, &caches[0]->workspace);
    return Status::Ok();
  }
  // Each sequence's last row, normed into [batch, hidden] (the norm is per row: the same values).
  std::vector<float> xn(static_cast<size_t>(batch * h));
  for (int64_t b = 0; b < batch; ++b)
    RmsNorm(x.data() + (qsl[b + 1] - 1) * h, norm_.data(), 1, h, config_.rms_norm_eps, xn.data() + b * h);
  lm_head_->Forward(xn.data(), batch, logits, &caches[0]->workspace);
  return Status::Ok();
}

Status LlamaModel::ForwardBatch(const int32_t* tokens, const int64_t* query_start_loc, int64_t batch,
                                KvCache* const* caches, float* logits, bool all_logits,
                                const CancellationToken* cancel) const {
  NIBBLE_CHECK(batch > 0 && query_start_loc[0] == 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t t = query_start_loc[b + 1] - query_start_loc[b];
    if (t < 1) return MakeError("sequence ", b, ": no tokens (query_start_loc ", query_start_loc[b], " to ", query_start_loc[b + 1], ")");
    NIBBLE_RETURN_IF_ERROR(CheckAppend(tokens + query_start_loc[b], t, *caches[b], b));
    for (int64_t o = 0; o < b; ++o)
      if (caches[o] == caches[b]) return MakeError("sequences ", o, " and ", b, " share one KV cache");
  }
  return RunChecked(tokens, batch, query_start_loc, caches, logits, all_logits, cancel);
}

Status LlamaModel::Forward(const int32_t* tokens, int64_t t, KvCache& cache, float* logits, bool all_logits,
                           const CancellationToken* cancel) const {
  NIBBLE_CHECK(t > 0);
  NIBBLE_RETURN_IF_ERROR(CheckAppend(tokens, t, cache, -1));  // a lone sequence: errors name no index
  const int64_t qsl[2] = {0, t};
  KvCache* caches[1] = {&cache};
  return RunChecked(tokens, 1, qsl, caches, logits, all_logits, cancel);
}

}  // namespace nibble
