#include "model/llama.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/half.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_dispatch.h"
#include "kernels/vec_ops.h"
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
  std::vector<float> bias;
  if (has_bias) {
    NIBBLE_ASSIGN_OR_RETURN(bias, LoadF32(store, prefix + ".bias", {n}));
  }
  // bf16 weights stay bf16 where the dispatch has a bf16 GEMV: half the bytes per decode step.
  const Bf16GemvKernel gemv = ActiveW4Dispatch().kernels.gemv_bf16;
  if (const TensorView* t = store.Find(prefix + ".weight"); gemv != nullptr && t != nullptr && t->dtype == DType::kBF16) {
    NIBBLE_ASSIGN_OR_RETURN(t, GetShaped(store, prefix + ".weight", {n, k}));  // the store checked nbytes
    std::vector<uint16_t> w(static_cast<size_t>(n * k));
    std::memcpy(w.data(), t->data, t->nbytes);
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
  // The table stays bf16 when the checkpoint stores bf16 and no tied lm_head needs it as fp32.
  const bool tied = c.tie_word_embeddings && store.Find("lm_head.weight") == nullptr;
  std::shared_ptr<const std::vector<float>> embed_shared;
  const TensorView* et = store.Find("model.embed_tokens.weight");
  if (!tied && et != nullptr && et->dtype == DType::kBF16) {
    NIBBLE_ASSIGN_OR_RETURN(et, GetShaped(store, "model.embed_tokens.weight", {c.vocab_size, h}));
    m->embed_bf16_.resize(static_cast<size_t>(c.vocab_size * h));
    std::memcpy(m->embed_bf16_.data(), et->data, et->nbytes);
  } else {
    auto embed = LoadF32(store, "model.embed_tokens.weight", {c.vocab_size, h});
    if (!embed.ok()) return embed.error();
    embed_shared = std::make_shared<const std::vector<float>>(std::move(embed).value());
  }
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
  if (tied) {
    m->lm_head_ = std::make_unique<DenseLinear>(c.vocab_size, h, embed_shared, std::vector<float>{});
  } else {
    NIBBLE_ASSIGN_OR_RETURN(m->lm_head_, loader(store, "lm_head", c.vocab_size, h, false));
  }
  m->embed_tokens_ = embed_shared;  // shared, not copied (a tied lm_head holds the same table)

  BuildRopeTables(c, c.max_position_embeddings, &m->rope_cos_, &m->rope_sin_);
  return m;
}

