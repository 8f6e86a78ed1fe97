// AWQ sequential pipeline (see awq.h for the algorithm and its sources).
#include "quantize/awq.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <set>

#include "formats/float_dtype.h"
#include "formats/int4_matrix.h"
#include "formats/rtn.h"
#include "kernels/dense_gemm.h"
#include "kernels/vec_ops.h"
#include "model/linear.h"
#include "model/llama.h"
#include "model/ops.h"
#include "model/weights.h"

namespace nibble {

namespace {

constexpr int kQ = 0, kK = 1, kV = 2, kO = 3, kGate = 4, kUp = 5, kDown = 6, kNumLinears = 7;
constexpr int64_t kReportRows = 8192;   // calibration rows used for the per-linear error report
constexpr int64_t kClipTokens = 512;    // AutoAWQ n_sample_token
constexpr int64_t kRowBlock = 1024;     // fixed reduction blocks (thread-count independent sums)

// Which activation feeds a projection.
enum class Src { kAttnIn, kAttnConcat, kMlpIn, kMlpAct };
Src SourceOf(int i) {
  switch (i) {
    case kQ: case kK: case kV: return Src::kAttnIn;
    case kO: return Src::kAttnConcat;
    case kGate: case kUp: return Src::kMlpIn;
    default: return Src::kMlpAct;
  }
}

int LinearIndex(const std::string& rel) {
  const auto& names = DecoderLinearNames();
  for (int i = 0; i < kNumLinears; ++i)
    if (names[i] == rel) return i;
  return -1;
}

std::string Describe(const AwqMapping& m) {
  std::string s = m.prev_op + " -> ";
  for (size_t i = 0; i < m.layers.size(); ++i) s += (i ? "/" : "") + m.layers[i];
  return s;
}

// A mapping resolved to projection indices.
struct Resolved {
  AwqMapping mapping;
  int prev_norm = 0;       // 1 = input_layernorm, 2 = post_attention_layernorm, 0 = a Linear
  int prev_linear = -1;
  std::vector<int> balance;
  Src src = Src::kAttnIn;  // input of the balance layers (statistic)
  std::string inspect;     // "self_attn" | "mlp" | "linear"
  int inspect_linear = -1;
};

Result<Resolved> ResolveMapping(const AwqMapping& m) {
  Resolved r;
  r.mapping = m;
  const std::string what = "AWQ scaling_layers entry " + Describe(m);
  if (m.layers.empty()) return MakeError(what, ": \"layers\" is empty");
  for (const auto& l : m.layers) {
    const int i = LinearIndex(l);
    if (i < 0) return MakeError(what, ": unknown layer \"", l, "\" (expected self_attn.{q,k,v,o}_proj or mlp.{gate,up,down}_proj)");
    if (!r.balance.empty() && SourceOf(i) != SourceOf(r.balance[0]))
      return MakeError(what, ": layers ", m.layers[0], " and ", l, " do not take the same input");
    r.balance.push_back(i);
  }
  r.src = SourceOf(r.balance[0]);
  if (!m.inp.empty()) {
    const int i = LinearIndex(m.inp);
    if (i < 0 || SourceOf(i) != r.src) return MakeError(what, ": inp \"", m.inp, "\" does not take the balance layers' input");
  }
  Src feeds;
  if (m.prev_op == "input_layernorm") { r.prev_norm = 1; feeds = Src::kAttnIn; }
  else if (m.prev_op == "post_attention_layernorm") { r.prev_norm = 2; feeds = Src::kMlpIn; }
  else if (m.prev_op == "self_attn.v_proj") { r.prev_linear = kV; feeds = Src::kAttnConcat; }
  else if (m.prev_op == "mlp.up_proj") { r.prev_linear = kUp; feeds = Src::kMlpAct; }
  else return MakeError(what, ": prev_op \"", m.prev_op, "\" is not supported (input_layernorm, post_attention_layernorm, "
                        "self_attn.v_proj, mlp.up_proj: the ops whose output feeds projections linearly)");
  if (feeds != r.src) return MakeError(what, ": prev_op ", m.prev_op, " does not feed ", m.layers[0]);
  const bool attn = r.src == Src::kAttnIn || r.src == Src::kAttnConcat;
  if (m.module2inspect.empty()) {
    if (r.balance.size() == 1) { r.inspect = "linear"; r.inspect_linear = r.balance[0]; }
    else r.inspect = attn ? "self_attn" : "mlp";
  } else if (m.module2inspect == "self_attn" || m.module2inspect == "mlp") {
    if ((m.module2inspect == "self_attn") != attn)
      return MakeError(what, ": module2inspect \"", m.module2inspect, "\" does not contain the balance layers");
    r.inspect = m.module2inspect;
  } else if (r.balance.size() == 1 && m.module2inspect == m.layers[0]) {
    r.inspect = "linear";
    r.inspect_linear = r.balance[0];
  } else {
    return MakeError(what, ": module2inspect \"", m.module2inspect, "\" is not supported (self_attn, mlp, or the single layer)");
  }
  return r;
}

struct Layer {
  std::vector<float> ln1, ln2;
  DType ln1_dtype = DType::kF32, ln2_dtype = DType::kF32;
  std::array<std::shared_ptr<std::vector<float>>, kNumLinears> w;
  std::array<std::vector<float>, kNumLinears> bias;
  std::array<int64_t, kNumLinears> n{}, k{};
  std::array<std::optional<WeightQuantSpec>, kNumLinears> spec;
  std::array<DType, kNumLinears> dtype{};

