// AWQ grid search (see search.h).
#include "quantize/awq/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include <omp.h>

#include "formats/float_dtype.h"
#include "formats/rtn.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_packed.h"
#include "kernels/vec_ops.h"
#include "model/linear.h"

namespace nibble {

namespace {

constexpr int64_t kChunkRows = kAwqInspectChunkRows;

// llm-compressor _compute_layer_means: |W| / (group max + 1e-6), summed over rows of all balance
// layers, divided by the total row count.
std::vector<float> WeightMean(const CalibLayer& L, const std::vector<int>& balance) {
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

// The candidates (ratio, duo) in llm-compressor's order.
std::vector<std::pair<double, bool>> Grid(DuoScaling duo, int64_t n_grid) {
  std::vector<std::pair<double, bool>> g;
  if (duo == DuoScaling::kTrue) {
    g.emplace_back(0.0, false);
    for (int64_t i = 0; i <= n_grid - 2; ++i) g.emplace_back(static_cast<double>(i) / static_cast<double>(n_grid - 2), true);
  } else if (duo == DuoScaling::kFalse) {
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

// Σ_n d_n G d_nᵀ with d = wq − w [n, k] and G = GramMatrix: the summed squared output error of
// the linear with weights wq against w. Fixed 256-row blocks of d (their products in fp32, the
// quadratic form in double, blocks added in order): the same value for any thread count. (32-row
// blocks ran the sgemm at half its rate.)
double GramSquaredError(const std::vector<float>& g, const std::vector<float>& w, const std::vector<float>& wq, int64_t n,
                        int64_t k) {
  constexpr int64_t kRows = 256;
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

// The capture point the inspected module of `r` reads.
LayerInput InspectInput(const ResolvedMapping& r) {
  if (r.inspect == AwqInspect::kSelfAttn) return LayerInput::kAttnIn;
  if (r.inspect == AwqInspect::kMlp) return LayerInput::kMlpIn;
  return InputOf(r.inspect_linear);
}

// Runs the inspected module of `r` with linears `lin` on sequences [b0, b0 + nb) of `a` (its
// rows widened into `xs` where they are stored in 16 bits); out gets [nb * t, out_dim].
void InspectChunk(const LayerRunner& run, const ResolvedMapping& r, const CalibLayer& L, const CalibLinears& lin,
                  const CapturedRows& a, int64_t b0, int64_t nb, float* out, Workspace& ws, std::vector<float>& xs) {
  const ModelConfig& c = run.config();
  const int64_t rows = nb * run.t(), r0 = b0 * run.t();
  const DecoderLayerView view = ViewOf(L, lin);  // the attention reads L's Qwen3 q/k norms, if any
  const float* x = a.Rows(InspectInput(r), r0, rows, &xs);
  if (r.inspect == AwqInspect::kSelfAttn) {
    AttentionBlockForward(c, view, run.rope(), x, nb, run.t(), nullptr, out, nullptr, ws);
  } else if (r.inspect == AwqInspect::kMlp) {
    MlpBlockForward(view, x, rows, out, nullptr, ws);
  } else {
    lin[r.inspect_linear]->Forward(x, rows, out, &ws);
  }
}

// The inspected module runs over all sequences in chunks of kChunkRows rows. Chunks run in
// parallel, one per thread (the kernels inside see a single thread: nested OpenMP regions are
// inactive) — one barrier per call instead of one per GEMM and attention step; every chunk's
// arithmetic, and the order its partial sums are added in, is the same for any thread count.
struct Chunking {
  int64_t od = 0, seqs = 0, chunks = 0;  // output width, sequences per chunk, chunk count
};

Chunking ChunkingFor(const LayerRunner& run, const ResolvedMapping& r, const CalibLinears& lin) {
  Chunking c;
  c.od = r.inspect == AwqInspect::kLinear ? lin[r.inspect_linear]->out_features() : run.config().hidden_size;
  c.seqs = std::max<int64_t>(1, kChunkRows / run.t());
  c.chunks = (run.batch() + c.seqs - 1) / c.seqs;
  return c;
}

// The fp reference: the inspected module's output for every sequence, [batch * t, od].
std::vector<float> InspectReference(const LayerRunner& run, const ResolvedMapping& r, const CalibLayer& L,
                                    const CalibLinears& lin, const CapturedRows& a,
                                    std::vector<std::vector<float>>& xs) {
  const Chunking c = ChunkingFor(run, r, lin);
  const int64_t batch = run.batch();
  std::vector<float> out(static_cast<size_t>(batch * run.t() * c.od));
  std::vector<Workspace>& ws = run.Workspaces(static_cast<size_t>(omp_get_max_threads()));
  xs.resize(ws.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ci = 0; ci < c.chunks; ++ci) {
    const int64_t b0 = ci * c.seqs;
    const size_t th = static_cast<size_t>(omp_get_thread_num());
    InspectChunk(run, r, L, lin, a, b0, std::min(c.seqs, batch - b0), out.data() + b0 * run.t() * c.od, ws[th], xs[th]);
  }
  return out;
}

// MSE of the inspected module's output with linears `lin` against `reference` (InspectReference).
// The loss is a sum of non-negative per-chunk squared errors, so once the chunks computed so far
// (in whatever order the threads finish them) add up to more than `stop_above` (a sum of squared
// errors, not a mean), the full loss must exceed it too: the remaining chunks are skipped and
// nullopt returned. stop_above = +inf computes every chunk. A finished loss is the same value
// (chunk parts added in chunk order) whether or not a stop was armed. `outs` and `xs`: one chunk's
// output and widened input per thread, kept from candidate to candidate (fresh pages per candidate
// cost a page fault each).
std::optional<double> InspectLoss(const LayerRunner& run, const ResolvedMapping& r, const CalibLayer& L,
                                  const CalibLinears& lin, const CapturedRows& a, const std::vector<float>& reference,
                                  double stop_above, std::vector<std::vector<float>>& outs,
                                  std::vector<std::vector<float>>& xs) {
  const Chunking c = ChunkingFor(run, r, lin);
  const int64_t batch = run.batch(), t = run.t();
  std::vector<double> part(static_cast<size_t>(c.chunks));
  double done_sum = 0;  // parts finished so far, in completion order (only for the stop test)
  bool stopped = false;
  std::vector<Workspace>& ws = run.Workspaces(static_cast<size_t>(omp_get_max_threads()));
  outs.resize(ws.size());
  xs.resize(ws.size());
#pragma omp parallel
  {
    std::vector<float>& y = outs[static_cast<size_t>(omp_get_thread_num())];
    y.resize(static_cast<size_t>(std::min(c.seqs, batch) * t * c.od));
#pragma omp for schedule(dynamic, 1)
    for (int64_t ci = 0; ci < c.chunks; ++ci) {
      bool skip;
#pragma omp atomic read
      skip = stopped;
      if (skip) continue;
      const int64_t b0 = ci * c.seqs, nb = std::min(c.seqs, batch - b0);
      const size_t th = static_cast<size_t>(omp_get_thread_num());
      InspectChunk(run, r, L, lin, a, b0, nb, y.data(), ws[th], xs[th]);
      const int64_t n = nb * t * c.od;
      const double p = Mse(reference.data() + b0 * t * c.od, y.data(), n) * static_cast<double>(n);
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
  return sum / static_cast<double>(batch * t * c.od);
}

// Whether the float-stored values a candidate s changes still fit their dtype: a prev_op norm
// divided by s, or the rows of an unquantized prev_op linear.
bool PrevOpFits(const ResolvedMapping& r, const CalibLayer& L, const std::vector<float>& s, int64_t kin) {
  if (r.prev_op != AwqPrevOp::kLinear) {
    const bool first = r.prev_op == AwqPrevOp::kInputLayernorm;
    const auto& ln = first ? L.ln1 : L.ln2;
    const DType dt = first ? L.ln1_dtype : L.ln2_dtype;
    for (int64_t c = 0; c < kin; ++c)
      if (!FitsDType(ln[c] / s[c], dt)) return false;
    return true;
  }
  const int p = r.prev_linear;
  if (L.spec[p]) return true;
  const int64_t off = L.n[p] - kin;
  for (int64_t row = 0; row < kin; ++row)
    for (int64_t c = 0; c < L.k[p]; ++c)
      if (!FitsDType((*L.w[p])[(off + row) * L.k[p] + c] / s[row], L.dtype[p])) return false;
  return true;
}

// Buffers of the candidate weights, one per balance layer, reused across a mapping's candidates
// (the candidate linears of one candidate are gone before the next is built).
struct CandidateBuffers {
  std::vector<std::shared_ptr<std::vector<float>>> f32;  // Ŵ in fp32
  std::vector<std::vector<uint16_t>> bf16;               // Ŵ as bf16 bits (a bf16 calibration's linears)
};

// Row-wise scratch of CandidateRows.
struct RowScratch {
  std::vector<float> ws, x, mn, mx, sc, inv, z;
  std::vector<int32_t> zp;
  std::vector<uint8_t> codes;
  RowScratch(int64_t k, int64_t groups)
      : ws(k), x(k), mn(groups), mx(groups), sc(groups), inv(groups), z(groups), zp(groups), codes(k) {}
};

// Ŵ = Q(W·s)/s of the [n, k] weight w, row by row (RTN's groups never span rows, so every row is
// the reference's RtnDequant row: the same vectorised RTN passes as quantize/rtn_fast.h, the same
// dequantization as DequantizeRef), rows threaded, into f32 and/or bf16 bits (either may be null).
// False when a value is not finite or a scale overflows `dt` (RtnDequant's errors).
bool CandidateRows(const float* w, int64_t n, int64_t k, const QuantSpec& spec, DType dt, const std::vector<float>& s,
                   float* f32, uint16_t* bf16) {
  if (!CheckRtnArgs(n, k, spec, dt).ok()) return false;
  const int64_t g = spec.EffectiveGroupSize(k), groups = k / g;
  const bool sym = spec.symmetric;
  bool failed = false;
#pragma omp parallel reduction(|| : failed)
  {
    RowScratch t(k, groups);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < n; ++row) {
      if (failed) continue;
      for (int64_t c = 0; c < k; ++c) t.ws[c] = w[row * k + c] * s[c];
      if (!RtnRowRange(reinterpret_cast<const uint8_t*>(t.ws.data()), RowDType::kF32, k, g, t.x.data(), t.mn.data(),
                       t.mx.data())) {
        failed = true;
        continue;
      }
      for (int64_t j = 0; j < groups && !failed; ++j) {
        RtnGroupParams p;
        if (!RtnGroupOf(t.mn[j], t.mx[j], sym, dt, &p)) failed = true;
        t.sc[j] = p.s;
        t.inv[j] = p.inv;
        t.z[j] = p.z;
        t.zp[j] = sym ? 8 : static_cast<int>(p.z);
      }
      if (failed) continue;
      double num = 0, den = 0;
      RtnRowCodes(t.x.data(), k, g, t.sc.data(), t.inv.data(), t.z.data(), sym, t.codes.data(), &num, &den);
      // (t.x, the row's values, is free once its codes are made.)
      float* v = f32 != nullptr ? f32 + row * k : t.x.data();
      RtnRowDequantDiv(t.codes.data(), k, g, t.sc.data(), t.zp.data(), s.data(), v);
      if (bf16 != nullptr) ToBf16Bits(v, k, bf16 + row * k);
    }
  }
  return !failed;
}

// The candidate linears for scales s: every quantized balance layer W → Q(W·s)/s. False when a
// value does not fit its dtype (RTN scale overflow, an unquantized balance layer's W·s).
// *inspected_w: Ŵ of the inspected linear (its current weight unless it is quantized here); with
// `gram` only that is made (the Gram-matrix loss runs no linear).
bool CandidateLinears(const ResolvedMapping& r, const CalibLayer& L, const std::vector<float>& s, bool gram,
                      CandidateBuffers& buf, CalibLinears* cand, std::shared_ptr<const std::vector<float>>* inspected_w) {
  buf.f32.resize(r.balance.size());
  buf.bf16.resize(r.balance.size());
  for (size_t bi = 0; bi < r.balance.size(); ++bi) {
    const int i = r.balance[bi];
    const int64_t n = L.n[i], k = L.k[i];
    if (!L.spec[i]) {
      for (int64_t row = 0; row < n; ++row)
        for (int64_t c = 0; c < k; ++c)
          if (!FitsDType((*L.w[i])[row * k + c] * s[c], L.dtype[i])) return false;
      continue;
    }
    if (gram && i != r.inspect_linear) continue;
    const bool want_f32 = L.calib != CalibDType::kBf16 || (i == r.inspect_linear && gram);
    auto& f = buf.f32[bi];
    if (want_f32 && (!f || f.use_count() > 1)) f = std::make_shared<std::vector<float>>();
    if (want_f32) f->resize(static_cast<size_t>(n * k));
    auto& b = buf.bf16[bi];
    if (!want_f32) b.resize(static_cast<size_t>(n * k));
    if (!CandidateRows(L.w[i]->data(), n, k, *L.spec[i], L.dtype[i], s, want_f32 ? f->data() : nullptr,
                       want_f32 ? nullptr : b.data()))
      return false;
    if (i == r.inspect_linear && want_f32) *inspected_w = f;
    if (gram) continue;
    (*cand)[i] = want_f32 ? MakeCalibLinear(n, k, f, L.bias[i], L.calib) : MakeBf16CalibLinearView(n, k, b.data(), L.bias[i]);
  }
  return true;
}

// Balance columns × s; prev_op ÷ s (a norm rounded to its dtype; a float-stored prev_op linear
// rounded too, so later searches see what is stored).
void ApplyScales(const ResolvedMapping& r, CalibLayer& L, const std::vector<float>& s, int64_t kin) {
  for (int i : r.balance) {
    auto& w = *L.w[i];
    for (int64_t row = 0; row < L.n[i]; ++row)
      for (int64_t c = 0; c < kin; ++c) w[row * kin + c] *= s[c];
  }
  if (r.prev_op != AwqPrevOp::kLinear) {
    const bool first = r.prev_op == AwqPrevOp::kInputLayernorm;
    auto& ln = first ? L.ln1 : L.ln2;
    const DType dt = first ? L.ln1_dtype : L.ln2_dtype;
    for (int64_t c = 0; c < kin; ++c) ln[c] = RoundToDType(ln[c] / s[c], dt);
    return;
  }
  const int p = r.prev_linear;
  auto& w = *L.w[p];
  const int64_t off = L.n[p] - kin, kp = L.k[p];
  for (int64_t row = 0; row < kin; ++row) {
    for (int64_t c = 0; c < kp; ++c) w[(off + row) * kp + c] /= s[row];
    if (!L.bias[p].empty()) L.bias[p][off + row] /= s[row];
  }
  if (!L.spec[p])
    for (auto& v : w) v = RoundToDType(v, L.dtype[p]);
}

}  // namespace

bool AwqGramLoss(const AwqSettings& st, CalibDType calib, int64_t rows, int64_t k) {
  if (!st.gram_linear_loss) return false;
  if (calib == CalibDType::kFp32 || calib == CalibDType::kAuto) return true;
  const int64_t direct_per_gram = calib == CalibDType::kBf16 ? 2 : 1;  // bf16 GEMMs run at twice the sgemm's rate
  return rows >= direct_per_gram * k;
}

CaptureRequest SearchNeeds(const ResolvedMapping& r, const AwqSettings& st, const CalibLayer& L, int64_t rows) {
  CaptureRequest q;
  q.abs_mean = {r.src};
  if (r.inspect == AwqInspect::kLinear && AwqGramLoss(st, L.calib, rows, L.k[r.balance[0]]))
    q.gram = {InputOf(r.inspect_linear)};
  else
    q.rows = {InspectInput(r)};
  q.keep_attention = !ChangesAttention(r);  // (the next mappings and the fp pass start from it)
  return q;
}

Result<AwqMappingReport> SearchAndApply(const LayerRunner& run, const ResolvedMapping& r, CalibLayer& L,
                                        CalibLinears& base, const CapturedRows& a, const AwqSettings& st) {
  AwqMappingReport rep;
  rep.mapping = r.mapping;
  const int64_t rows = run.rows(), kin = L.k[r.balance[0]];
  const std::vector<float>& x_mean = a.AbsMean(r.src);
  const std::vector<float> w_mean = WeightMean(L, r.balance);
  const int64_t y_dim = ChunkingFor(run, r, base).od;
  // A single inspected linear is scored through the Gram matrix of its inputs (GramMatrix): the
  // same squared error, without a pass over the activations per candidate. Modules run per
  // candidate against their fp output. SearchNeeds chose which of the two `a` holds.
  const std::vector<float>& g = a.Gram(InspectInput(r));
  const bool gram = !g.empty();
  std::vector<std::vector<float>> xs;  // per-thread widened rows (InspectChunk)
  const std::vector<float> y_fp = gram ? std::vector<float>{} : InspectReference(run, r, L, base, a, xs);

  double best = std::numeric_limits<double>::infinity();
  std::vector<float> best_s;
  bool first = true;
  CandidateBuffers buf;
  std::vector<std::vector<float>> outs;  // InspectLoss's per-thread chunk outputs
  for (const auto& [ratio, duo] : Grid(st.duo_scaling, st.n_grid)) {
    const std::vector<float> s = Scales(x_mean, w_mean, ratio, duo);
    CalibLinears cand{};
    std::shared_ptr<const std::vector<float>> inspected_w = gram ? L.w[r.inspect_linear] : nullptr;
    const bool ok = PrevOpFits(r, L, s, kin) && CandidateLinears(r, L, s, gram, buf, &cand, &inspected_w);
    double loss = std::numeric_limits<double>::infinity();
    if (ok && gram) {
      const int i = r.inspect_linear;
      loss = GramSquaredError(g, *L.w[i], *inspected_w, L.n[i], kin) / static_cast<double>(rows * y_dim);
    } else if (ok) {
      // Stop a candidate as soon as its partial squared error exceeds the best loss so far (by a
      // margin far above rounding): it cannot win, so the choice is that of the full search.
      const double stop_above = st.early_stop && std::isfinite(best)
                                    ? best * static_cast<double>(rows * y_dim) * (1 + 1e-9)
                                    : std::numeric_limits<double>::infinity();
      for (int i : r.balance)
        if (cand[i]) std::swap(base[i], cand[i]);
      const std::optional<double> l = InspectLoss(run, r, L, base, a, y_fp, stop_above, outs, xs);
      for (int i : r.balance)
        if (cand[i]) std::swap(base[i], cand[i]);
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
  if (best_s.empty()) return MakeError(L.name, ": AWQ mapping ", Describe(r.mapping), ": no grid candidate has a finite loss");
  rep.loss_best = best;
  rep.scale_min = *std::min_element(best_s.begin(), best_s.end());
  rep.scale_max = *std::max_element(best_s.begin(), best_s.end());
  ApplyScales(r, L, best_s, kin);
  return rep;
}

}  // namespace nibble
