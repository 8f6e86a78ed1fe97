#include "model/decoder_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "base/half.h"
#include "base/parallel.h"
#include "kernels/dense_gemm.h"
#include "kernels/vec_ops.h"
#include "model/int4_linear.h"
#include "model/ops.h"

namespace nibble {

RopeTables BuildRopeTables(const ModelConfig& c, int64_t positions) {
  const std::vector<float> inv = RopeInvFreq(c);
  RopeTables r;
  r.half = c.head_dim / 2;
  r.cos.resize(static_cast<size_t>(positions * r.half));
  r.sin.resize(r.cos.size());
  for (int64_t pos = 0; pos < positions; ++pos) {
    for (int64_t i = 0; i < r.half; ++i) {
      const float angle = static_cast<float>(pos) * inv[i];  // fp32 product, as HF
      r.cos[pos * r.half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      r.sin[pos * r.half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return r;
}

DecoderLayerView ViewOf(const DecoderLayerWeights& w) {
  DecoderLayerView v;
  v.input_layernorm = w.input_layernorm.data();
  v.post_attention_layernorm = w.post_attention_layernorm.data();
  v.q_norm = w.q_norm.empty() ? nullptr : w.q_norm.data();
  v.k_norm = w.k_norm.empty() ? nullptr : w.k_norm.data();
  v.q_proj = w.q_proj.get();
  v.k_proj = w.k_proj.get();
  v.v_proj = w.v_proj.get();
  v.o_proj = w.o_proj.get();
  v.gate_proj = w.gate_proj.get();
  v.up_proj = w.up_proj.get();
  v.down_proj = w.down_proj.get();
  return v;
}

namespace {

using Slot = Workspace::Slot;

// Where sequence b's keys and values are read: its cache (fp32 k / v or bf16 k16 / v16), or this
// call's projections k / v [batch·t, kv_dim] (positions from 0).
struct SeqKeys {
  const float* k;
  const float* v;
  int64_t p0;
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
};

// Rows [0, n) of one kv head (columns [col, col + hd) of a [.., kv_dim] bf16 cache) widened into
// out [n, hd]: exact, so the attention's arithmetic is that of an fp32 cache holding those values.
void WidenHead(const uint16_t* src, int64_t n, int64_t kv_dim, int64_t col, int64_t hd, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* r = src + i * kv_dim + col;
    for (int64_t j = 0; j < hd; ++j) out[i * hd + j] = Bf16ToF32(r[j]);
  }
}

// One attention work item: query rows [i0, i0 + rows) of sequence b against head `head`, or, for a
// block of one query row, that row's `heads` heads from `head` on (the heads sharing one kv head
// under GQA: their queries are adjacent in the row, so the block's GEMMs take them as `heads` rows
// and the kv head is read, or widened from bf16, once instead of once per head).
struct AttnItem {
  int64_t b, i0, head, heads;
};

// Attention of every item on RoPE'd q [rows, q_dim], sequence b owning rows [qsl[b], qsl[b + 1]):
// rows [i0, i1) of a sequence attend to keys [0, p0 + i1) (later ones are masked by the softmax
// zeros; with a sliding window, so are the keys before p - window + 1 of a query at p). Writes
// attn [rows, q_dim].
void AttentionCore(const ModelConfig& c, const float* q, const SeqKeys* keys, int64_t batch, const int64_t* qsl,
                   float* attn) {
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd, group = nh / nkv;
  std::vector<AttnItem> items;
  int64_t max_keys = 0, score_floats = 0;
  bool bf16 = false;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t t = qsl[b + 1] - qsl[b];
    for (int64_t i0 = 0; i0 < t; i0 += kAttnRowBlock) {
      const int64_t rows = std::min(t - i0, kAttnRowBlock), heads = rows == 1 ? group : 1;
      for (int64_t h = 0; h < nh; h += heads) items.push_back({b, i0, h, heads});
      score_floats = std::max(score_floats, std::max(rows, heads) * (keys[b].p0 + i0 + rows));
    }
    max_keys = std::max(max_keys, keys[b].p0 + t);
    bf16 = bf16 || keys[b].k16 != nullptr;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t window = c.sliding_window;
  // Per item: scores [GEMM rows, keys], then (bf16 caches) its kv head's K and V widened.
  const int64_t kv_floats = bf16 ? max_keys * hd : 0;
  const int64_t scratch_floats = score_floats + 2 * kv_floats;
  const auto item = [&](int64_t it, float* scores) {
    const AttnItem& u = items[static_cast<size_t>(it)];
    const SeqKeys& s = keys[u.b];
    const int64_t r0 = qsl[u.b], i1 = std::min(qsl[u.b + 1] - r0, u.i0 + kAttnRowBlock), n_keys = s.p0 + i1;
    // GEMM rows: the block's query rows of one head (q_dim apart), or one row's heads (hd apart).
    const int64_t rows = u.heads > 1 ? u.heads : i1 - u.i0, ldq = u.heads > 1 ? hd : q_dim;
    const float* qb = q + (r0 + u.i0) * q_dim + u.head * hd;
    const int64_t col = (u.head / group) * hd;
    const float *kb = nullptr, *vb = nullptr;
    int64_t ld = kv_dim;
    if (s.k16 != nullptr) {
      float* const kw = scores + score_floats;
      float* const vw = kw + kv_floats;
      WidenHead(s.k16, n_keys, kv_dim, col, hd, kw);
      WidenHead(s.v16, n_keys, kv_dim, col, hd, vw);
      kb = kw;
      vb = vw;
      ld = hd;
    } else {
      kb = s.k + col;
      vb = s.v + col;
    }
    SgemmXWt(rows, n_keys, hd, qb, ldq, kb, ld, 0.0f, scores, n_keys);
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t i = u.heads > 1 ? u.i0 : u.i0 + j;  // the query row of score row j
      float* row = scores + j * n_keys;
      const int64_t first = window > 0 ? std::max<int64_t>(0, s.p0 + i + 1 - window) : 0;
      std::fill(row, row + first, 0.0f);
      ScaledSoftmaxRow(row + first, s.p0 + i + 1 - first, n_keys - first, scale);
    }
    SgemmXW(rows, hd, n_keys, scores, n_keys, vb, ld, 0.0f, attn + (r0 + u.i0) * q_dim + u.head * hd, ldq);
  };
  // The GEMMs inside run single-threaded (SingleThreadedBlas, or inside an OpenMP region): every
  // item's arithmetic is the same for any thread count. Items differ in length (later query
  // blocks see more keys): claimed chunks / a dynamic schedule balance them. A step with prompt
  // rows runs between oneDNN GEMMs whose OpenMP team is still spinning, so it stays on that team;
  // decode-only steps run on the claim pool, which no descheduled thread holds up. The scratch is
  // written before it is read (no zero fill).
  const int64_t n_items = static_cast<int64_t>(items.size());
  const auto run = [&](int64_t begin, int64_t end) {
    const SingleThreadedBlas one_thread;
    const auto scores = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(scratch_floats));
    for (int64_t it = begin; it < end; ++it) item(it, scores.get());
  };
  if (qsl[batch] == batch || !OpenTeam(true)) return ParallelRanges(n_items, true, run);
#pragma omp parallel
  {
    const auto scores = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(scratch_floats));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) item(it, scores.get());
  }
}

}  // namespace