  Layer Clone() const {
    Layer c = *this;
    for (auto& p : c.w) p = std::make_shared<std::vector<float>>(*p);
    return c;
  }
};

using Linears = std::array<std::unique_ptr<Linear>, kNumLinears>;

Linears MakeLinears(const Layer& L) {
  Linears out;
  for (int i = 0; i < kNumLinears; ++i) out[i] = std::make_unique<DenseLinear>(L.n[i], L.k[i], L.w[i], L.bias[i]);
  return out;
}

struct Acts {
  std::vector<float> xn1, concat, h, xn2, act, out;
  const float* Of(Src s) const {
    switch (s) {
      case Src::kAttnIn: return xn1.data();
      case Src::kAttnConcat: return concat.data();
      case Src::kMlpIn: return xn2.data();
      default: return act.data();
    }
  }
};

struct Ctx {
  const ModelConfig* c;
  std::vector<float> rope_cos, rope_sin;
  int64_t t = 0;
};

// Stages 1 (xn1) and, when stage >= 2, 2 (concat, h) of RunLayer.
void RunAttentionStages(const Ctx& ctx, const Layer& L, const Linears& lin, const float* x, int64_t batch, int stage,
                        Acts* a) {
  const ModelConfig& c = *ctx.c;
  const int64_t rows = batch * ctx.t, h = c.hidden_size;
  a->xn1.resize(rows * h);
  RmsNorm(x, L.ln1.data(), rows, h, c.rms_norm_eps, a->xn1.data());
  if (stage < 2) return;
  a->concat.resize(rows * c.num_attention_heads * c.head_dim);
  a->h.resize(rows * h);
  AttentionBlockForward(c, *lin[kQ], *lin[kK], *lin[kV], *lin[kO], ctx.rope_cos.data(), ctx.rope_sin.data(), a->xn1.data(),
                        batch, ctx.t, a->h.data(), a->concat.data());
  AddInPlace(a->h.data(), x, rows * h);
}

// Runs one decoder layer on x [batch*t, H] up to `stage`: 1 xn1; 2 concat, h; 3 xn2; 4 act, out.
// attn_valid: a->xn1, concat and h already hold this layer's stages 1-2 for x and the current
// input_layernorm / q / k / v / o weights (a previous call computed them and nothing they depend
// on changed since), so a call with stage >= 3 starts at xn2 — the same values a full run gives.
void RunLayer(const Ctx& ctx, const Layer& L, const Linears& lin, const float* x, int64_t batch, int stage, Acts* a,
              bool attn_valid = false) {
  const ModelConfig& c = *ctx.c;
  const int64_t rows = batch * ctx.t, h = c.hidden_size;
  if (!(attn_valid && stage >= 3)) RunAttentionStages(ctx, L, lin, x, batch, stage, a);
  if (stage < 3) return;
  a->xn2.resize(rows * h);
  RmsNorm(a->h.data(), L.ln2.data(), rows, h, c.rms_norm_eps, a->xn2.data());
  if (stage < 4) return;
  a->act.resize(rows * c.intermediate_size);
  a->out.resize(rows * h);
  MlpBlockForward(*lin[kGate], *lin[kUp], *lin[kDown], a->xn2.data(), rows, a->out.data(), a->act.data());
  AddInPlace(a->out.data(), a->h.data(), rows * h);
}

// Whether applying mapping r rescales input_layernorm or a q / k / v / o weight (its prev_op or a
// balance layer): RunLayer's attention stages must then be recomputed.
bool ChangesAttention(const Resolved& r) {
  auto attn = [](int i) { return i == kQ || i == kK || i == kV || i == kO; };
  if (r.prev_norm == 1 || (r.prev_norm == 0 && attn(r.prev_linear))) return true;
  for (int i : r.balance)
    if (attn(i)) return true;
  return false;
}

int StageFor(Src s) {
  switch (s) {
    case Src::kAttnIn: return 1;
    case Src::kAttnConcat: return 2;
    case Src::kMlpIn: return 3;
    default: return 4;
  }
}

// Σ (a − b)² / n over fixed blocks of 4096 (double partials summed in block order).
double Mse(const float* a, const float* b, int64_t n) {
  const int64_t blocks = (n + 4095) / 4096;
  std::vector<double> part(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t bl = 0; bl < blocks; ++bl) {
    const int64_t e = std::min(n, (bl + 1) * 4096);
    part[bl] = SquaredErrorSum(a + bl * 4096, b + bl * 4096, e - bl * 4096);
  }
  double s = 0;
  for (double p : part) s += p;
  return s / static_cast<double>(n);
}

// G = XᵀX [k, k] for x [rows, k]: for a single inspected linear, the squared output error of a
// candidate Ŵ over all rows is Σ_rows ||x (Ŵ − W)ᵀ||² = Σ_n d_n G d_nᵀ (d = Ŵ − W), so the
// search needs one pass over the activations instead of one per candidate. Each 64-column block
// of G is the double sum, in chunk order, of fp32 products over fixed 2048-row chunks (rounded to
// fp32 at the end): blocks run in parallel, and every element's arithmetic is the same for any
// thread count.
std::vector<float> GramMatrix(const float* x, int64_t rows, int64_t k) {
  constexpr int64_t kCols = 64, kChunk = 2048;
  const int64_t blocks = (k + kCols - 1) / kCols;
  std::vector<float> g(static_cast<size_t>(k * k));
#pragma omp parallel
  {
    std::vector<float> part(static_cast<size_t>(k * kCols));
    std::vector<double> acc(part.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kCols, w = std::min(kCols, k - c0);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t r0 = 0; r0 < rows; r0 += kChunk) {
        const int64_t nr = std::min(kChunk, rows - r0);
        SgemmAtB(k, w, nr, x + r0 * k, k, x + r0 * k + c0, k, 0.0f, part.data(), w);
        for (int64_t i = 0; i < k * w; ++i) acc[i] += part[i];
      }
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < w; ++j) g[i * k + c0 + j] = static_cast<float>(acc[i * w + j]);
    }
  }
  return g;
}

