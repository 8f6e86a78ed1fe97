// One Llama-family decoder layer, the only place the layer is composed: inference (prefill,
// decode, perplexity) and calibration (AWQ's statistics and loss evaluations) run this code.
//
//   xn1  = RMSNorm(x, input_layernorm)                  capture: attn_in      [rows, H]
//   a    = Attention(RoPE(qn(q_proj xn1)), RoPE(kn(k_proj xn1)), v_proj xn1)
//          qn / kn: Qwen3's per-head RMSNorms q_norm / k_norm (identity elsewhere); a query at
//          position p attends to keys [0, p], or (p - sliding_window, p] with a window
//                                                       capture: attn_concat  [rows, heads·hd]
//   h    = x + o_proj a                                 capture: attn_residual [rows, H]
//   xn2  = RMSNorm(h, post_attention_layernorm)         capture: mlp_in       [rows, H]
//   m    = silu(gate_proj xn2) · up_proj xn2            capture: mlp_act      [rows, I]
//   out  = h + down_proj m
//
// Rows are `batch` sequences of new tokens concatenated: `t` each (row r = b·t + i), or ragged,
// sequence b owning rows [query_start_loc[b], query_start_loc[b + 1]) (vLLM's layout: decode
// tokens of some sequences and prefill chunks of others in one step). Every projection runs once
// on all rows. Attention reads each sequence's keys and values either from a KV cache (inference:
// the new rows are appended at the sequence's position p0) or, without one, from this call's own
// projections (calibration: every sequence starts at position 0). Scores are computed per
// (sequence, head, block of kAttnRowBlock query rows) in a per-thread scratch of
// kAttnRowBlock × (p0 + t) floats, never [heads × t × L]; a block of one query row (decode) takes
// the heads of one kv head together, so GQA reads (and widens) each kv head once per row. A
// sequence's attention does not depend on the other rows of the call. Each block's GEMMs run single-threaded inside one parallel region, so the
// result does not depend on the thread count; the softmax is ScaledSoftmaxRow (fixed lanes).
// Every other intermediate (q, k, v, the attention output, gate / up, normed rows, the linears'
// scratch) lives in the caller's Workspace (model/workspace.h): the weights are only read, so
// any number of threads may run layers of one model at once, each with its own workspace.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/linear.h"
#include "model/workspace.h"

namespace nibble {

/// Query rows per attention block (scores scratch kAttnRowBlock × keys per thread).
constexpr int64_t kAttnRowBlock = 128;

/// RoPE tables for positions 0..positions-1: cos/sin [positions, head_dim / 2] (fp32 angle
/// pos·inv_freq as HF computes it, cos/sin evaluated in double and rounded to fp32).
struct RopeTables {
  int64_t half = 0;  // head_dim / 2
  std::vector<float> cos, sin;
  const float* Cos(int64_t pos) const { return cos.data() + pos * half; }
  const float* Sin(int64_t pos) const { return sin.data() + pos * half; }
  int64_t positions() const { return half > 0 ? static_cast<int64_t>(cos.size()) / half : 0; }
};
RopeTables BuildRopeTables(const ModelConfig& c, int64_t positions);

/// The weights of one decoder layer as stored by a loaded model.
struct DecoderLayerWeights {
  std::vector<float> input_layernorm;           // [hidden_size]
  std::vector<float> post_attention_layernorm;  // [hidden_size]
  std::vector<float> q_norm, k_norm;            // [head_dim] (Qwen3), else empty
  std::unique_ptr<Linear> q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

/// What a layer forward runs with: the model's own weights, or calibration's candidates.
struct DecoderLayerView {
  const float* input_layernorm = nullptr;           // [hidden_size]
  const float* post_attention_layernorm = nullptr;  // [hidden_size]
  const float *q_norm = nullptr, *k_norm = nullptr;  // [head_dim] when config.qk_norm, else unused
  const Linear *q_proj = nullptr, *k_proj = nullptr, *v_proj = nullptr, *o_proj = nullptr;
  const Linear *gate_proj = nullptr, *up_proj = nullptr, *down_proj = nullptr;
};
DecoderLayerView ViewOf(const DecoderLayerWeights& w);

/// One sequence's cached keys and values for this layer: rows [0, p0) hold earlier positions,
/// the call writes the sequence's t new rows (its own t when ragged) at p0 .. p0 + t - 1 (each row
/// num_key_value_heads · head_dim).
/// Either k / v (fp32) or k16 / v16 (bf16 bits: new rows rounded to nearest even, read back
/// exactly widened by the attention) are set.
struct LayerKv {
  float* k = nullptr;  // [>= p0 + t, kv_dim]
  float* v = nullptr;  // [>= p0 + t, kv_dim]
  int64_t p0 = 0;
  uint16_t* k16 = nullptr;  // [>= p0 + t, kv_dim]
  uint16_t* v16 = nullptr;  // [>= p0 + t, kv_dim]
};

/// Intermediate activations a caller wants kept (nullptr = not kept); shapes as in the file
/// comment, rows = batch · t.
struct LayerCapture {
  float* attn_in = nullptr;
  float* attn_concat = nullptr;
  float* attn_residual = nullptr;
  float* mlp_in = nullptr;
  float* mlp_act = nullptr;
};

/// How far a layer forward runs, and where it starts.
enum class LayerStop { kAttnIn, kAttnResidual, kMlpIn, kFull };
enum class LayerStart {
  kInput,  // from x
  kMlp,    // from capture.attn_residual, which already holds h for x and the current attention
           // weights (a previous call computed it); attn_in / attn_concat are left as they are
};

struct LayerRun {
  int64_t batch = 1, t = 1;
  /// [batch + 1] row offsets of a ragged batch (t is then unused), or nullptr: t rows each.
  const int64_t* query_start_loc = nullptr;
  const LayerKv* kv = nullptr;  // [batch] caches, or nullptr: keys from this call, positions from 0
  int64_t rows() const { return query_start_loc != nullptr ? query_start_loc[batch] : batch * t; }
  LayerCapture capture;
  LayerStop stop = LayerStop::kFull;
  LayerStart start = LayerStart::kInput;
  Workspace* workspace = nullptr;  // the caller's scratch; nullptr = one of this call's own
};

/// Runs the layer on x [rows, H] and writes the layer output to out [rows, H] (out may be
/// x; rows = run.rows()). Stages past run.stop are not run (out is then untouched). rope must cover every position
/// used (p0 + t for a cache).
void DecoderLayerForward(const ModelConfig& c, const DecoderLayerView& w, const RopeTables& rope, const float* x,
                         const LayerRun& run, float* out);

/// The attention sub-block on already normed rows xn [rows, H]: out [rows, H] = o_proj of the
/// attention, attn_concat (nullptr or [rows, heads·hd]) keeps the o_proj input. Rows as LayerRun's:
/// batch·t, or ragged by query_start_loc [batch + 1] when it is given.
void AttentionBlockForward(const ModelConfig& c, const DecoderLayerView& w, const RopeTables& rope, const float* xn,
                           int64_t batch, int64_t t, const LayerKv* kv, float* out, float* attn_concat,
                           Workspace& ws, const int64_t* query_start_loc = nullptr);

/// The SwiGLU sub-block on xn [rows, H]: out [rows, H] = down_proj(silu(gate_proj xn) · up_proj xn);
/// act (nullptr or [rows, intermediate_size]) keeps the down_proj input.
void MlpBlockForward(const DecoderLayerView& w, const float* xn, int64_t rows, float* out, float* act, Workspace& ws);

}  // namespace nibble
