#include "model/llama.h"

#include <omp.h>

#include <cmath>

#include "base/check.h"
#include "kernels/dense_gemm.h"
#include "model/ops.h"
#include "model/weights.h"

namespace nibble {

const std::vector<std::string>& DecoderLinearNames() {
  static const std::vector<std::string> names = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                 "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                 "mlp.down_proj"};
  return names;
}

Result<std::unique_ptr<Linear>> LoadDenseLinear(const TensorStore& store, const std::string& prefix, int64_t n,
                                                int64_t k, bool has_bias) {
  NIBBLE_ASSIGN_OR_RETURN(std::vector<float> w, LoadF32(store, prefix + ".weight", {n, k}));
  std::vector<float> bias;
  if (has_bias) {
    NIBBLE_ASSIGN_OR_RETURN(bias, LoadF32(store, prefix + ".bias", {n}));
  }
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
  auto embed = LoadF32(store, "model.embed_tokens.weight", {c.vocab_size, h});
  if (!embed.ok()) return embed.error();
  auto embed_shared = std::make_shared<const std::vector<float>>(std::move(embed).value());
  NIBBLE_ASSIGN_OR_RETURN(m->norm_, LoadF32(store, "model.norm.weight", {h}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayer layer;
    NIBBLE_ASSIGN_OR_RETURN(layer.input_layernorm, LoadF32(store, p + "input_layernorm.weight", {h}));
    NIBBLE_ASSIGN_OR_RETURN(layer.post_attention_layernorm, LoadF32(store, p + "post_attention_layernorm.weight", {h}));
    NIBBLE_ASSIGN_OR_RETURN(layer.q_proj, loader(store, p + "self_attn.q_proj", q_dim, h, c.qkv_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.k_proj, loader(store, p + "self_attn.k_proj", kv_dim, h, c.qkv_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.v_proj, loader(store, p + "self_attn.v_proj", kv_dim, h, c.qkv_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.o_proj, loader(store, p + "self_attn.o_proj", h, q_dim, c.o_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.gate_proj, loader(store, p + "mlp.gate_proj", inter, h, c.mlp_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.up_proj, loader(store, p + "mlp.up_proj", inter, h, c.mlp_bias));
    NIBBLE_ASSIGN_OR_RETURN(layer.down_proj, loader(store, p + "mlp.down_proj", h, inter, c.mlp_bias));
    m->layers_.push_back(std::move(layer));
  }
  // Tied embeddings: a checkpoint without lm_head reuses embed_tokens (HF tie_word_embeddings).
  if (c.tie_word_embeddings && store.Find("lm_head.weight") == nullptr) {
    m->lm_head_ = std::make_unique<DenseLinear>(c.vocab_size, h, embed_shared, std::vector<float>{});
  } else {
    NIBBLE_ASSIGN_OR_RETURN(m->lm_head_, loader(store, "lm_head", c.vocab_size, h, false));
  }
  m->embed_tokens_ = *embed_shared;

  const std::vector<float> inv = RopeInvFreq(c);
  const int64_t half = c.head_dim / 2;
  m->rope_cos_.resize(c.max_position_embeddings * half);
  m->rope_sin_.resize(c.max_position_embeddings * half);
  for (int64_t pos = 0; pos < c.max_position_embeddings; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv[i];  // fp32 product, as HF
      m->rope_cos_[pos * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      m->rope_sin_[pos * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return m;
}

KvCache LlamaModel::NewCache(int64_t capacity) const {
  KvCache cache;
  cache.capacity = std::min(capacity, config_.max_position_embeddings);
  const size_t per_layer = static_cast<size_t>(cache.capacity * config_.num_key_value_heads * config_.head_dim);
  cache.k.assign(config_.num_hidden_layers, std::vector<float>(per_layer));
  cache.v.assign(config_.num_hidden_layers, std::vector<float>(per_layer));
  return cache;
}

Status LlamaModel::Forward(const int32_t* tokens, int64_t t, KvCache& cache, float* logits, bool all_logits) const {
  const ModelConfig& c = config_;
  NIBBLE_CHECK(t > 0);
  const int64_t p0 = cache.length;
  if (p0 + t > cache.capacity)
    return MakeError("sequence of ", p0 + t, " tokens exceeds the context limit of ", cache.capacity,
                     " positions (max_position_embeddings = ", c.max_position_embeddings, ")");
  if (c.sliding_window > 0 && p0 + t > c.sliding_window)
    return MakeError("sequence of ", p0 + t, " tokens exceeds sliding_window = ", c.sliding_window,
                     " (sliding-window attention is not implemented)");
  for (int64_t i = 0; i < t; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return MakeError("token id ", tokens[i], " at position ", p0 + i, " is outside the vocabulary [0, ", c.vocab_size, ")");

  const int64_t h = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd, inter = c.intermediate_size, half = hd / 2;
  const int64_t L = p0 + t;
  std::vector<float> x(t * h), xn(t * h), q(t * q_dim), k(t * kv_dim), v(t * kv_dim), attn(t * q_dim),
      tmp(t * h), g(t * inter), u(t * inter), scores(nh * t * L);
  for (int64_t i = 0; i < t; ++i)
    std::copy_n(embed_tokens_.data() + static_cast<int64_t>(tokens[i]) * h, h, x.data() + i * h);

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayer& layer = layers_[l];
    RmsNorm(x.data(), layer.input_layernorm.data(), t, h, c.rms_norm_eps, xn.data());
    layer.q_proj->Forward(xn.data(), t, q.data());
    layer.k_proj->Forward(xn.data(), t, k.data());
    layer.v_proj->Forward(xn.data(), t, v.data());
    for (int64_t i = 0; i < t; ++i) {
      const float* cs = rope_cos_.data() + (p0 + i) * half;
      const float* sn = rope_sin_.data() + (p0 + i) * half;
      ApplyRope(q.data() + i * q_dim, nh, hd, cs, sn);
      ApplyRope(k.data() + i * kv_dim, nkv, hd, cs, sn);
    }
    float* kc = cache.k[l].data();
    float* vc = cache.v[l].data();
    std::copy(k.begin(), k.end(), kc + p0 * kv_dim);
    std::copy(v.begin(), v.end(), vc + p0 * kv_dim);

    // Attention per head: scores by GEMM (threaded inside oneDNN), causal softmax rows in
    // parallel, then P·V by GEMM. Rows past the causal limit are zeroed so the GEMM ignores them.
    const int64_t group = nh / nkv;
    for (int64_t head = 0; head < nh; ++head) {
      // s[T, L] = q_h[T, hd] · K_h[L, hd]ᵀ
      SgemmXWt(t, L, hd, q.data() + head * hd, q_dim, kc + (head / group) * hd, kv_dim, 0.0f,
               scores.data() + head * t * L, L);
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nh * t; ++r) {
      float* row = scores.data() + r * L;
      const int64_t valid = p0 + (r % t) + 1;
      for (int64_t j = 0; j < valid; ++j) row[j] *= scale;
      SoftmaxRow(row, valid);
      for (int64_t j = valid; j < L; ++j) row[j] = 0.0f;
    }
    for (int64_t head = 0; head < nh; ++head) {
      // attn_h[T, hd] = P[T, L] · V_h[L, hd]
      SgemmXW(t, hd, L, scores.data() + head * t * L, L, vc + (head / group) * hd, kv_dim, 0.0f,
              attn.data() + head * hd, q_dim);
    }
    layer.o_proj->Forward(attn.data(), t, tmp.data());
    for (int64_t i = 0; i < t * h; ++i) x[i] += tmp[i];

    RmsNorm(x.data(), layer.post_attention_layernorm.data(), t, h, c.rms_norm_eps, xn.data());
    layer.gate_proj->Forward(xn.data(), t, g.data());
    layer.up_proj->Forward(xn.data(), t, u.data());
    SiluMul(g.data(), u.data(), t * inter, g.data());
    layer.down_proj->Forward(g.data(), t, tmp.data());
    for (int64_t i = 0; i < t * h; ++i) x[i] += tmp[i];
  }
  cache.length = L;
  if (all_logits) {
    RmsNorm(x.data(), norm_.data(), t, h, c.rms_norm_eps, xn.data());
    lm_head_->Forward(xn.data(), t, logits);
  } else {
    RmsNorm(x.data() + (t - 1) * h, norm_.data(), 1, h, c.rms_norm_eps, xn.data());
    lm_head_->Forward(xn.data(), 1, logits);
  }
  return Status::Ok();
}

}  // namespace nibble