// Σ_n d_n G d_nᵀ with d = wq − w [n, k] and G = GramMatrix: the summed squared output error of
// the linear with weights wq against w. Fixed 32-row blocks of d (their products in fp32, the
// quadratic form in double, blocks added in order): the same value for any thread count.
double GramSquaredError(const std::vector<float>& g, const std::vector<float>& w, const std::vector<float>& wq, int64_t n,
                        int64_t k) {
  constexpr int64_t kRows = 32;
  const int64_t blocks = (n + kRows - 1) / kRows;
  std::vector<double> part(static_cast<size_t>(blocks));
#pragma omp parallel
  {
    std::vector<float> d(static_cast<size_t>(kRows * k)), dg(d.size());
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kRows, nr = std::min(kRows, n - r0);
      for (int64_t i = 0; i < nr * k; ++i) d[i] = wq[r0 * k + i] - w[r0 * k + i];
      SgemmXWt(nr, k, k, d.data(), k, g.data(), k, 0.0f, dg.data(), k);
      double s = 0;
      for (int64_t i = 0; i < nr * k; ++i) s += static_cast<double>(d[i]) * dg[i];
      part[b] = s;
    }
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

// Per-channel mean |x| of x [rows, cols], fp32 result of double sums in fixed row blocks.
std::vector<float> ChannelAbsMean(const float* x, int64_t rows, int64_t cols) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<double> part(static_cast<size_t>(blocks * cols), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t bl = 0; bl < blocks; ++bl) {
    double* p = part.data() + bl * cols;
    const int64_t e = std::min(rows, (bl + 1) * kRowBlock);
    for (int64_t r = bl * kRowBlock; r < e; ++r)
      for (int64_t c = 0; c < cols; ++c) p[c] += std::fabs(x[r * cols + c]);
  }
  std::vector<float> m(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0;
    for (int64_t bl = 0; bl < blocks; ++bl) s += part[bl * cols + c];
    m[c] = static_cast<float>(s / static_cast<double>(rows));
  }
  return m;
}

// llm-compressor _compute_layer_means: |W| / (group max + 1e-6), summed over rows of all balance
// layers, divided by the total row count.
std::vector<float> WeightMean(const Layer& L, const std::vector<int>& balance) {
  const int64_t k = L.k[balance[0]];
  std::vector<double> sum(static_cast<size_t>(k), 0.0);
  int64_t rows = 0;
  for (int i : balance) {
    const int64_t g = L.spec[i] ? L.spec[i]->EffectiveGroupSize(k) : k;
    const float* w = L.w[i]->data();
    for (int64_t r = 0; r < L.n[i]; ++r) {
      for (int64_t g0 = 0; g0 < k; g0 += g) {
        const int64_t g1 = std::min(k, g0 + g);
        float mx = 0;
        for (int64_t c = g0; c < g1; ++c) mx = std::max(mx, std::fabs(w[r * k + c]));
        const float den = mx + 1e-6f;
        for (int64_t c = g0; c < g1; ++c) sum[c] += std::fabs(w[r * k + c]) / den;
      }
    }
    rows += L.n[i];
  }
  std::vector<float> m(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) m[c] = static_cast<float>(sum[c] / static_cast<double>(rows));
  return m;
}

std::vector<std::pair<double, bool>> Grid(const std::string& duo, int64_t n_grid) {
  std::vector<std::pair<double, bool>> g;
  if (duo == "true") {
    g.emplace_back(0.0, false);
    for (int64_t i = 0; i <= n_grid - 2; ++i) g.emplace_back(static_cast<double>(i) / static_cast<double>(n_grid - 2), true);
  } else if (duo == "false") {
    for (int64_t i = 0; i < n_grid; ++i) g.emplace_back(static_cast<double>(i) / static_cast<double>(n_grid - 1), false);
  } else {
    const int64_t n = n_grid / 2;
    for (int64_t i = 0; i < n; ++i) {
      const double r = static_cast<double>(i) / static_cast<double>(n - 1);
      g.emplace_back(r, false);
      g.emplace_back(r, true);
    }
  }
  return g;
}

std::vector<float> Scales(const std::vector<float>& x_mean, const std::vector<float>& w_mean, double ratio, bool duo) {
  const size_t n = x_mean.size();
  std::vector<float> s(n);
  const float r = static_cast<float>(ratio), r1 = static_cast<float>(1.0 - ratio);
  for (size_t c = 0; c < n; ++c) {
    const float v = duo ? std::pow(x_mean[c], r) / (std::pow(w_mean[c], r1) + 1e-4f) : std::pow(x_mean[c], r);
    s[c] = std::max(v, 1e-4f);
  }
  float mx = s[0], mn = s[0];
  for (float v : s) { mx = std::max(mx, v); mn = std::min(mn, v); }
  const float norm = std::sqrt(mx * mn);
  for (auto& v : s) {
    v = v / norm;
    if (!std::isfinite(v)) v = 1.0f;
  }
  return s;
}

bool FitsDType(float v, DType t) { return std::isfinite(RoundToDType(v, t)); }

// Q(W) dequantized, or an error (scale overflow, non-finite weight).
Result<std::vector<float>> QuantDequant(const std::vector<float>& w, int64_t n, int64_t k, const WeightQuantSpec& spec, DType dt) {
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix q, QuantizeRtnRef(w.data(), n, k, spec, dt));
  std::vector<float> d(w.size());
  DequantizeRef(q, d.data());
  return d;
}

constexpr int64_t kChunkRows = 2048;  // rows per inspect chunk (keeps temporaries in cache)

// Runs the inspected module of `r` with linears `lin` on sequences [b0, b0 + nb) of `a`;
// out gets [nb * t, out_dim].
void InspectChunk(const Ctx& ctx, const Resolved& r, const Linears& lin, const Acts& a, int64_t b0, int64_t nb, float* out) {
  const ModelConfig& c = *ctx.c;
  const int64_t rows = nb * ctx.t, r0 = b0 * ctx.t;
  if (r.inspect == "self_attn") {
    AttentionBlockForward(c, *lin[kQ], *lin[kK], *lin[kV], *lin[kO], ctx.rope_cos.data(), ctx.rope_sin.data(),
                          a.xn1.data() + r0 * c.hidden_size, nb, ctx.t, out, nullptr);
  } else if (r.inspect == "mlp") {
    MlpBlockForward(*lin[kGate], *lin[kUp], *lin[kDown], a.xn2.data() + r0 * c.hidden_size, rows, out, nullptr);
  } else {
    const int i = r.inspect_linear;
    lin[i]->Forward(a.Of(SourceOf(i)) + r0 * lin[i]->in_features(), rows, out);
  }
}

