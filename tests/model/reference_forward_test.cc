// The fp forward pass of LlamaModel against an independent oracle: a naive double-precision
// transcription of HF's LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
// Qwen3ForCausalLM forward (modeling_llama.py, modeling_mistral.py, modeling_qwen2.py,
// modeling_qwen3.py) written here from the HF definitions, not from src/model.
//
// Each case writes a small synthetic checkpoint (config.json + model.safetensors, random weights
// of realistic scale) to a temp dir, loads it with LlamaModel::Load, and compares the logits of
// every position of a 12-token sequence with the oracle's, then does the same for incremental
// decoding (prefill 5 tokens, then 7 single-token Forward calls on the same KvCache). Every case
// also runs the oracle once with the feature it exercises switched off (no rope scaling, no
// biases, ...) and requires that to miss by far more than the tolerance, so a runtime that ignores
// the feature cannot pass. Finally LlamaModel::Load's errors for a wrong shape, a missing tensor
// and an integer dtype.
//
// Tolerance (derived). Both sides see the same stored weights (bf16/f16 values are rounded once
// when written and the oracle uses the rounded values), so the only difference is arithmetic:
// nibble runs in fp32 (unit roundoff u = 2^-24), the oracle in double (its error is negligible).
// The classic bound for an fp32 dot product of length K is |err| <= K·u·Σ|a_i·b_i|. The forward
// pass chains S = 8·layers + 3 such stages (per layer: rmsnorm, q/k/v, q·k scores, P·V, o, rmsnorm,
// gate/up, down; then final norm, lm_head, and the embedding/residual adds), each of length
// K <= K_max = max(hidden, q_dim, intermediate, sequence length). RMSNorm renormalises every
// stage's input to unit scale and the random weights are well conditioned, so the relative errors
// of the stages add: |err| <= S·K_max·u of the logit scale max(1, max|logit|). The elementwise
// pieces (ExpF ~2 ulp in softmax / silu, fp32 rope angles pos·inv_freq with pos < 12, fp32
// inv_freq) add O(u) per stage, far below K_max·u (K_max >= 64), so they do not change the bound.
// For the shapes below that is 1.1e-4 .. 1.4e-4 relative; the measured error is ~3e-7 relative,
// and each case's "feature off" mutant misses by 0.6 .. 3.5 absolute, > 1000 x the tolerance
// (the test requires > 100 x).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/half.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/decoder_layer.h"
#include "model/llama.h"
#include "model/ops.h"
#include "test_util.h"
#include "tiny_llama.h"

namespace {

using nibble::DType;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Synthetic checkpoints.

using nibble_test::TempDir;

// Deterministic N(0,1) (splitmix64 + Box-Muller), identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  double Uniform() {  // (0, 1)
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (static_cast<double>(z >> 11) + 0.5) / 9007199254740992.0;
  }
  double Normal() {
    const double u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t s_;
};

// Everything a case varies, in HF config.json terms (the checkpoint's shape and config), plus the
// oracle's reading of it. Oracle semantics (HF): Llama's attention_bias adds q/k/v/o biases; Qwen2
// always has q/k/v biases and never an o bias; mlp_bias adds gate/up/down biases.
struct Spec : nibble_test::TinyLlamaSpec {
  Spec() {
    inter = 96;
    vocab = 97;
    max_pos = 64;
    dtype = DType::kF32;
  }
  enum class Rope { kNone, kLinear, kLlama3 } rope = Rope::kNone;
  std::string rope_type_key = "rope_type";  // "type" in older configs
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t old_ctx = 8192;
  bool kv_interleave = false;  // oracle-only mutant: head h reads kv head h % n_kv (wrong for GQA)
  int64_t window = 0;          // oracle: a query at t attends to keys j with t - j < window (0 = all)
};