void AttentionBlockForward(const ModelConfig& c, const DecoderLayerView& w, const RopeTables& rope, const float* xn,
                           int64_t batch, int64_t t, const LayerKv* kv, float* out, float* attn_concat,
                           Workspace& ws, const int64_t* query_start_loc) {
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t q_dim = nh * hd, kv_dim = nkv * hd;
  std::vector<int64_t> uniform;
  if (query_start_loc == nullptr) {
    for (int64_t b = 0; b <= batch; ++b) uniform.push_back(b * t);
    query_start_loc = uniform.data();
  }
  const int64_t* const qsl = query_start_loc;
  const int64_t rows = qsl[batch];
  std::vector<int64_t> pos(static_cast<size_t>(rows));  // each row's position in its sequence
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = qsl[b]; r < qsl[b + 1]; ++r) pos[static_cast<size_t>(r)] = (kv != nullptr ? kv[b].p0 : 0) + r - qsl[b];
  float* const qp = ws.Get<float>(Slot::kQ, rows * q_dim);
  float* const kp = ws.Get<float>(Slot::kK, rows * kv_dim);
  float* const vp = ws.Get<float>(Slot::kV, rows * kv_dim);
  float* const attn = attn_concat != nullptr ? attn_concat : ws.Get<float>(Slot::kAttn, rows * q_dim);
  const Linear* const qkv[] = {w.q_proj, w.k_proj, w.v_proj};
  float* const qkv_out[] = {qp, kp, vp};
  ForwardSameInput(qkv, qkv_out, 3, xn, rows, ws);
  const bool qk_norm = c.qk_norm;
  ParallelFor(rows, rows > 1, [&](int64_t r) {
    const int64_t p = pos[static_cast<size_t>(r)];
    if (qk_norm) {  // Qwen3: each head of q and k RMS-normed over head_dim, in place, before RoPE
      // One head per call: a single row opens no parallel region (decode runs this on one row).
      float *const qr = qp + r * q_dim, *const kr = kp + r * kv_dim;
      for (int64_t i = 0; i < nh; ++i) RmsNorm(qr + i * hd, w.q_norm, 1, hd, c.rms_norm_eps, qr + i * hd);
      for (int64_t i = 0; i < nkv; ++i) RmsNorm(kr + i * hd, w.k_norm, 1, hd, c.rms_norm_eps, kr + i * hd);
    }
    ApplyRope(qp + r * q_dim, nh, hd, rope.Cos(p), rope.Sin(p));
    ApplyRope(kp + r * kv_dim, nkv, hd, rope.Cos(p), rope.Sin(p));
  });
  std::vector<SeqKeys> keys(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const float *ks = kp + qsl[b] * kv_dim, *vs = vp + qsl[b] * kv_dim;
    if (kv == nullptr) {
      keys[b] = {ks, vs, 0};
      continue;
    }
    const LayerKv& c_b = kv[b];
    const int64_t n = (qsl[b + 1] - qsl[b]) * kv_dim;
    if (c_b.k16 != nullptr) {
      uint16_t *kd = c_b.k16 + c_b.p0 * kv_dim, *vd = c_b.v16 + c_b.p0 * kv_dim;
      for (int64_t i = 0; i < n; ++i) {
        kd[i] = F32ToBf16(ks[i]);
        vd[i] = F32ToBf16(vs[i]);
      }
      keys[b] = {nullptr, nullptr, c_b.p0, c_b.k16, c_b.v16};
      continue;
    }
    std::memcpy(c_b.k + c_b.p0 * kv_dim, ks, sizeof(float) * n);
    std::memcpy(c_b.v + c_b.p0 * kv_dim, vs, sizeof(float) * n);
    keys[b] = {c_b.k, c_b.v, c_b.p0};
  }
  AttentionCore(c, qp, keys.data(), batch, qsl, attn);
  w.o_proj->Forward(attn, rows, out, &ws);
}