int64_t InspectOutDim(const ModelConfig& c, const Resolved& r, const Linears& lin) {
  return r.inspect == "linear" ? lin[r.inspect_linear]->out_features() : c.hidden_size;
}

// The inspected module runs over all sequences in chunks of kChunkRows rows. Chunks run in
// parallel, one per thread (the kernels inside see a single thread: nested OpenMP regions are
// inactive) — one barrier per call instead of one per GEMM and attention step; every chunk's
// arithmetic, and the order its partial sums are added in, is the same for any thread count.
struct Chunking {
  int64_t od = 0, seqs = 0, chunks = 0;  // output width, sequences per chunk, chunk count
};

Chunking ChunkingFor(const Ctx& ctx, const Resolved& r, const Linears& lin, int64_t batch) {
  Chunking c;
  c.od = InspectOutDim(*ctx.c, r, lin);
  c.seqs = std::max<int64_t>(1, kChunkRows / ctx.t);
  c.chunks = (batch + c.seqs - 1) / c.seqs;
  return c;
}

// The fp reference: the inspected module's output for every sequence, [batch * t, od].
std::vector<float> InspectReference(const Ctx& ctx, const Resolved& r, const Linears& lin, const Acts& a, int64_t batch) {
  const Chunking c = ChunkingFor(ctx, r, lin, batch);
  std::vector<float> out(static_cast<size_t>(batch * ctx.t * c.od));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ci = 0; ci < c.chunks; ++ci) {
    const int64_t b0 = ci * c.seqs;
    InspectChunk(ctx, r, lin, a, b0, std::min(c.seqs, batch - b0), out.data() + b0 * ctx.t * c.od);
  }
  return out;
}

// MSE of the inspected module's output with linears `lin` against `reference` (InspectReference).
// The loss is a sum of non-negative per-chunk squared errors, so once the chunks computed so far
// (in whatever order the threads finish them) add up to more than `stop_above` (a sum of squared
// errors, not a mean), the full loss must exceed it too: the remaining chunks are skipped and
// nullopt returned. stop_above = +inf (the default) computes every chunk. A finished loss is the
// same value (chunk parts added in chunk order) whether or not a stop was armed.
std::optional<double> InspectLoss(const Ctx& ctx, const Resolved& r, const Linears& lin, const Acts& a, int64_t batch,
                                  const std::vector<float>& reference,
                                  double stop_above = std::numeric_limits<double>::infinity()) {
  const Chunking c = ChunkingFor(ctx, r, lin, batch);
  std::vector<double> part(static_cast<size_t>(c.chunks));
  double done_sum = 0;  // parts finished so far, in completion order (only for the stop test)
  bool stopped = false;
#pragma omp parallel
  {
    std::vector<float> y(static_cast<size_t>(std::min(c.seqs, batch) * ctx.t * c.od));
#pragma omp for schedule(dynamic, 1)
    for (int64_t ci = 0; ci < c.chunks; ++ci) {
      bool skip;
#pragma omp atomic read
      skip = stopped;
      if (skip) continue;
      const int64_t b0 = ci * c.seqs, nb = std::min(c.seqs, batch - b0);
      InspectChunk(ctx, r, lin, a, b0, nb, y.data());
      const int64_t n = nb * ctx.t * c.od;
      const double p = Mse(reference.data() + b0 * ctx.t * c.od, y.data(), n) * static_cast<double>(n);
      part[static_cast<size_t>(ci)] = p;
#pragma omp critical(nibble_awq_loss_stop)
      {
        done_sum += p;
        // A NaN or infinite part never stops the search: the full loss is then non-finite and
        // the candidate is counted as rejected, as without the stop. (A candidate stopped before
        // it reaches such a part counts as stopped, not rejected; neither is chosen.)
        if (std::isfinite(done_sum) && done_sum > stop_above) {
#pragma omp atomic write
          stopped = true;
        }
      }
    }
  }
  if (stopped) return std::nullopt;
  double sum = 0;
  for (double p : part) sum += p;
  return sum / static_cast<double>(batch * ctx.t * c.od);
}