// The cases' `extra` never holds rope_scaling, so adding it after the merge is the same config.
json ConfigJson(const Spec& s) {
  json j = nibble_test::TinyLlamaConfig(s);
  if (s.rope == Spec::Rope::kLinear) j["rope_scaling"] = {{s.rope_type_key, "linear"}, {"factor", s.factor}};
  if (s.rope == Spec::Rope::kLlama3)
    j["rope_scaling"] = {{s.rope_type_key, "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.old_ctx}};
  return j;
}

// A weight as the oracle sees it: values already rounded to the stored dtype.
struct Weight {
  std::vector<int64_t> shape;
  std::vector<double> v;
};

struct Checkpoint {
  std::map<std::string, Weight> w;
  std::vector<nibble::TensorToWrite> tensors;  // in HF order
};

double RoundTo(DType dt, double x) {
  const float f = static_cast<float>(x);
  if (dt == DType::kBF16) return nibble::Bf16ToF32(nibble::F32ToBf16(f));
  if (dt == DType::kF16) return nibble::F16ToF32(nibble::F32ToF16(f));
  return f;
}

// Random weights: linears N(0, 0.1) (q/k N(0, 0.15) so attention is far from uniform), biases
// N(0, 0.1), embeddings N(0, 0.5), norm weights 1 + N(0, 0.1).
Checkpoint MakeCheckpoint(const Spec& s, uint64_t seed) {
  using R = nibble_test::TinyRole;
  Rng rng(seed);
  Checkpoint ck;
  auto fill = [&](const nibble_test::TinyTensor& t, std::vector<float>& v) {
    const double mean = t.role == R::kNorm ? 1 : 0;
    const double sd = t.role == R::kEmbedding ? 0.5 : t.role == R::kQueryKey ? 0.15 : 0.1;
    Weight w{t.shape, std::vector<double>(v.size())};
    for (size_t i = 0; i < v.size(); ++i) {
      w.v[i] = RoundTo(s.dtype, mean + sd * rng.Normal());
      v[i] = static_cast<float>(w.v[i]);  // exact: w.v[i] is an fp32 value
    }
    ck.w[t.name] = std::move(w);
  };
  ck.tensors = nibble_test::TinyLlamaTensors(s, nibble_test::TinyOrder::kHf, fill);
  return ck;
}

void WriteCheckpoint(const std::string& dir, const Spec& s, const std::vector<nibble::TensorToWrite>& tensors) {
  nibble_test::WriteTinyLlama(dir, ConfigJson(s), tensors);
}

// ---------------------------------------------------------------------------------------------
// The oracle: HF forward in double, straight from the definitions.

// HF _compute_default_rope_parameters / _compute_linear_scaling_rope_parameters /
// _compute_llama3_parameters, in double.
std::vector<double> OracleInvFreq(const Spec& s) {
  const int64_t half = s.head_dim / 2;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(s.theta, static_cast<double>(2 * i) / s.head_dim);
  if (s.rope == Spec::Rope::kLinear) {
    for (auto& f : inv) f /= s.factor;
  } else if (s.rope == Spec::Rope::kLlama3) {
    const double old_ctx = static_cast<double>(s.old_ctx);
    const double low_freq_wavelen = old_ctx / s.low_freq_factor;
    const double high_freq_wavelen = old_ctx / s.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen < high_freq_wavelen) {
        // high frequency: unchanged
      } else if (wavelen > low_freq_wavelen) {
        f = f / s.factor;
      } else {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

using Vec = std::vector<double>;

Vec RmsNormD(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

// y = W x + b, W [n, k] row-major (HF nn.Linear).
Vec LinearD(const Checkpoint& ck, const std::string& prefix, const Vec& x, bool bias) {
  const Weight& w = ck.w.at(prefix + ".weight");
  const int64_t n = w.shape[0], k = w.shape[1];
  Vec y(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < k; ++j) acc += w.v[i * k + j] * x[j];
    y[i] = acc + (bias ? ck.w.at(prefix + ".bias").v[i] : 0.0);
  }
  return y;
}

// q·cos + rotate_half(q)·sin with cos/sin = cat(freqs, freqs), rotate_half(x) = cat(-x2, x1).
void RopeD(double* x, int64_t head_dim, const Vec& inv_freq, int64_t pos) {
  const int64_t half = head_dim / 2;
  Vec out(head_dim);
  for (int64_t i = 0; i < head_dim; ++i) {
    const double ang = pos * inv_freq[i % half];
    const double rot = i < half ? -x[i + half] : x[i - half];
    out[i] = x[i] * std::cos(ang) + rot * std::sin(ang);
  }
  std::copy(out.begin(), out.end(), x);
}

// Qwen3RMSNorm on each of `heads` heads of x (head_dim values each), in place.
void QkNormD(Vec& x, const Vec& w, int64_t heads, int64_t hd, double eps) {
  for (int64_t h = 0; h < heads; ++h) {
    const Vec head(x.begin() + h * hd, x.begin() + (h + 1) * hd);
    const Vec y = RmsNormD(head, w, eps);
    std::copy(y.begin(), y.end(), x.begin() + h * hd);
  }
}

// Logits [T, vocab] for the whole sequence at positions 0..T-1.
std::vector<double> OracleLogits(const Spec& s, const Checkpoint& ck, const std::vector<int32_t>& tokens) {
  const int64_t T = tokens.size(), H = s.hidden, hd = s.head_dim, nh = s.heads, nkv = s.kv_heads;
  const Vec inv = OracleInvFreq(s);
  const Weight& emb = ck.w.at("model.embed_tokens.weight");
  std::vector<Vec> x(T, Vec(H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) x[t][i] = emb.v[tokens[t] * H + i];
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      const Vec xn = RmsNormD(x[t], ck.w.at(p + "input_layernorm.weight").v, s.eps);
      q[t] = LinearD(ck, p + "self_attn.q_proj", xn, s.qkv_bias);
      k[t] = LinearD(ck, p + "self_attn.k_proj", xn, s.qkv_bias);
      v[t] = LinearD(ck, p + "self_attn.v_proj", xn, s.qkv_bias);
      if (s.qk_norm) {  // Qwen3Attention: q_norm / k_norm over each head's head_dim, before RoPE
        QkNormD(q[t], ck.w.at(p + "self_attn.q_norm.weight").v, nh, hd, s.eps);
        QkNormD(k[t], ck.w.at(p + "self_attn.k_norm.weight").v, nkv, hd, s.eps);
      }
      for (int64_t h = 0; h < nh; ++h) RopeD(q[t].data() + h * hd, hd, inv, t);
      for (int64_t h = 0; h < nkv; ++h) RopeD(k[t].data() + h * hd, hd, inv, t);
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec attn(nh * hd, 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        // repeat_kv: head h reads kv head h // n_rep.
        const int64_t kvh = s.kv_interleave ? h % nkv : h / (nh / nkv);
        // Mistral's sliding window: keys j with t - j < window; earlier ones are masked (-inf).
        const int64_t j0 = s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
        Vec sc(t + 1, -INFINITY);
        double mx = -1e300;
        for (int64_t j = j0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][kvh * hd + i];
          sc[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& e : sc) sum += (e = std::exp(e - mx));  // exp(-inf) = 0 for masked keys
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < hd; ++i) attn[h * hd + i] += sc[j] / sum * v[j][kvh * hd + i];
      }
      const Vec o = LinearD(ck, p + "self_attn.o_proj", attn, s.o_bias);
      for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
    }
    for (int64_t t = 0; t < T; ++t) {
      const Vec xn = RmsNormD(x[t], ck.w.at(p + "post_attention_layernorm.weight").v, s.eps);
      const Vec g = LinearD(ck, p + "mlp.gate_proj", xn, s.mlp_bias);
      const Vec u = LinearD(ck, p + "mlp.up_proj", xn, s.mlp_bias);
      Vec a(s.inter);
      for (int64_t i = 0; i < s.inter; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const Vec d = LinearD(ck, p + "mlp.down_proj", a, s.mlp_bias);
      for (int64_t i = 0; i < H; ++i) x[t][i] += d[i];
    }
  }
  const std::string head = s.tie ? "model.embed_tokens" : "lm_head";
  std::vector<double> logits;
  for (int64_t t = 0; t < T; ++t) {
    const Vec y = LinearD(ck, head, RmsNormD(x[t], ck.w.at("model.norm.weight").v, s.eps), false);
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

// ---------------------------------------------------------------------------------------------
// Comparison.

const std::vector<int32_t> kTokens = {1, 17, 42, 5, 96, 42, 0, 63, 17, 88, 30, 2};

double LogitScale(const std::vector<double>& ref) {
  double m = 1.0;
  for (double v : ref) m = std::max(m, std::fabs(v));
  return m;
}

// S·K_max·u relative to the logit scale (see the file comment).
double RelTolerance(const Spec& s) {
  const double stages = 8.0 * s.layers + 3;
  const double k_max = std::max({s.hidden, s.heads * s.head_dim, s.inter, static_cast<int64_t>(kTokens.size())});
  return stages * k_max * nibble_test::kFp32UnitRoundoff;
}

struct Diff {
  double worst = 0;
  int64_t row = -1, col = -1;
  double got = 0, want = 0;
};

Diff Compare(const float* got, const double* want, int64_t rows, int64_t vocab) {
  Diff d;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < vocab; ++c) {
      const double e = std::fabs(got[r * vocab + c] - want[r * vocab + c]);
      if (e > d.worst || d.row < 0) d = {e, r, c, got[r * vocab + c], want[r * vocab + c]};
    }
  return d;
}

std::string Describe(const Diff& d, double tol) {
  return "worst |nibble - oracle| = " + std::to_string(d.worst) + " at position " + std::to_string(d.row) +
         ", token " + std::to_string(d.col) + " (nibble " + std::to_string(d.got) + ", oracle " +
         std::to_string(d.want) + "), tolerance " + std::to_string(tol);
}

// One ragged step (ForwardBatch) of three sequences with their own tokens: A continues 5 cached
// positions of kTokens with the other 7, B decodes the last position of another sequence, C runs a
// third from an empty cache; every row of each against its own oracle (positions, caches and
// windows are per sequence).
void CheckRaggedStep(const nibble::LlamaModel& m, const Spec& s, const Checkpoint& ck, const std::vector<double>& ref_a) {
  const int64_t T = kTokens.size(), V = s.vocab;
  const std::vector<int32_t> tok_b(kTokens.rbegin(), kTokens.rend());
  std::vector<int32_t> tok_c(kTokens.size());
  for (int64_t i = 0; i < T; ++i) tok_c[i] = static_cast<int32_t>((i * 31 + 7) % V);
  const std::vector<double> ref_b = OracleLogits(s, ck, tok_b), ref_c = OracleLogits(s, ck, tok_c);
  nibble::KvCache a = m.NewCache(T).value(), b = m.NewCache(T).value(), c = m.NewCache(T).value();
  std::vector<float> logits(3 * T * V);
  ASSERT_TRUE(m.Forward(kTokens.data(), 5, a, logits.data(), false).ok());
  ASSERT_TRUE(m.Forward(tok_b.data(), T - 1, b, logits.data(), false).ok());
  std::vector<int32_t> tokens(kTokens.begin() + 5, kTokens.end());
  tokens.push_back(tok_b.back());
  tokens.insert(tokens.end(), tok_c.begin(), tok_c.end());
  const int64_t qsl[4] = {0, T - 5, T - 4, 2 * T - 4};
  nibble::KvCache* caches[3] = {&a, &b, &c};
  const auto st = m.ForwardBatch(tokens.data(), qsl, 3, caches, logits.data(), /*all_logits=*/true);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(a.length, T);
  EXPECT_EQ(b.length, T);
  EXPECT_EQ(c.length, T);
  const struct {
    const char* name;
    const std::vector<double>& ref;
    int64_t first;  // the sequence's first new position
  } seqs[3] = {{"A (chunk)", ref_a, 5}, {"B (decode)", ref_b, T - 1}, {"C (from empty)", ref_c, 0}};
  for (int i = 0; i < 3; ++i) {
    const double tol = RelTolerance(s) * LogitScale(seqs[i].ref);
    const Diff d = Compare(logits.data() + qsl[i] * V, seqs[i].ref.data() + seqs[i].first * V, qsl[i + 1] - qsl[i], V);
    EXPECT_LE(d.worst, tol) << "ragged step, sequence " << seqs[i].name << ": " << Describe(d, tol);
  }
}

// Runs one case: full-sequence and incremental logits against the oracle, inv_freq against the
// oracle's, a ragged batched step, and the feature-off mutant against nibble (must miss).
void CheckCase(const Spec& s, const Spec& mutant, uint64_t seed) {
  TempDir dir;
  const Checkpoint ck = MakeCheckpoint(s, seed);
  WriteCheckpoint(dir.path(), s, ck.tensors);
  auto model = nibble::LlamaModel::Load(dir.path());
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto& m = **model;
  ASSERT_EQ(m.config().head_dim, s.head_dim);

  // inv_freq (fp32, powf) against the double definition: a few ulp of the exponent's rounding
  // (|ln theta| · 2^-24 ~ 6e-7) plus the fp32 products.
  const std::vector<float> inv = nibble::RopeInvFreq(m.config());
  const Vec want_inv = OracleInvFreq(s);
  ASSERT_EQ(inv.size(), want_inv.size());
  for (size_t i = 0; i < inv.size(); ++i)
    EXPECT_NEAR(inv[i], want_inv[i], 2e-6 * want_inv[i]) << "inv_freq[" << i << "]";

  const int64_t T = kTokens.size(), V = s.vocab;
  const std::vector<double> ref = OracleLogits(s, ck, kTokens);
  const double tol = RelTolerance(s) * LogitScale(ref);

  std::vector<float> full(T * V);
  nibble::KvCache cache = m.NewCache(T).value();
  auto st = m.Forward(kTokens.data(), T, cache, full.data(), /*all_logits=*/true);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(cache.length, T);
  const Diff d = Compare(full.data(), ref.data(), T, V);
  EXPECT_LE(d.worst, tol) << "full sequence: " << Describe(d, tol);

  // Incremental: prefill 5 (all rows), then 7 decode steps (last row each) on the same cache.
  std::vector<float> inc(T * V);
  nibble::KvCache c2 = m.NewCache(T).value();
  st = m.Forward(kTokens.data(), 5, c2, inc.data(), true);
  ASSERT_TRUE(st.ok()) << st.error().message;
  for (int64_t t = 5; t < T; ++t) {
    st = m.Forward(kTokens.data() + t, 1, c2, inc.data() + t * V, false);
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(c2.length, t + 1);
  }
  const Diff di = Compare(inc.data(), ref.data(), T, V);
  EXPECT_LE(di.worst, tol) << "incremental vs oracle: " << Describe(di, tol);
  std::vector<double> full_d(full.begin(), full.end());
  const Diff dd = Compare(inc.data(), full_d.data(), T, V);
  EXPECT_LE(dd.worst, tol) << "incremental vs full sequence: " << Describe(dd, tol);

  CheckRaggedStep(m, s, ck, ref);

  // The cache is full: one more token must be refused, not written past the end.
  const int32_t extra = 3;
  st = m.Forward(&extra, 1, c2, inc.data(), false);
  EXPECT_FALSE(st.ok());

  // Discrimination: the oracle without this case's feature must miss by far more than tol.
  const std::vector<double> wrong = OracleLogits(mutant, ck, kTokens);
  const Diff dm = Compare(full.data(), wrong.data(), T, V);
  EXPECT_GT(dm.worst, 100 * tol) << "the feature-off oracle is indistinguishable: " << Describe(dm, tol);
}

// (a) Llama, GQA 8 query heads on 2 kv heads, head_dim 12 given explicitly (hidden / heads = 8).
Spec GqaHeadDim() {
  Spec s;
  s.head_dim = 12;
  s.write_head_dim = true;
  return s;
}

TEST(ReferenceForward, LlamaGqaExplicitHeadDim) {
  const Spec s = GqaHeadDim();
  Spec mutant = s;
  mutant.kv_interleave = true;
  CheckCase(s, mutant, 1);
}

// (b) Qwen2: q/k/v biases (no o bias), tied embeddings without lm_head.weight.
TEST(ReferenceForward, Qwen2TiedWithQkvBias) {
  Spec s;
  s.model_type = "qwen2";
  s.architecture = "Qwen2ForCausalLM";
  s.hidden = 48;
  s.heads = 6;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.inter = 80;
  s.theta = 1000000.0;
  s.eps = 1e-6;
  s.qkv_bias = true;
  s.tie = true;
  s.extra = {{"use_sliding_window", false}, {"sliding_window", 32}};
  Spec mutant = s;
  mutant.qkv_bias = false;
  CheckCase(s, mutant, 2);
}

// (c) Llama attention_bias (q/k/v/o biases) and mlp_bias.
TEST(ReferenceForward, LlamaAttentionAndMlpBias) {
  Spec s;
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  Spec mutant = s;
  mutant.o_bias = false;
  mutant.mlp_bias = false;
  CheckCase(s, mutant, 3);
}

// (d) llama3 rope scaling. theta 100, head_dim 16 and original context 64 put inv_freq in all
// three bands: wavelen 6.3, 11.2 (< 64/4 = 16, kept), 19.9, 35.3, 62.8 (smoothed), 112, 199, 353
// (> 64/1, divided by factor).
TEST(ReferenceForward, Llama3RopeScaling) {
  Spec s;
  s.heads = 4;
  s.kv_heads = 4;
  s.head_dim = 16;
  s.theta = 100.0;
  s.rope = Spec::Rope::kLlama3;
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.old_ctx = 64;
  s.max_pos = 128;
  Spec mutant = s;
  mutant.rope = Spec::Rope::kNone;
  CheckCase(s, mutant, 4);
  // The same checkpoint read with only the medium band wrong (linear scaling by the same factor)
  // must miss too: checks the smoothing, not just "some scaling".
  Spec linear = s;
  linear.rope = Spec::Rope::kLinear;
  const Vec a = OracleInvFreq(s), b = OracleInvFreq(linear);
  EXPECT_EQ(a[0], 1.0);         // high band untouched
  EXPECT_NE(a[3], b[3]);        // medium band smoothed
  EXPECT_DOUBLE_EQ(a[7], b[7]);  // low band divided by factor
}

// (e) linear rope scaling, older "type" key.
TEST(ReferenceForward, LinearRopeScaling) {
  Spec s;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.theta = 100.0;
  s.rope = Spec::Rope::kLinear;
  s.rope_type_key = "type";
  s.factor = 4.0;
  Spec mutant = s;
  mutant.rope = Spec::Rope::kNone;
  CheckCase(s, mutant, 5);
}

// (f) Mistral model_type / architecture (sliding_window larger than the sequence).
TEST(ReferenceForward, Mistral) {
  Spec s;
  s.model_type = "mistral";
  s.architecture = "MistralForCausalLM";
  s.heads = 8;
  s.kv_heads = 4;
  s.head_dim = 8;
  s.eps = 1e-5;
  s.extra = {{"sliding_window", 32}};
  Spec mutant = s;
  mutant.eps = 1.0;  // any RMSNorm epsilon mix-up must show
  CheckCase(s, mutant, 6);
}

// (g) bf16 and f16 stored weights (converted exactly to fp32 at load).
TEST(ReferenceForward, Bf16Weights) {
  Spec s = GqaHeadDim();
  s.dtype = DType::kBF16;
  Spec mutant = s;
  mutant.kv_interleave = true;
  CheckCase(s, mutant, 7);
}

TEST(ReferenceForward, F16Weights) {
  Spec s;
  s.dtype = DType::kF16;
  s.qkv_bias = s.o_bias = true;
  Spec mutant = s;
  mutant.qkv_bias = false;
  CheckCase(s, mutant, 8);
}

// (h) Qwen3-shaped: per-head q_norm / k_norm before RoPE, no q/k/v bias, head_dim given
// explicitly and independent of hidden / heads (16 vs 48 / 4 = 12), tied embeddings over Qwen3's
// real 151936-token vocabulary (the table is the output projection, shared, not copied).
Spec Qwen3Shaped() {
  Spec s;
  s.model_type = "qwen3";
  s.architecture = "Qwen3ForCausalLM";
  s.hidden = 48;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.write_head_dim = true;
  s.inter = 80;
  s.vocab = 151936;
  s.theta = 1000000.0;
  s.eps = 1e-6;
  s.tie = true;
  s.qk_norm = true;
  s.extra = {{"use_sliding_window", false}, {"sliding_window", nullptr}, {"max_window_layers", 2}};
  return s;
}

TEST(ReferenceForward, Qwen3QkNormTiedLargeVocab) {
  const Spec s = Qwen3Shaped();
  Spec mutant = s;
  mutant.qk_norm = false;  // the norms skipped: q and k at their raw scale
  CheckCase(s, mutant, 9);
}

// (i) Llama-3-shaped: Llama 3.1's 128256-token vocabulary (untied), rope_theta 500000 and its
// llama3 rope_scaling (factor 8, low 1, high 4, original context 8192), GQA.
TEST(ReferenceForward, Llama3Shaped) {
  Spec s;
  s.hidden = 64;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.vocab = 128256;
  s.theta = 500000.0;
  s.rope = Spec::Rope::kLlama3;
  s.factor = 8.0;
  s.old_ctx = 8192;
  s.max_pos = 512;
  Spec mutant = s;
  mutant.kv_interleave = true;
  CheckCase(s, mutant, 10);
}

// (j) Mistral's sliding window shorter than the sequence: 12 tokens over a window of 5, the
// full sequence and the incremental decode both attend to the last 5 keys only.
TEST(ReferenceForward, MistralSlidingWindowEnforced) {
  Spec s;
  s.model_type = "mistral";
  s.architecture = "MistralForCausalLM";
  s.heads = 8;
  s.kv_heads = 4;
  s.head_dim = 8;
  s.window = 5;
  s.extra = {{"sliding_window", 5}};
  Spec mutant = s;
  mutant.window = 0;  // full causal attention
  CheckCase(s, mutant, 11);
}

// (k) llama3 rope at positions past original_max_position_embeddings (Llama 3.1's 8192): the
// RoPE tables against cos / sin of pos · inv_freq from the HF formula (OracleInvFreq). The
// tolerance per frequency covers nibble's fp32 inv_freq (2e-6 relative, as above) and fp32 angle
// (2^-24 relative) times the position; the low band, which the scaling divides by 8, is where a
// missing or wrong scaling shows (the unscaled angle is off by 7/8 of it, radians at these
// positions).
TEST(ReferenceForward, Llama3RopeAtLongPositions) {
  Spec s;
  s.head_dim = 128;
  s.theta = 500000.0;
  s.rope = Spec::Rope::kLlama3;
  s.factor = 8.0;
  s.old_ctx = 8192;
  s.max_pos = 131072;
  nibble::ModelConfig c;
  c.head_dim = s.head_dim;
  c.rope_theta = s.theta;
  c.rope_scaling.type = nibble::RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const int64_t positions = 20000;
  const nibble::RopeTables rope = nibble::BuildRopeTables(c, positions);
  const Vec inv = OracleInvFreq(s);
  Spec plain = s;
  plain.rope = Spec::Rope::kNone;
  const Vec inv_plain = OracleInvFreq(plain);
  int64_t scaled_misses = 0;
  for (int64_t pos : {8191, 8192, 8193, 9000, 12345, 16384, 19999}) {
    for (int64_t i = 0; i < s.head_dim / 2; ++i) {
      const double ang = static_cast<double>(pos) * inv[i];
      const double tol = static_cast<double>(pos) * inv[i] * 3e-6 + 1e-6;
      EXPECT_NEAR(rope.Cos(pos)[i], std::cos(ang), tol) << "pos " << pos << " frequency " << i;
      EXPECT_NEAR(rope.Sin(pos)[i], std::sin(ang), tol) << "pos " << pos << " frequency " << i;
      const double wrong = static_cast<double>(pos) * inv_plain[i];
      if (std::fabs(std::cos(wrong) - std::cos(ang)) > 100 * tol) ++scaled_misses;
    }
  }
  // The unscaled angles are far off at many of these (position, frequency) pairs.
  EXPECT_GT(scaled_misses, 50);
}

// RoPE tables are sized by the caches made, not by max_position_embeddings: a 131072-position
// model running 12 tokens builds 12 rows; a longer cache grows the shared table, and a cache keeps
// the table it was made with, so its logits do not change.
TEST(ReferenceForward, RopeTablesAreSizedByTheContextInUse) {
  TempDir dir;
  Spec s = GqaHeadDim();
  s.max_pos = 131072;
  const Checkpoint ck = MakeCheckpoint(s, 21);
  WriteCheckpoint(dir.path(), s, ck.tensors);
  auto model = nibble::LlamaModel::Load(dir.path());
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto& m = **model;
  const int64_t T = kTokens.size(), V = s.vocab;
  nibble::KvCache small = m.NewCache(T).value();
  ASSERT_NE(small.rope, nullptr);
  EXPECT_EQ(small.rope->positions(), T);
  EXPECT_EQ(m.NewCache(4).value().rope, small.rope);  // covered: shared, not rebuilt
  nibble::KvCache large = m.NewCache(3 * T).value();
  EXPECT_EQ(large.rope->positions(), 3 * T);
  EXPECT_EQ(small.rope->positions(), T);
  std::vector<float> a(T * V), b(T * V);
  ASSERT_TRUE(m.Forward(kTokens.data(), T, small, a.data(), true).ok());
  ASSERT_TRUE(m.Forward(kTokens.data(), T, large, b.data(), true).ok());
  EXPECT_EQ(a, b);
}

// ---------------------------------------------------------------------------------------------
// Load errors: each names the tensor and what was expected / found.

nibble::Result<std::unique_ptr<nibble::LlamaModel>> LoadWith(const std::string& dir, const Spec& s,
                                                     const std::vector<nibble::TensorToWrite>& tensors) {
  WriteCheckpoint(dir, s, tensors);
  return nibble::LlamaModel::Load(dir);
}

nibble::TensorToWrite* FindTensor(Checkpoint& ck, const std::string& name) {
  for (auto& t : ck.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void ExpectLoadError(const nibble::Result<std::unique_ptr<nibble::LlamaModel>>& r,
                     const std::vector<std::string>& needles) {
  ASSERT_FALSE(r.ok()) << "expected a load error";
  for (const auto& n : needles) EXPECT_NE(r.error().message.find(n), std::string::npos) << "missing \"" << n << "\" in: " << r.error().message;
}

TEST(ReferenceForwardLoad, WrongShapeNamesTensorExpectedAndFound) {
  TempDir dir;
  const Spec s = GqaHeadDim();
  Checkpoint ck = MakeCheckpoint(s, 11);
  auto* t = FindTensor(ck, "model.layers.1.mlp.up_proj.weight");
  ASSERT_NE(t, nullptr);
  t->shape = {s.inter, s.hidden + 1};
  t->bytes.resize(s.inter * (s.hidden + 1) * 4);
  ExpectLoadError(LoadWith(dir.path(), s, ck.tensors),
                  {"model.layers.1.mlp.up_proj.weight", "[96, 64]", "[96, 65]", "model.safetensors"});
}

TEST(ReferenceForwardLoad, MissingTensorNamesIt) {
  TempDir dir;
  const Spec s = GqaHeadDim();
  Checkpoint ck = MakeCheckpoint(s, 12);
  std::erase_if(ck.tensors, [](const auto& t) { return t.name == "model.layers.1.self_attn.v_proj.weight"; });
  ExpectLoadError(LoadWith(dir.path(), s, ck.tensors), {"missing tensor", "model.layers.1.self_attn.v_proj.weight"});
}

TEST(ReferenceForwardLoad, MissingBiasNamesIt) {
  // Qwen2 always has q/k/v biases; a checkpoint without one is refused, naming it.
  TempDir dir;
  Spec s;
  s.model_type = "qwen2";
  s.architecture = "Qwen2ForCausalLM";
  s.qkv_bias = true;
  Checkpoint ck = MakeCheckpoint(s, 13);
  std::erase_if(ck.tensors, [](const auto& t) { return t.name == "model.layers.0.self_attn.k_proj.bias"; });
  ExpectLoadError(LoadWith(dir.path(), s, ck.tensors), {"missing tensor", "model.layers.0.self_attn.k_proj.bias"});
}

TEST(ReferenceForwardLoad, MissingLmHeadWithoutTieNamesIt) {
  TempDir dir;
  Spec s;
  s.tie = true;  // generate without lm_head.weight ...
  Checkpoint ck = MakeCheckpoint(s, 14);
  s.tie = false;  // ... but declare untied embeddings
  ExpectLoadError(LoadWith(dir.path(), s, ck.tensors), {"missing tensor", "lm_head.weight"});
}

TEST(ReferenceForwardLoad, IntegerDtypeNamesDtype) {
  TempDir dir;
  const Spec s = GqaHeadDim();  // F32, so the I32 bytes have the same size
  Checkpoint ck = MakeCheckpoint(s, 15);
  auto* t = FindTensor(ck, "model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(t, nullptr);
  t->dtype = DType::kI32;
  ExpectLoadError(LoadWith(dir.path(), s, ck.tensors), {"model.layers.0.mlp.down_proj.weight", "I32"});
}

TEST(ReferenceForwardLoad, IntegerNormDtypeNamesDtype) {
  TempDir dir;
  const Spec s = GqaHeadDim();
  Checkpoint ck = MakeCheckpoint(s, 16);
  auto* t = FindTensor(ck, "model.norm.weight");
  ASSERT_NE(t, nullptr);
  t->dtype = DType::kI32;
  ExpectLoadError(LoadWith(dir.path(), s, ck.tensors), {"model.norm.weight", "I32"});
}

}  // namespace