void MlpBlockForward(const DecoderLayerView& w, const float* xn, int64_t rows, float* out, float* act, Workspace& ws) {
  const int64_t inter = w.gate_proj->out_features();
  float* const gp = ws.Get<float>(Slot::kGate, rows * inter);
  float* const up = ws.Get<float>(Slot::kUp, rows * inter);
  const Linear* const gate_up[] = {w.gate_proj, w.up_proj};
  float* const gate_up_out[] = {gp, up};
  ForwardSameInput(gate_up, gate_up_out, 2, xn, rows, ws);
  float* const a = act != nullptr ? act : gp;
  ParallelFor(rows, rows > 1, [&](int64_t r) { SiluMul(gp + r * inter, up + r * inter, inter, a + r * inter); });
  w.down_proj->Forward(a, rows, out, &ws);
}

void DecoderLayerForward(const ModelConfig& c, const DecoderLayerView& w, const RopeTables& rope, const float* x,
                         const LayerRun& run, float* out) {
  const int64_t rows = run.rows(), h = c.hidden_size;
  const LayerCapture& cap = run.capture;
  Workspace local;
  Workspace& ws = run.workspace != nullptr ? *run.workspace : local;
  float* const tmp = ws.Get<float>(Slot::kLayerOut, rows * h);
  // h lands in `out` unless it is captured; out may alias x (x is read once, by the add).
  float* const hres = cap.attn_residual != nullptr ? cap.attn_residual : ws.Get<float>(Slot::kLayerResidual, rows * h);
  if (run.start == LayerStart::kInput) {
    float* const xn1 = cap.attn_in != nullptr ? cap.attn_in : ws.Get<float>(Slot::kLayerNorm, rows * h);
    RmsNorm(x, w.input_layernorm, rows, h, c.rms_norm_eps, xn1);
    if (run.stop == LayerStop::kAttnIn) return;
    AttentionBlockForward(c, w, rope, xn1, run.batch, run.t, run.kv, tmp, cap.attn_concat, ws, run.query_start_loc);
    Add(x, tmp, rows * h, hres);
    if (run.stop == LayerStop::kAttnResidual) return;
  }
  float* const xn2 = cap.mlp_in != nullptr ? cap.mlp_in : ws.Get<float>(Slot::kLayerNorm, rows * h);
  RmsNorm(hres, w.post_attention_layernorm, rows, h, c.rms_norm_eps, xn2);
  if (run.stop == LayerStop::kMlpIn) return;
  MlpBlockForward(w, xn2, rows, tmp, cap.mlp_act, ws);
  Add(hres, tmp, rows * h, out);
}

}  // namespace nibble