// The grid search of one mapping; applies the best scales to L. Returns the report.
Result<AwqMappingReport> SearchAndApply(const Ctx& ctx, const Resolved& r, Layer& L, const Acts& a, int64_t batch,
                                        const AwqSettings& st, const std::string& layer_name) {
  AwqMappingReport rep;
  rep.mapping = r.mapping;
  const int64_t rows = batch * ctx.t;
  const int64_t kin = L.k[r.balance[0]];
  const std::vector<float> x_mean = ChannelAbsMean(a.Of(r.src), rows, kin);
  const std::vector<float> w_mean = WeightMean(L, r.balance);
  Linears base = MakeLinears(L);
  const int64_t y_dim = InspectOutDim(*ctx.c, r, base);
  // A single inspected linear is scored through the Gram matrix of its inputs (GramMatrix): the
  // same squared error, without a pass over the activations per candidate. Modules run per
  // candidate against their fp output.
  const bool gram = st.gram_linear_loss && r.inspect == "linear";
  const std::vector<float> g = gram ? GramMatrix(a.Of(SourceOf(r.inspect_linear)), rows, kin) : std::vector<float>{};
  const std::vector<float> y_fp = gram ? std::vector<float>{} : InspectReference(ctx, r, base, a, batch);

  double best = std::numeric_limits<double>::infinity();
  std::vector<float> best_s;
  bool first = true;
  for (const auto& [ratio, duo] : Grid(st.duo_scaling, st.n_grid)) {
    const std::vector<float> s = Scales(x_mean, w_mean, ratio, duo);
    bool ok = true;
    // Values that will be stored in float must fit their dtype.
    if (r.prev_norm != 0) {
      const auto& ln = r.prev_norm == 1 ? L.ln1 : L.ln2;
      const DType dt = r.prev_norm == 1 ? L.ln1_dtype : L.ln2_dtype;
      for (int64_t c = 0; c < kin && ok; ++c) ok = FitsDType(ln[c] / s[c], dt);
    } else if (!L.spec[r.prev_linear]) {
      const int p = r.prev_linear;
      const int64_t off = L.n[p] - kin;
      for (int64_t row = 0; row < kin && ok; ++row)
        for (int64_t c = 0; c < L.k[p] && ok; ++c) ok = FitsDType((*L.w[p])[(off + row) * L.k[p] + c] / s[row], L.dtype[p]);
    }
    Linears cand = MakeLinears(L);
    // gram: Ŵ of the inspected linear (its current weight unless it is quantized below)
    std::shared_ptr<const std::vector<float>> inspected_w = gram ? L.w[r.inspect_linear] : nullptr;
    for (int i : r.balance) {
      if (!ok) break;
      const int64_t n = L.n[i], k = L.k[i];
      std::vector<float> ws(*L.w[i]);
      for (int64_t row = 0; row < n; ++row)
        for (int64_t c = 0; c < k; ++c) ws[row * k + c] *= s[c];
      if (!L.spec[i]) {
        for (int64_t j = 0; j < n * k && ok; ++j) ok = FitsDType(ws[j], L.dtype[i]);
        continue;
      }
      auto dq = QuantDequant(ws, n, k, *L.spec[i], L.dtype[i]);
      if (!dq.ok()) { ok = false; break; }
      for (int64_t row = 0; row < n; ++row)
        for (int64_t c = 0; c < k; ++c) (*dq)[row * k + c] /= s[c];
      auto wq = std::make_shared<const std::vector<float>>(std::move(dq).value());
      if (gram && i == r.inspect_linear) inspected_w = wq;
      cand[i] = std::make_unique<DenseLinear>(n, k, std::move(wq), L.bias[i]);
    }
    double loss = std::numeric_limits<double>::infinity();
    if (ok && gram) {
      const int i = r.inspect_linear;
      loss = GramSquaredError(g, *L.w[i], *inspected_w, L.n[i], kin) / static_cast<double>(rows * y_dim);
    } else if (ok) {
      // Stop a candidate as soon as its partial squared error exceeds the best loss so far (by a
      // margin far above rounding): it cannot win, so the choice — and every output byte — is
      // that of the full search, for a fraction of the forwards of the worse candidates.
      const double stop_above = st.early_stop && std::isfinite(best)
                                    ? best * static_cast<double>(rows * y_dim) * (1 + 1e-9)
                                    : std::numeric_limits<double>::infinity();
      const std::optional<double> l = InspectLoss(ctx, r, cand, a, batch, y_fp, stop_above);
      if (!l) {  // (best is finite, so this is not the first candidate)
        ++rep.stopped_early;
        continue;
      }
      loss = *l;
    }
    if (first) rep.loss_rtn = loss;
    first = false;
    if (!std::isfinite(loss)) { ++rep.rejected; continue; }
    if (loss < best) {
      best = loss;
      best_s = s;
      rep.ratio = ratio;
      rep.duo = duo;
    }
  }
  if (best_s.empty())
    return MakeError(layer_name, ": AWQ mapping ", Describe(r.mapping), ": no grid candidate has a finite loss");
  rep.loss_best = best;
  rep.scale_min = *std::min_element(best_s.begin(), best_s.end());
  rep.scale_max = *std::max_element(best_s.begin(), best_s.end());
  // Apply: balance columns × s; prev_op ÷ s.
  for (int i : r.balance) {
    auto& w = *L.w[i];
    for (int64_t row = 0; row < L.n[i]; ++row)
      for (int64_t c = 0; c < kin; ++c) w[row * kin + c] *= best_s[c];
  }
  if (r.prev_norm != 0) {
    auto& ln = r.prev_norm == 1 ? L.ln1 : L.ln2;
    const DType dt = r.prev_norm == 1 ? L.ln1_dtype : L.ln2_dtype;
    for (int64_t c = 0; c < kin; ++c) ln[c] = RoundToDType(ln[c] / best_s[c], dt);
  } else {
    const int p = r.prev_linear;
    auto& w = *L.w[p];
    const int64_t off = L.n[p] - kin, kp = L.k[p];
    for (int64_t row = 0; row < kin; ++row) {
      for (int64_t c = 0; c < kp; ++c) w[(off + row) * kp + c] /= best_s[row];
      if (!L.bias[p].empty()) L.bias[p][off + row] /= best_s[row];
    }
    if (!L.spec[p])  // stored in float: round to its dtype now so the search below sees what is stored
      for (auto& v : w) v = RoundToDType(v, L.dtype[p]);
  }
  return rep;
}

// AutoAWQ clip search for linear i with inputs x [rows, K] (SPEC §2.3), on Quark RTN.
Status ClipLinear(Layer& L, int i, const float* x, int64_t rows) {
  const int64_t n = L.n[i], k = L.k[i];
  const int64_t g = L.spec[i]->EffectiveGroupSize(k), groups = k / g;
  const int64_t step = std::max<int64_t>(1, rows / kClipTokens);
  std::vector<float> xs;
  for (int64_t r = 0; r < rows; r += step) xs.insert(xs.end(), x + r * k, x + (r + 1) * k);
  const int64_t ts = static_cast<int64_t>(xs.size()) / k;
  const std::vector<float> w = *L.w[i];
  std::vector<float> org_max(static_cast<size_t>(n * groups)), best_max(org_max.size());
  std::vector<double> best_err(org_max.size(), std::numeric_limits<double>::infinity());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < groups; ++gi) {
      float m = 0;
      for (int64_t c = gi * g; c < (gi + 1) * g; ++c) m = std::max(m, std::fabs(w[r * k + c]));
      org_max[r * groups + gi] = m;
    }
  std::vector<float> wc(w.size()), e(static_cast<size_t>(ts * n));
  for (int64_t is = 0; is < 10; ++is) {  // int(max_shrink 0.5 · n_grid 20)
    const float f = 1.0f - static_cast<float>(is) / 20.0f;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float mv = org_max[r * groups + gi] * f;
        for (int64_t c = gi * g; c < (gi + 1) * g; ++c) wc[r * k + c] = std::clamp(w[r * k + c], -mv, mv);
      }
    auto dq = QuantDequant(wc, n, k, *L.spec[i], L.dtype[i]);
    if (!dq.ok()) continue;
    for (size_t j = 0; j < w.size(); ++j) (*dq)[j] -= w[j];
    for (int64_t gi = 0; gi < groups; ++gi) {
      SgemmXWt(ts, n, g, xs.data() + gi * g, k, dq->data() + gi * g, k, 0.0f, e.data(), n);
      for (int64_t r = 0; r < n; ++r) {
        double s = 0;
        for (int64_t t = 0; t < ts; ++t) s += static_cast<double>(e[t * n + r]) * e[t * n + r];
        s /= static_cast<double>(ts);
        if (s < best_err[r * groups + gi]) {
          best_err[r * groups + gi] = s;
          best_max[r * groups + gi] = org_max[r * groups + gi] * f;
        }
      }
    }
  }
  auto& out = *L.w[i];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < groups; ++gi) {
      if (!std::isfinite(best_err[r * groups + gi])) continue;
      const float mv = best_max[r * groups + gi];
      for (int64_t c = gi * g; c < (gi + 1) * g; ++c) out[r * k + c] = std::clamp(out[r * k + c], -mv, mv);
    }
  return Status::Ok();
}