void BuildRopeTables(const ModelConfig& c, int64_t positions, std::vector<float>* cos, std::vector<float>* sin) {
  const std::vector<float> inv = RopeInvFreq(c);
  const int64_t half = c.head_dim / 2;
  cos->resize(positions * half);
  sin->resize(positions * half);
  for (int64_t pos = 0; pos < positions; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv[i];  // fp32 product, as HF
      (*cos)[pos * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      (*sin)[pos * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

constexpr int64_t kAttnRowBlock = 128;

void AttentionBlockForward(const ModelConfig& c, const Linear& q_proj, const Linear& k_proj, const Linear& v_proj,
                           const Linear& o_proj, const float* rope_cos, const float* rope_sin, const float* xn,
                           int64_t batch, int64_t t, float* out, float* attn_concat) {
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd, half = hd / 2, rows = batch * t;
  // Scratch reused across calls (the quantization pipeline calls this thousands of times; fresh
  // multi-MB vectors would be mmap'd, page-faulted and zeroed each time).
  thread_local std::vector<float> q, k, v, own_attn;
  if (q.size() < static_cast<size_t>(rows * q_dim)) q.resize(rows * q_dim);
  if (k.size() < static_cast<size_t>(rows * kv_dim)) k.resize(rows * kv_dim);
  if (v.size() < static_cast<size_t>(rows * kv_dim)) v.resize(rows * kv_dim);
  float* attn = attn_concat;
  if (attn == nullptr) {
    if (own_attn.size() < static_cast<size_t>(rows * q_dim)) own_attn.resize(rows * q_dim);
    attn = own_attn.data();
  }
  // Plain pointers: inside the OpenMP regions below `q` would name each worker's own
  // (empty) thread_local vector.
  float* const qp = q.data();
  float* const kp = k.data();
  float* const vp = v.data();
  q_proj.Forward(xn, rows, qp);
  k_proj.Forward(xn, rows, kp);
  v_proj.Forward(xn, rows, vp);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = r % t;
    ApplyRope(qp + r * q_dim, nh, hd, rope_cos + pos * half, rope_sin + pos * half);
    ApplyRope(kp + r * kv_dim, nkv, hd, rope_cos + pos * half, rope_sin + pos * half);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = nh / nkv;
  // One (sequence, head) pair per iteration; the GEMMs inside run single-threaded (oneDNN does
  // not nest inside an OpenMP parallel region), so the result is independent of the thread count.
#pragma omp parallel
  {
    std::vector<float> scores(t * t);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < batch * nh; ++bh) {
      const int64_t b = bh / nh, head = bh % nh;
      const float* qb = qp + b * t * q_dim + head * hd;
      const float* kb = kp + b * t * kv_dim + (head / group) * hd;
      const float* vb = vp + b * t * kv_dim + (head / group) * hd;
      // Causal row blocks: rows [i0, i1) attend to keys [0, i1) only.
      for (int64_t i0 = 0; i0 < t; i0 += kAttnRowBlock) {
        const int64_t i1 = std::min(t, i0 + kAttnRowBlock);
        SgemmXWt(i1 - i0, i1, hd, qb + i0 * q_dim, q_dim, kb, kv_dim, 0.0f, scores.data(), i1);
        for (int64_t i = i0; i < i1; ++i) ScaledSoftmaxRow(scores.data() + (i - i0) * i1, i + 1, i1, scale);
        SgemmXW(i1 - i0, hd, i1, scores.data(), i1, vb, kv_dim, 0.0f, attn + (b * t + i0) * q_dim + head * hd, q_dim);
      }
    }
  }
  o_proj.Forward(attn, rows, out);
}

void MlpBlockForward(const Linear& gate_proj, const Linear& up_proj, const Linear& down_proj, const float* xn,
                     int64_t rows, float* out, float* act) {
  const int64_t inter = gate_proj.out_features();
  thread_local std::vector<float> g, u;  // scratch reused across calls (see AttentionBlockForward)
  if (g.size() < static_cast<size_t>(rows * inter)) g.resize(rows * inter);
  if (u.size() < static_cast<size_t>(rows * inter)) u.resize(rows * inter);
  float* const gp = g.data();
  float* const up = u.data();  // plain pointers for the OpenMP region (g, u are thread_local)
  gate_proj.Forward(xn, rows, gp);
  up_proj.Forward(xn, rows, up);
  float* a = act != nullptr ? act : gp;
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) SiluMul(gp + r * inter, up + r * inter, inter, a + r * inter);
  down_proj.Forward(a, rows, out);
}

template <class F>
int64_t LlamaModel::CountLinears(F&& f) {
  int64_t n = 0;
  for (DecoderLayer& l : layers_)
    for (Linear* p : {l.q_proj.get(), l.k_proj.get(), l.v_proj.get(), l.o_proj.get(), l.gate_proj.get(), l.up_proj.get(),
                      l.down_proj.get()})
      n += f(*p) ? 1 : 0;
  n += f(*lm_head_) ? 1 : 0;
  return n;
}

int64_t LlamaModel::SetBf16Activations(bool on) {
  return CountLinears([on](Linear& l) { return l.SetBf16Activations(on); });
}

int64_t LlamaModel::SetInt8Activations(bool on) {
  return CountLinears([on](Linear& l) { return l.SetInt8Activations(on); });
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
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd, half = hd / 2;
  const int64_t L = p0 + t;
  std::vector<float> x(t * h), xn(t * h), q(t * q_dim), k(t * kv_dim), v(t * kv_dim), attn(t * q_dim),
      tmp(t * h), scores(nh * t * L);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t row = static_cast<int64_t>(tokens[i]) * h;
    if (embed_tokens_ != nullptr) {
      std::copy_n(embed_tokens_->data() + row, h, x.data() + i * h);
    } else {
      for (int64_t j = 0; j < h; ++j) x[static_cast<size_t>(i * h + j)] = Bf16ToF32(embed_bf16_[static_cast<size_t>(row + j)]);
    }
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayer& layer = layers_[l];
    RmsNorm(x.data(), layer.input_layernorm.data(), t, h, c.rms_norm_eps, xn.data());
    layer.q_proj->Forward(xn.data(), t, q.data());
    layer.k_proj->Forward(xn.data(), t, k.data());
    layer.v_proj->Forward(xn.data(), t, v.data());
#pragma omp parallel for schedule(static) if (t > 1)
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
    AddInPlace(x.data(), tmp.data(), t * h);

    RmsNorm(x.data(), layer.post_attention_layernorm.data(), t, h, c.rms_norm_eps, xn.data());
    MlpBlockForward(*layer.gate_proj, *layer.up_proj, *layer.down_proj, xn.data(), t, tmp.data(), nullptr);
    AddInPlace(x.data(), tmp.data(), t * h);
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