// ||X·Wᵀ − X·Ŵᵀ||² / ||X·Wᵀ||² on rows of x.
double RelOutputError(const float* x, int64_t rows, const std::vector<float>& w, const std::vector<float>& wq, int64_t n,
                      int64_t k) {
  std::vector<float> y(rows * n), yq(rows * n);
  SgemmXWt(rows, n, k, x, k, w.data(), k, 0.0f, y.data(), n);
  SgemmXWt(rows, n, k, x, k, wq.data(), k, 0.0f, yq.data(), n);
  const std::vector<float> zero(y.size(), 0.0f);
  const double den = Mse(y.data(), zero.data(), static_cast<int64_t>(y.size()));
  return den > 0 ? Mse(y.data(), yq.data(), static_cast<int64_t>(y.size())) / den : 0.0;
}

}  // namespace

std::vector<AwqMapping> DefaultLlamaScalingLayers() {
  return {{"input_layernorm", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, "self_attn.q_proj", "self_attn"},
          {"self_attn.v_proj", {"self_attn.o_proj"}, "self_attn.o_proj", ""},
          {"post_attention_layernorm", {"mlp.gate_proj", "mlp.up_proj"}, "mlp.gate_proj", "mlp"},
          {"mlp.up_proj", {"mlp.down_proj"}, "mlp.down_proj", ""}};
}

Result<std::optional<AwqSettings>> ParseAwqAlgoConfig(const nlohmann::ordered_json& algo_config, const AwqSettings& defaults) {
  if (algo_config.is_null()) return std::optional<AwqSettings>{};
  nlohmann::ordered_json list = algo_config.is_array() ? algo_config : nlohmann::ordered_json::array({algo_config});
  for (size_t e = 0; e < list.size(); ++e) {
    const auto& j = list[e];
    const std::string where = "algo_config[" + std::to_string(e) + "]";
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>() != "awq") continue;
    AwqSettings s = defaults;
    if (j.contains("scaling_layers") && !j["scaling_layers"].is_null()) {
      if (!j["scaling_layers"].is_array()) return MakeError(where, ".scaling_layers: expected a list");
      s.scaling_layers.clear();
      for (size_t i = 0; i < j["scaling_layers"].size(); ++i) {
        const auto& m = j["scaling_layers"][i];
        const std::string w = where + ".scaling_layers[" + std::to_string(i) + "]";
        if (!m.is_object()) return MakeError(w, ": expected an object");
        if (!m.contains("prev_op") || !m["prev_op"].is_string()) return MakeError(w, ".prev_op: expected a string");
        AwqMapping mp;
        mp.prev_op = m["prev_op"].get<std::string>();
        if (!m.contains("layers") || !m["layers"].is_array() || m["layers"].empty())
          return MakeError(w, ".layers: expected a non-empty list of strings");
        for (const auto& l : m["layers"]) {
          if (!l.is_string()) return MakeError(w, ".layers: expected a non-empty list of strings");
          mp.layers.push_back(l.get<std::string>());
        }
        if (m.contains("inp") && !m["inp"].is_null()) {
          if (!m["inp"].is_string()) return MakeError(w, ".inp: expected a string");
          mp.inp = m["inp"].get<std::string>();
        }
        if (m.contains("module2inspect") && !m["module2inspect"].is_null()) {
          if (!m["module2inspect"].is_string()) return MakeError(w, ".module2inspect: expected a string or null");
          mp.module2inspect = m["module2inspect"].get<std::string>();
        }
        s.scaling_layers.push_back(mp);
      }
    }
    if (j.contains("duo_scaling")) {
      const auto& d = j["duo_scaling"];
      if (d.is_boolean()) s.duo_scaling = d.get<bool>() ? "true" : "false";
      else if (d.is_string() && (d == "both" || d == "true" || d == "false")) s.duo_scaling = d.get<std::string>();
      else return MakeError(where, ".duo_scaling: expected true, false or \"both\"");
    }
    if (j.contains("n_grid")) {
      if (!j["n_grid"].is_number_integer() || j["n_grid"].get<int64_t>() < 2) return MakeError(where, ".n_grid: expected an integer >= 2");
      s.n_grid = j["n_grid"].get<int64_t>();
    }
    if (s.duo_scaling == "both" && s.n_grid < 4) return MakeError(where, ".n_grid: duo_scaling \"both\" needs n_grid >= 4");
    if (j.contains("clip")) {
      if (!j["clip"].is_boolean()) return MakeError(where, ".clip: expected a boolean");
      s.clip = j["clip"].get<bool>();
    }
    if (j.contains("propagation")) {
      if (j["propagation"] == "fp") s.propagation = AwqPropagation::kFp;
      else if (j["propagation"] == "quantized") s.propagation = AwqPropagation::kQuantized;
      else return MakeError(where, ".propagation: expected \"fp\" or \"quantized\"");
    }
    return std::optional<AwqSettings>(s);
  }
  return std::optional<AwqSettings>{};
}

nlohmann::ordered_json AwqAlgoConfigJson(const AwqSettings& s, const std::vector<AwqMapping>& used, const ModelConfig& mc) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& m : used) {
    nlohmann::ordered_json e;
    e["prev_op"] = m.prev_op;
    e["layers"] = m.layers;
    e["inp"] = m.inp.empty() ? m.layers[0] : m.inp;
    if (!m.module2inspect.empty()) e["module2inspect"] = m.module2inspect;
    layers.push_back(e);
  }
  nlohmann::ordered_json a;
  a["name"] = "awq";
  a["scaling_layers"] = layers;
  a["model_decoder_layers"] = "model.layers";
  a["num_attention_heads"] = mc.num_attention_heads;
  a["num_key_value_heads"] = mc.num_key_value_heads;
  if (s.duo_scaling == "both") a["duo_scaling"] = "both";
  else a["duo_scaling"] = s.duo_scaling == "true";
  a["n_grid"] = s.n_grid;
  a["clip"] = s.clip;
  a["propagation"] = s.propagation == AwqPropagation::kFp ? "fp" : "quantized";
  return nlohmann::ordered_json::array({a});
}

Result<AwqResult> RunAwq(const ModelConfig& mc, const TensorStore& store, const QuarkQuantConfig& cfg,
                         const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len, const AwqSettings& st,
                         const AwqTensorSink& sink, const std::function<void(int64_t, int64_t)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (batch < 1 || seq_len < 1 || static_cast<int64_t>(tokens.size()) != batch * seq_len)
    return MakeError("AWQ: calibration tokens (", tokens.size(), ") do not form ", batch, " x ", seq_len);
  if (seq_len > mc.max_position_embeddings)
    return MakeError("AWQ: calibration seq_len ", seq_len, " exceeds max_position_embeddings ", mc.max_position_embeddings);
  if (st.duo_scaling != "true" && st.duo_scaling != "false" && st.duo_scaling != "both")
    return MakeError("AWQ: duo_scaling \"", st.duo_scaling, "\" (expected true, false, both)");
  if (st.n_grid < 2 || (st.duo_scaling == "both" && st.n_grid < 4)) return MakeError("AWQ: n_grid ", st.n_grid, " is too small");
  std::vector<Resolved> maps;
  for (const auto& m : st.scaling_layers) {
    NIBBLE_ASSIGN_OR_RETURN(Resolved r, ResolveMapping(m));
    maps.push_back(std::move(r));
  }
  AwqResult res;
  Ctx ctx;
  ctx.c = &mc;
  ctx.t = seq_len;
  BuildRopeTables(mc, seq_len, &ctx.rope_cos, &ctx.rope_sin);
  const int64_t h = mc.hidden_size, rows = batch * seq_len;
  // Embedding rows gathered straight from the (mmap'd) tensor.
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* emb, store.Get("model.embed_tokens.weight"));
  if (emb->shape != std::vector<int64_t>{mc.vocab_size, h} || !IsFloatScaleDType(emb->dtype))
    return MakeError(emb->file, ": tensor ", emb->name, " has shape ", emb->ShapeString(), " / dtype ", DTypeName(emb->dtype),
                     ", expected float [", mc.vocab_size, ", ", h, "]");
  std::vector<float> x(static_cast<size_t>(rows * h));
  const size_t esz = DTypeSize(emb->dtype);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = tokens[r];
    if (id < 0 || id >= mc.vocab_size) return MakeError("AWQ: calibration token id ", id, " outside the vocabulary");
    for (int64_t c = 0; c < h; ++c) x[r * h + c] = LoadFloatAs(emb->data + (static_cast<size_t>(id) * h + c) * esz, emb->dtype);
  }
  const int64_t report_batch = std::min<int64_t>(batch, std::max<int64_t>(1, kReportRows / seq_len));
  const int64_t total_steps = mc.num_hidden_layers * (static_cast<int64_t>(maps.size()) + 1);
  int64_t step = 0;
  std::set<std::string> used_names, messages;
  const auto& lin_names = DecoderLinearNames();
  const int64_t q_dim = mc.num_attention_heads * mc.head_dim, kv_dim = mc.num_key_value_heads * mc.head_dim;
  const std::array<std::pair<int64_t, int64_t>, kNumLinears> shapes = {
      std::pair{q_dim, h}, {kv_dim, h}, {kv_dim, h}, {h, q_dim}, {mc.intermediate_size, h}, {mc.intermediate_size, h},
      {h, mc.intermediate_size}};
  const std::array<bool, kNumLinears> has_bias = {mc.qkv_bias, mc.qkv_bias, mc.qkv_bias, mc.o_bias, mc.mlp_bias, mc.mlp_bias, mc.mlp_bias};

  // One set of calibration activations reused by every mapping and layer (each RunLayer call
  // rewrites the stages it runs): fresh multi-hundred-MB buffers per mapping were page-faulted and
  // zeroed each time (7-8 % of an AWQ run of prose-llama-7m with 128 x 512 tokens).
  Acts work;
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    const auto tl = std::chrono::steady_clock::now();
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    NIBBLE_ASSIGN_OR_RETURN(L.ln1, LoadF32(store, p + "input_layernorm.weight", {h}));
    NIBBLE_ASSIGN_OR_RETURN(L.ln2, LoadF32(store, p + "post_attention_layernorm.weight", {h}));
    L.ln1_dtype = store.Find(p + "input_layernorm.weight")->dtype;
    L.ln2_dtype = store.Find(p + "post_attention_layernorm.weight")->dtype;
    for (int i = 0; i < kNumLinears; ++i) {
      const std::string name = p + lin_names[i];
      L.n[i] = shapes[i].first;
      L.k[i] = shapes[i].second;
      NIBBLE_ASSIGN_OR_RETURN(std::vector<float> w, LoadF32(store, name + ".weight", {L.n[i], L.k[i]}));
      L.w[i] = std::make_shared<std::vector<float>>(std::move(w));
      L.dtype[i] = store.Find(name + ".weight")->dtype;
      if (has_bias[i]) { NIBBLE_ASSIGN_OR_RETURN(L.bias[i], LoadF32(store, name + ".bias", {L.n[i]})); }
      NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig rc, ResolveLayer(cfg, name));
      L.spec[i] = rc.spec;
      if (rc.spec && L.k[i] % rc.spec->EffectiveGroupSize(L.k[i]) != 0)
        return MakeError("layer ", name, ": in_features K = ", L.k[i], " is not divisible by group_size ",
                         rc.spec->EffectiveGroupSize(L.k[i]), " (", rc.rule, ")");
    }
    AwqLayerReport lrep;
    lrep.layer = l;
    const Layer orig = L.Clone();
    bool attn_valid = false;  // work's stages 1-2 are those of x and L's current attention weights
    const bool reuse = st.reuse_attention;
    for (const Resolved& r : maps) {
      AwqMappingReport mr;
      mr.mapping = r.mapping;
      bool any_q = false;
      for (int i : r.balance) any_q = any_q || L.spec[i].has_value();
      if (r.prev_linear >= 0 && L.n[r.prev_linear] < L.k[r.balance[0]]) {
        mr.skipped = true;
        mr.skip_reason = lin_names[r.prev_linear] + " out_features " + std::to_string(L.n[r.prev_linear]) + " != " +
                         r.mapping.layers[0] + " in_features " + std::to_string(L.k[r.balance[0]]) +
                         (mc.num_key_value_heads < mc.num_attention_heads ? " (GQA)" : "");
      } else if (r.prev_linear == kV && L.n[kV] != L.k[kO]) {
        mr.skipped = true;
        mr.skip_reason = "v_proj out_features " + std::to_string(L.n[kV]) + " != o_proj in_features " + std::to_string(L.k[kO]);
      } else if (!any_q) {
        mr.skipped = true;
        mr.skip_reason = "no balance layer is quantized";
      }
      if (mr.skipped) {
        messages.insert("AWQ: skipped scaling_layers entry " + Describe(r.mapping) + ": " + mr.skip_reason +
                        ", as llm-compressor and AutoAWQ do");
      } else {
        const int stage = std::max(StageFor(r.src), r.inspect == "mlp" ? 3 : 1);
        RunLayer(ctx, L, MakeLinears(L), x.data(), batch, stage, &work, attn_valid);
        if (stage >= 2) attn_valid = reuse;
        auto got = SearchAndApply(ctx, r, L, work, batch, st, p.substr(0, p.size() - 1));
        if (!got.ok()) return got.error();
        if (ChangesAttention(r)) attn_valid = false;
        mr = std::move(got).value();
        used_names.insert(Describe(r.mapping));
      }
      lrep.mappings.push_back(mr);
      if (progress) progress(++step, total_steps);
    }
    Acts& fp = work;  // the smoothed layer's activations (attention stages reused while still valid)
    RunLayer(ctx, L, MakeLinears(L), x.data(), batch, 4, &fp, attn_valid);
    std::vector<float> x_next;
    if (st.propagation == AwqPropagation::kFp) x_next = fp.out;
    if (st.clip) {
      for (int i = 0; i < kNumLinears; ++i) {
        if (!L.spec[i] || i == kQ || i == kK) continue;
        NIBBLE_RETURN_IF_ERROR(ClipLinear(L, i, fp.Of(SourceOf(i)), rows));
      }
    }
    // Final RTN (as the exporter will do it) for the report and quantized propagation.
    Layer deq = L.Clone();
    for (int i = 0; i < kNumLinears; ++i) {
      if (!L.spec[i]) continue;
      auto d = QuantDequant(*L.w[i], L.n[i], L.k[i], *L.spec[i], L.dtype[i]);
      if (!d.ok()) return d.error().WithContext("layer " + p + lin_names[i]);
      *deq.w[i] = std::move(d).value();
    }
    if (st.propagation == AwqPropagation::kQuantized) {
      Acts qa;
      RunLayer(ctx, deq, MakeLinears(deq), x.data(), batch, 4, &qa);
      x_next = std::move(qa.out);
    }
    {
      Acts oa;
      RunLayer(ctx, orig, MakeLinears(orig), x.data(), report_batch, 4, &oa);
      const int64_t rr = report_batch * seq_len;
      for (int i = 0; i < kNumLinears; ++i) {
        AwqLinearReport lr;
        lr.name = p + lin_names[i];
        lr.quantized = L.spec[i].has_value();
        if (lr.quantized) {
          auto rq = QuantDequant(*orig.w[i], L.n[i], L.k[i], *L.spec[i], L.dtype[i]);
          if (rq.ok()) lr.rtn_error = RelOutputError(oa.Of(SourceOf(i)), rr, *orig.w[i], *rq, L.n[i], L.k[i]);
          // fp holds the smoothed layer's activations; its first rr rows are the report rows.
          lr.awq_error = RelOutputError(fp.Of(SourceOf(i)), rr, *L.w[i], *deq.w[i], L.n[i], L.k[i]);
        }
        lrep.linears.push_back(lr);
      }
    }
    x = std::move(x_next);
    NIBBLE_RETURN_IF_ERROR(sink(p + "input_layernorm.weight", std::move(L.ln1)));
    NIBBLE_RETURN_IF_ERROR(sink(p + "post_attention_layernorm.weight", std::move(L.ln2)));
    for (int i = 0; i < kNumLinears; ++i) {
      NIBBLE_RETURN_IF_ERROR(sink(p + lin_names[i] + ".weight", std::move(*L.w[i])));
      if (!L.bias[i].empty()) NIBBLE_RETURN_IF_ERROR(sink(p + lin_names[i] + ".bias", std::move(L.bias[i])));
    }
    lrep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
    res.layers.push_back(std::move(lrep));
    if (progress) progress(++step, total_steps);
  }
  for (const auto& r : maps)
    if (used_names.count(Describe(r.mapping))) res.used.push_back(r.mapping);
  res.messages.assign(messages.begin(), messages.end());
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace nibble
