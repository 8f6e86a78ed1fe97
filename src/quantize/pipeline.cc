// The sequential layer pipeline (see pipeline.h for the order of steps).
#include "quantize/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "base/check.h"
#include "base/half.h"
#include "base/memory.h"
#include "formats/float_dtype.h"
#include "formats/quark_format.h"
#include "formats/rtn.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_packed.h"
#include "kernels/vec_ops.h"
#include "model/linear.h"
#include "model/llama.h"
#include "model/weights.h"
#include "quantize/gram.h"
#include "quantize/plan.h"

namespace nibble {

int64_t AlgorithmChain::StepsPerLayer() const {
  int64_t n = 0;
  for (const auto& a : algos_) n += a->StepsPerLayer();
  return n;
}

Status AlgorithmChain::Transform(LayerRunner& runner, CalibLayer& layer, const std::function<Status()>& step) {
  for (const auto& a : algos_) NIBBLE_RETURN_IF_ERROR(a->Transform(runner, layer, step));
  return Status::Ok();
}

Status AlgorithmChain::Finish(const LayerRunner& runner, CalibLayer& layer, LayerCodes& codes,
                              const std::function<Status()>& step) {
  for (const auto& a : algos_) NIBBLE_RETURN_IF_ERROR(a->Finish(runner, layer, codes, step));
  return Status::Ok();
}


bool AlgorithmChain::NeedsGrams() const {
  return std::any_of(algos_.begin(), algos_.end(), [](const auto& a) { return a->NeedsGrams(); });
}

bool AlgorithmChain::Transforms() const {
  return std::any_of(algos_.begin(), algos_.end(), [](const auto& a) { return a->Transforms(); });
}

Status AlgorithmChain::FinishGrams(LayerGrams& grams, const CalibLayer& layer, LayerCodes& codes,
                                   const std::function<Status()>& step) {
  for (const auto& a : algos_) NIBBLE_RETURN_IF_ERROR(a->FinishGrams(grams, layer, codes, step));
  return Status::Ok();
}

std::vector<std::string> AlgorithmChain::Messages() const {
  std::vector<std::string> out;
  for (const auto& a : algos_) {
    std::vector<std::string> m = a->Messages();
    out.insert(out.end(), m.begin(), m.end());
  }
  return out;
}

Result<LinearPlan> LinearPlanSource::operator()(const std::string& module) const {
  if (config_ != nullptr) return ResolveQuarkLinear(*config_, module);
  const PlannedLinear* l = plan_->Find(module);
  if (l == nullptr) return MakeError("the quantize plan has no linear ", module);
  return LinearPlan{l->spec, l->rule};
}

LayerInput InputOf(int slot) {
  switch (slot) {
    case kQ: case kK: case kV: return LayerInput::kAttnIn;
    case kO: return LayerInput::kAttnConcat;
    case kGate: case kUp: return LayerInput::kMlpIn;
    default: return LayerInput::kMlpAct;
  }
}

LayerStop StopFor(LayerInput in) {
  switch (in) {
    case LayerInput::kAttnIn: return LayerStop::kAttnIn;
    case LayerInput::kAttnConcat: return LayerStop::kAttnResidual;
    case LayerInput::kMlpIn: return LayerStop::kMlpIn;
    default: return LayerStop::kFull;
  }
}

CalibLayer CalibLayer::Clone() const {
  CalibLayer c = *this;
  for (auto& p : c.w) p = std::make_shared<std::vector<float>>(*p);
  return c;
}

CalibLinears MakeLinears(const CalibLayer& L) {
  CalibLinears out;
  for (int i = 0; i < kNumLinears; ++i) out[i] = MakeCalibLinear(L.n[i], L.k[i], L.w[i], L.bias[i], L.calib);
  return out;
}

DecoderLayerView ViewOf(const CalibLayer& L, const CalibLinears& lin) {
  DecoderLayerView v;
  v.input_layernorm = L.ln1.data();
  v.post_attention_layernorm = L.ln2.data();
  v.q_norm = L.q_norm.empty() ? nullptr : L.q_norm.data();
  v.k_norm = L.k_norm.empty() ? nullptr : L.k_norm.data();
  v.q_proj = lin[kQ].get();
  v.k_proj = lin[kK].get();
  v.v_proj = lin[kV].get();
  v.o_proj = lin[kO].get();
  v.gate_proj = lin[kGate].get();
  v.up_proj = lin[kUp].get();
  v.down_proj = lin[kDown].get();
  return v;
}

const std::vector<float>& LayerActs::Vec(LayerInput in) const {
  switch (in) {
    case LayerInput::kAttnIn: return attn_in;
    case LayerInput::kAttnConcat: return attn_concat;
    case LayerInput::kMlpIn: return mlp_in;
    default: return mlp_act;
  }
}

namespace {

// Which projections of `mc` have a bias, in slot order.
std::array<bool, kNumLinears> HasBias(const ModelConfig& mc) {
  return {mc.qkv_bias, mc.qkv_bias, mc.qkv_bias, mc.o_bias, mc.mlp_bias, mc.mlp_bias, mc.mlp_bias};
}

// Σ (a − b)² (b null: Σ a²) over fixed blocks of 4096 (double partials summed in block order).
double SquaredErrorBlocks(const float* a, const float* b, int64_t n) {
  static const std::vector<float> zero(4096, 0.0f);
  const int64_t blocks = (n + 4095) / 4096;
  std::vector<double> part(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t bl = 0; bl < blocks; ++bl) {
    const int64_t e = std::min(n, (bl + 1) * 4096);
    part[bl] = SquaredErrorSum(a + bl * 4096, b != nullptr ? b + bl * 4096 : zero.data(), e - bl * 4096);
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace

double Mse(const float* a, const float* b, int64_t n) { return SquaredErrorBlocks(a, b, n) / static_cast<double>(n); }

Result<std::vector<float>> RtnDequant(const std::vector<float>& w, int64_t n, int64_t k, const QuantSpec& spec,
                                      DType dt) {
  std::vector<float> d(w.size());
  // Blocks of rows in parallel: a row's RTN is the reference's on that row alone. A failure falls
  // through to the whole matrix, whose error names the weight or group.
  constexpr int64_t kRows = 64;
  bool failed = false;
#pragma omp parallel for schedule(dynamic, 1) reduction(|| : failed)
  for (int64_t r0 = 0; r0 < n; r0 += kRows) {
    auto q = QuantizeRtnRef(w.data() + r0 * k, std::min(kRows, n - r0), k, spec, dt);
    if (q.ok()) DequantizeRef(*q, d.data() + r0 * k);
    failed = failed || !q.ok();
  }
  if (!failed) return d;
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix q, QuantizeRtnRef(w.data(), n, k, spec, dt));
  DequantizeRef(q, d.data());
  return d;
}

namespace {

// Calibration rows the per-linear error report uses: an eighth of them, at least 2048 and at most
// 8192 (its two GEMMs per linear over all rows would cost as much as the fp pass itself).
int64_t ReportRows(int64_t rows) { return std::min<int64_t>(8192, std::max<int64_t>(2048, rows / 8)); }

// Sequences of the error report's rows (ReportRows, whole sequences, at least one).
int64_t ReportBatch(const LayerRunner& runner) {
  return std::min<int64_t>(runner.batch(), std::max<int64_t>(1, ReportRows(runner.rows()) / runner.t()));
}

// Whether the error report of an [n, k] linear runs as bf16 matmuls (Bf16OutputErrorSums): the
// calibration's captures are bf16 values and this CPU has a usable bf16 matmul for the tiles.
bool Bf16Report(CalibDType calib, int64_t n, int64_t k) {
  return calib == CalibDType::kBf16 && GemmBf16Usable(std::min(kReportTileRows, n), k) &&
         (n % kReportTileRows == 0 || GemmBf16Usable(n % kReportTileRows, k));
}

// {Σ y², Σ (y − y₁)², Σ (y − y₂)²} over bf16-valued rows of x, y = x·Wᵀ and yᵢ = x·Ŵᵢᵀ (a null Ŵᵢ
// gives 0), as bf16 matmuls in tiles of output rows: y from bf16(W), exact for a bf16 checkpoint,
// and each error straight from bf16(W − Ŵᵢ), whose rounding is relative to the error itself.
std::array<double, 3> Bf16OutputErrorSums(const float* x, int64_t rows, int64_t n, int64_t k, const float* w,
                                          const float* wq1, const float* wq2) {
  const int64_t tile = std::min(kReportTileRows, n);
  std::vector<uint16_t> xb(static_cast<size_t>(rows * k)), wb(static_cast<size_t>(tile * k));
  std::vector<float> y(static_cast<size_t>(rows * tile));
  ToBf16Bits(x, rows * k, xb.data());
  std::array<double, 3> sums{};
  const std::array<const float*, 3> minus = {nullptr, wq1, wq2};
  for (int64_t n0 = 0; n0 < n; n0 += tile) {
    const int64_t nt = std::min(tile, n - n0), count = nt * k;
    const float* w0 = w + n0 * k;
    for (int q = 0; q < 3; ++q) {
      if (q > 0 && minus[q] == nullptr) continue;
      const float* o = q > 0 ? minus[q] + n0 * k : nullptr;
      if (o == nullptr) {
        ToBf16Bits(w0, count, wb.data());
      } else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < count; ++i) wb[i] = F32ToBf16(w0[i] - o[i]);
      }
      NIBBLE_CHECK(GemmBf16XWt(rows, nt, k, xb.data(), wb.data(), y.data()));
      sums[q] += SquaredErrorBlocks(y.data(), nullptr, rows * nt);
    }
  }
  return sums;
}

// ||X·Wᵀ − X·Ŵᵀ||² / ||X·Wᵀ||² on rows of x (captures of a calibration in `calib`).
double RelOutputError(const float* x, int64_t rows, const std::vector<float>& w, const std::vector<float>& wq, int64_t n,
                      int64_t k, CalibDType calib) {
  if (Bf16Report(calib, n, k)) {
    const std::array<double, 3> s = Bf16OutputErrorSums(x, rows, n, k, w.data(), wq.data(), nullptr);
    return s[0] > 0 ? s[1] / s[0] : 0.0;
  }
  std::vector<float> y(rows * n), yq(rows * n);
  SgemmXWt(rows, n, k, x, k, w.data(), k, 0.0f, y.data(), n);
  SgemmXWt(rows, n, k, x, k, wq.data(), k, 0.0f, yq.data(), n);
  const std::vector<float> zero(y.size(), 0.0f);
  const double den = Mse(y.data(), zero.data(), static_cast<int64_t>(y.size()));
  return den > 0 ? Mse(y.data(), yq.data(), static_cast<int64_t>(y.size())) / den : 0.0;
}

// The fp32 weights, dtypes and resolved specs of decoder layer l.
Result<CalibLayer> LoadLayer(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan, int64_t l,
                             CalibDType calib) {
  const int64_t h = mc.hidden_size, q_dim = mc.num_attention_heads * mc.head_dim;
  const int64_t kv_dim = mc.num_key_value_heads * mc.head_dim, inter = mc.intermediate_size;
  const std::array<std::pair<int64_t, int64_t>, kNumLinears> shapes = {
      std::pair{q_dim, h}, {kv_dim, h}, {kv_dim, h}, {h, q_dim}, {inter, h}, {inter, h}, {h, inter}};
  const std::array<bool, kNumLinears> has_bias = HasBias(mc);
  CalibLayer L;
  L.calib = calib;
  L.index = l;
  L.name = "model.layers." + std::to_string(l);
  const std::string p = L.name + ".";
  NIBBLE_ASSIGN_OR_RETURN(L.ln1, LoadF32(store, p + "input_layernorm.weight", {h}));
  NIBBLE_ASSIGN_OR_RETURN(L.ln2, LoadF32(store, p + "post_attention_layernorm.weight", {h}));
  L.ln1_dtype = store.Find(p + "input_layernorm.weight")->dtype;
  L.ln2_dtype = store.Find(p + "post_attention_layernorm.weight")->dtype;
  store.Evict(*store.Find(p + "input_layernorm.weight"));
  store.Evict(*store.Find(p + "post_attention_layernorm.weight"));
  if (mc.qk_norm) {  // read only by the forward; the exporter copies them from the input as stored
    NIBBLE_ASSIGN_OR_RETURN(L.q_norm, LoadF32(store, p + "self_attn.q_norm.weight", {mc.head_dim}));
    NIBBLE_ASSIGN_OR_RETURN(L.k_norm, LoadF32(store, p + "self_attn.k_norm.weight", {mc.head_dim}));
  }
  for (int i = 0; i < kNumLinears; ++i) {
    const std::string name = p + DecoderLinearNames()[i];
    L.n[i] = shapes[i].first;
    L.k[i] = shapes[i].second;
    NIBBLE_ASSIGN_OR_RETURN(std::vector<float> w, LoadF32(store, name + ".weight", {L.n[i], L.k[i]}));
    L.w[i] = std::make_shared<std::vector<float>>(std::move(w));
    L.dtype[i] = store.Find(name + ".weight")->dtype;
    if (has_bias[i]) {
      NIBBLE_ASSIGN_OR_RETURN(L.bias[i], LoadF32(store, name + ".bias", {L.n[i]}));
    }
    // The input is read once: its pages leave the process and the page cache (fp32 copies now).
    store.Evict(*store.Find(name + ".weight"));
    if (has_bias[i]) store.Evict(*store.Find(name + ".bias"));
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan rc, plan(name));
    L.spec[i] = rc.spec;
    if (rc.spec && L.k[i] % rc.spec->EffectiveGroupSize(L.k[i]) != 0)
      return MakeError("layer ", name, ": in_features K = ", L.k[i], " is not divisible by group_size ",
                       rc.spec->EffectiveGroupSize(L.k[i]), " (", rc.rule, ")");
  }
  return L;
}

// Embedding rows of the calibration tokens, gathered straight from the (mmap'd) tensor.
Result<std::vector<float>> EmbedTokens(const ModelConfig& mc, const TensorStore& store, const std::vector<int32_t>& tokens) {
  const int64_t h = mc.hidden_size, rows = static_cast<int64_t>(tokens.size());
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* emb, store.Get("model.embed_tokens.weight"));
  if (emb->shape != std::vector<int64_t>{mc.vocab_size, h} || !IsFloatScaleDType(emb->dtype))
    return MakeError(emb->file, ": tensor ", emb->name, " has shape ", emb->ShapeString(), " / dtype ", DTypeName(emb->dtype),
                     ", expected float [", mc.vocab_size, ", ", h, "]");
  std::vector<float> x(static_cast<size_t>(rows * h));
  const size_t esz = DTypeSize(emb->dtype);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = tokens[r];
    if (id < 0 || id >= mc.vocab_size) return MakeError("calibration token id ", id, " outside the vocabulary");
    for (int64_t c = 0; c < h; ++c) x[r * h + c] = LoadFloatAs(emb->data + (static_cast<size_t>(id) * h + c) * esz, emb->dtype);
  }
  return x;
}

// "quantize at model.layers.3.mlp.up_proj": where a cancelled pipeline stopped.
std::string QuantizeAt(const std::string& what) { return "quantize at " + what; }

// The final codes (the algorithm's, else RTN) and the dequantized layer they give. deq shares L's
// unquantized weights (no one writes them while deq lives) and owns the dequantized ones.
Status QuantizeLayer(const CalibLayer& L, LayerCodes& codes, CalibLayer* deq, const CancellationToken* cancel) {
  *deq = L;
  for (int i = 0; i < kNumLinears; ++i) {
    if (!L.spec[i]) continue;
    const std::string name = L.name + "." + DecoderLinearNames()[i];
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, QuantizeAt(name)));
    if (!codes[i]) {
      auto q = QuantizeRtnRef(L.w[i]->data(), L.n[i], L.k[i], *L.spec[i], L.dtype[i]);
      if (!q.ok()) return q.error().WithContext("layer " + name);
      codes[i] = std::move(q).value();
    }
    auto d = std::make_shared<std::vector<float>>(static_cast<size_t>(L.n[i] * L.k[i]));
    DequantizeRef(*codes[i], d->data());
    deq->w[i] = std::move(d);
  }
  return Status::Ok();
}

// Per-linear output errors: RTN of the original weights on the original layer's inputs, and the
// final weights (deq) against the transformed ones on the transformed layer's inputs (fp).
Result<std::vector<LinearErrorReport>> ErrorReport(const LayerRunner& runner, const CalibLayer& orig, const CalibLayer& L,
                                                   const CalibLayer& deq, const LayerActs& fp, const CancellationToken* cancel) {
  const int64_t report_batch = ReportBatch(runner);
  const int64_t rr = report_batch * runner.t();
  LayerActs oa;
  runner.RunFresh(orig, report_batch, &oa);
  std::vector<LinearErrorReport> out;
  for (int i = 0; i < kNumLinears; ++i) {
    LinearErrorReport lr;
    lr.name = L.name + "." + DecoderLinearNames()[i];
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, QuantizeAt(lr.name + " (error report)")));
    lr.quantized = L.spec[i].has_value();
    if (lr.quantized) {
      auto rq = RtnDequant(*orig.w[i], L.n[i], L.k[i], *L.spec[i], L.dtype[i]);
      if (rq.ok()) lr.rtn_error = RelOutputError(oa.Of(InputOf(i)), rr, *orig.w[i], *rq, L.n[i], L.k[i], L.calib);
      // fp holds the transformed layer's activations; its first rr rows are the report rows.
      lr.method_error = RelOutputError(fp.Of(InputOf(i)), rr, *L.w[i], *deq.w[i], L.n[i], L.k[i], L.calib);
    }
    out.push_back(lr);
  }
  return out;
}

constexpr std::array<LayerInput, 4> kLayerInputs = {LayerInput::kAttnIn, LayerInput::kAttnConcat, LayerInput::kMlpIn,
                                                     LayerInput::kMlpAct};

// The first quantized linear of L that reads `in`, -1 when none does.
int QuantizedReaderOf(const CalibLayer& L, LayerInput in) {
  for (int i = 0; i < kNumLinears; ++i)
    if (InputOf(i) == in && L.spec[i]) return i;
  return -1;
}

// The fp pass of a chunked layer on the runner's carried input: per chunk of sequences, the
// captured linear inputs are added into `grams` (not null: those a quantized linear reads) in
// chunk order, and (fp propagation, `next` not null) the layer output goes to `next`. The first
// chunk's captures stay in `first` (the error report's first rows); the later chunks start from
// the kept attention stages unless the q / k / v / o inputs go into Gram matrices.
Status ChunkedFpPass(LayerRunner& runner, const CalibLayer& L, CarriedActivations* next, LayerGrams* grams,
                     LayerActs* first, const CancellationToken* cancel) {
  const int64_t h = runner.config().hidden_size, t = runner.t();
  auto gram_of = [&](LayerInput li) { return grams != nullptr ? QuantizedReaderOf(L, li) : -1; };
  if (grams != nullptr) grams->rows = runner.rows();
  for (LayerInput li : kLayerInputs)
    if (const int i = gram_of(li); i >= 0) grams->Of(li).assign(static_cast<size_t>(L.k[i] * L.k[i]), 0.0f);
  const CalibLinears lin = MakeLinears(L);
  const auto add = [&](int64_t b0, int64_t nb, const LayerActs& c) -> Status {
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, QuantizeAt(L.name + " (calibration rows " + std::to_string(b0 * t) + ")")));
    for (LayerInput li : kLayerInputs)
      if (const int i = gram_of(li); i >= 0) AccumulateGramLower(c.Of(li), nb * t, L.k[i], grams->Of(li).data());
    if (next != nullptr) next->Put(b0 * t * h, c.out.data(), nb * t * h);
    if (b0 == 0) *first = c;
    return Status::Ok();
  };
  ChunkPass head, rest;
  head.end = rest.begin = std::min(runner.batch(), OutputChunkRows(t) / t);
  rest.attention_captures = gram_of(LayerInput::kAttnIn) >= 0 || gram_of(LayerInput::kAttnConcat) >= 0;
  if (rest.attention_captures) runner.InvalidateAttention();  // (unused: its memory goes first)
  NIBBLE_RETURN_IF_ERROR(runner.ForEachChunk(L, lin, head, add));
  NIBBLE_RETURN_IF_ERROR(runner.ForEachChunk(L, lin, rest, add));
  for (LayerInput li : kLayerInputs)
    if (const int i = gram_of(li); i >= 0) MirrorLower(grams->Of(li).data(), L.k[i]);
  return Status::Ok();
}

// The report's sums per linear over the report rows: Σ y², Σ (y − y_rtn)² and Σ (y − y_final)²
// with y = x·Wᵀ of L on its own inputs.
struct ErrorSums {
  std::array<double, kNumLinears> den{}, rtn{}, method{};
  std::array<bool, kNumLinears> rtn_ok{true, true, true, true, true, true, true};
};

// ErrorSums of L from the runner's carried input, chunk by chunk over the report rows, summed in
// chunk order: RTN of L's weights (`with_rtn`, redone per chunk, not held) and deq's (not null).
// The first chunk's captures are the fp pass's where it ran L (`first` not null: the same forward).
Status ChunkedErrorSums(LayerRunner& runner, const CalibLayer& L, const CalibLayer* deq, bool with_rtn,
                        const LayerActs* first, const CancellationToken* cancel, ErrorSums* out) {
  ErrorSums& e = *out;
  if (!with_rtn) e.rtn_ok.fill(false);
  std::vector<float> y, yq;
  const auto add = [&](int64_t, int64_t nb, const LayerActs& c) -> Status {
    const int64_t rows = nb * runner.t();
    for (int i = 0; i < kNumLinears; ++i) {
      if (!L.spec[i]) continue;
      NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, QuantizeAt(L.name + "." + DecoderLinearNames()[i] + " (error report)")));
      const int64_t n = L.n[i], k = L.k[i];
      const float* xi = c.Of(InputOf(i));
      const float* wd = deq != nullptr ? deq->w[i]->data() : nullptr;
      std::vector<float> rq;
      if (e.rtn_ok[i]) {
        auto r = RtnDequant(*L.w[i], n, k, *L.spec[i], L.dtype[i]);
        e.rtn_ok[i] = r.ok() && with_rtn;
        if (r.ok()) rq = std::move(r).value();
      }
      if (Bf16Report(L.calib, n, k)) {
        const std::array<double, 3> s =
            Bf16OutputErrorSums(xi, rows, n, k, L.w[i]->data(), e.rtn_ok[i] ? rq.data() : nullptr, wd);
        e.den[i] += s[0];
        e.rtn[i] += s[1];
        e.method[i] += s[2];
        continue;
      }
      y.resize(static_cast<size_t>(rows * n));
      yq.resize(y.size());
      SgemmXWt(rows, n, k, xi, k, L.w[i]->data(), k, 0.0f, y.data(), n);
      e.den[i] += SquaredErrorBlocks(y.data(), nullptr, rows * n);
      if (e.rtn_ok[i]) {
        SgemmXWt(rows, n, k, xi, k, rq.data(), k, 0.0f, yq.data(), n);
        e.rtn[i] += SquaredErrorBlocks(y.data(), yq.data(), rows * n);
      }
      if (wd != nullptr) {
        SgemmXWt(rows, n, k, xi, k, wd, k, 0.0f, yq.data(), n);
        e.method[i] += SquaredErrorBlocks(y.data(), yq.data(), rows * n);
      }
    }
    return Status::Ok();
  };
  ChunkPass pass;
  pass.end = ReportBatch(runner);
  if (first != nullptr) {  // (the fp pass's first chunk: its first min(seqs, report) sequences)
    pass.begin = std::min(pass.end, OutputChunkRows(runner.t()) / runner.t());
    NIBBLE_RETURN_IF_ERROR(add(0, pass.begin, *first));
  }
  return runner.ForEachChunk(L, MakeLinears(L), pass, add);
}

// The report from the sums of the original layer (RTN) and of the final one (method): the same
// ErrorSums where no weight was transformed.
std::vector<LinearErrorReport> ErrorReportOf(const CalibLayer& L, const ErrorSums& orig, const ErrorSums& fin) {
  std::vector<LinearErrorReport> out;
  for (int i = 0; i < kNumLinears; ++i) {
    LinearErrorReport lr;
    lr.name = L.name + "." + DecoderLinearNames()[i];
    lr.quantized = L.spec[i].has_value();
    if (lr.quantized && orig.den[i] > 0 && orig.rtn_ok[i]) lr.rtn_error = orig.rtn[i] / orig.den[i];
    if (lr.quantized && fin.den[i] > 0) lr.method_error = fin.method[i] / fin.den[i];
    out.push_back(lr);
  }
  return out;
}

// A layer of Chunkable algorithms in a 16-bit calibration (pipeline.h), every pass in chunks of the
// carried input: the report's RTN sums of the original weights where the algorithm transforms
// them, its Transform, the fp pass (into Gram matrices where it needs them), the codes, then the
// next layer's input (quantized propagation) and the report's sums; `carried` becomes the next
// layer's input. No linear input exists for all rows in fp32; the forward scratch is one chunk's.
Status ChunkedLayer(LayerRunner& runner, CalibLayer& L, LayerAlgorithm& algo, Propagation prop,
                    CarriedActivations& carried, LayerCodes& codes, std::vector<LinearErrorReport>* report,
                    const std::function<Status()>& tick, const std::function<void(const char*)>& stage,
                    const CancellationToken* cancel) {
  CarriedActivations next(L.calib);
  const int64_t n = runner.rows() * runner.config().hidden_size;
  runner.SetCarried(&carried);
  stage("calibrate");
  ErrorSums orig;
  if (algo.Transforms()) {
    NIBBLE_RETURN_IF_ERROR(ChunkedErrorSums(runner, L, nullptr, true, nullptr, cancel, &orig));
    // Each search allocates buffers of the same sizes (its captures, the fp output, the per-thread
    // chunks): kept in the heap over the Transform instead of faulted afresh each time.
    RetainFreedMemory keep;
    NIBBLE_RETURN_IF_ERROR(algo.Transform(runner, L, tick));
    runner.ReleaseCaptured();
    runner.Workspaces(1).resize(1);  // the searches' per-thread chunk scratch
  }
  LayerActs first;
  {
    LayerGrams grams;
    if (prop == Propagation::kFp) next.Resize(n);
    NIBBLE_RETURN_IF_ERROR(ChunkedFpPass(runner, L, prop == Propagation::kFp ? &next : nullptr,
                                         algo.NeedsGrams() ? &grams : nullptr, &first, cancel));
    runner.InvalidateAttention();  // (the kept residual's memory, before the finish)
    stage("quantize");
    NIBBLE_RETURN_IF_ERROR(algo.FinishGrams(grams, L, codes, tick));
  }
  CalibLayer deq;
  NIBBLE_RETURN_IF_ERROR(QuantizeLayer(L, codes, &deq, cancel));
  if (prop == Propagation::kQuantized) {  // the dequantized layer's output
    next.Resize(n);
    const int64_t row = runner.t() * runner.config().hidden_size;
    NIBBLE_RETURN_IF_ERROR(runner.ForEachOutput(deq, [&](int64_t b0, int64_t nb, const float* y) -> Status {
      NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, QuantizeAt(L.name + " (propagation)")));
      next.Put(b0 * row, y, nb * row);
      return Status::Ok();
    }));
  }
  ErrorSums fin;
  NIBBLE_RETURN_IF_ERROR(ChunkedErrorSums(runner, L, &deq, !algo.Transforms(), &first, cancel, &fin));
  *report = ErrorReportOf(L, algo.Transforms() ? orig : fin, fin);
  runner.SetCarried(nullptr);
  carried = std::move(next);
  return Status::Ok();
}

// Hands the layer's tensors to the sink in LayerTensorNames order.
Status SinkLayer(CalibLayer& L, LayerCodes& codes, const LayerTensorSink& sink, const CancellationToken* cancel) {
  NIBBLE_RETURN_IF_ERROR(CheckCancelled(cancel, QuantizeAt(L.name + " (export)")));
  const std::string p = L.name + ".";
  NIBBLE_RETURN_IF_ERROR(sink({p + "input_layernorm.weight", std::move(L.ln1), std::nullopt}));
  NIBBLE_RETURN_IF_ERROR(sink({p + "post_attention_layernorm.weight", std::move(L.ln2), std::nullopt}));
  for (int i = 0; i < kNumLinears; ++i) {
    const std::string name = p + DecoderLinearNames()[i];
    NIBBLE_RETURN_IF_ERROR(sink({name + ".weight", std::move(*L.w[i]), std::move(codes[i])}));
    if (!L.bias[i].empty()) NIBBLE_RETURN_IF_ERROR(sink({name + ".bias", std::move(L.bias[i]), std::nullopt}));
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> LayerTensorNames(const ModelConfig& mc, int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  std::vector<std::string> names = {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"};
  const std::array<bool, kNumLinears> has_bias = HasBias(mc);
  for (int i = 0; i < kNumLinears; ++i) {
    names.push_back(p + DecoderLinearNames()[i] + ".weight");
    if (has_bias[i]) names.push_back(p + DecoderLinearNames()[i] + ".bias");
  }
  return names;
}

Result<PipelineResult> RunLayerPipeline(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                                        const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len,
                                        LayerAlgorithm& algo, const PipelineOptions& o, const LayerTensorSink& sink) {
  const auto t0 = std::chrono::steady_clock::now();
  if (batch < 1 || seq_len < 1 || static_cast<int64_t>(tokens.size()) != batch * seq_len)
    return MakeError("calibration tokens (", tokens.size(), ") do not form ", batch, " x ", seq_len);
  if (seq_len > mc.max_position_embeddings)
    return MakeError("calibration seq_len ", seq_len, " exceeds max_position_embeddings ", mc.max_position_embeddings);
  if (o.start_layer < 0 || o.start_layer > mc.num_hidden_layers)
    return MakeErrorCode(ErrorCode::kCorruptInput, "resuming at layer ", o.start_layer, " of ", mc.num_hidden_layers);
  const CalibDType calib = ResolveCalibDType(o.calib_dtype, mc);
  // The layer input between layers, stored in the calibration dtype; `x` holds it as fp32 while
  // its layer runs.
  CarriedActivations carried(calib);
  if (o.start_layer == 0) {
    NIBBLE_ASSIGN_OR_RETURN(std::vector<float> emb, EmbedTokens(mc, store, tokens));
    carried.Store(std::move(emb));
  } else {
    NIBBLE_RETURN_IF_ERROR(carried.Restore(o.start_input, o.start_input_dtype, batch * seq_len * mc.hidden_size));
  }
  std::vector<float> x_wide;
  const int64_t total_steps = mc.num_hidden_layers * (algo.StepsPerLayer() + 1);
  int64_t step = o.start_layer * (algo.StepsPerLayer() + 1);
  int64_t layer = 0;
  auto tick = [&]() -> Status {
    if (o.progress) o.progress(++step, total_steps);
    return CheckCancelled(o.cancel, QuantizeAt("layer " + std::to_string(layer + 1) + " of " +
                                               std::to_string(mc.num_hidden_layers) + ", step " + std::to_string(step) +
                                               " of " + std::to_string(total_steps)));
  };
  LayerRunner runner(mc, batch, seq_len, o.reuse_attention);
  // A 16-bit calibration of Chunkable algorithms runs each layer in chunks (ChunkedLayer); fp32
  // keeps the whole-rows path and its bytes.
  const bool chunked = o.chunked;
  if (chunked && calib == CalibDType::kFp32)
    return MakeError("a chunked layer pipeline needs a 16-bit calibration dtype, not fp32");
  // Every whole-rows layer allocates and frees the same buffers (fp32 weights, their copies, the
  // calibration linears, AWQ's candidates): kept in the heap from one layer to the next instead
  // of each layer zeroing gigabytes of fresh pages. The chunked path's buffers differ in size
  // from phase to phase, and kept memory raised its peak (docs/PERFORMANCE.md).
  std::optional<RetainFreedMemory> retain;
  if (!chunked) retain.emplace();
  PipelineResult res;
  res.layers = o.start_reports;
  for (int64_t l = o.start_layer; l < mc.num_hidden_layers; ++l) {
    layer = l;
    const auto tl = std::chrono::steady_clock::now();
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(o.cancel, QuantizeAt("layer " + std::to_string(l + 1) + " of " +
                                                                std::to_string(mc.num_hidden_layers))));
    const std::function<void(const char*)> stage = [&](const char* what) {
      if (o.on_stage) o.on_stage(l, what);
    };
    stage("load");
    NIBBLE_ASSIGN_OR_RETURN(CalibLayer L, LoadLayer(mc, store, plan, l, calib));
    LayerReport rep;
    rep.layer = l;
    LayerCodes codes;
    if (chunked) {
      NIBBLE_RETURN_IF_ERROR(ChunkedLayer(runner, L, algo, o.propagation, carried, codes, &rep.linears, tick, stage, o.cancel));
    } else {
      const CalibLayer orig = L.Clone();
      runner.SetInput(carried.Take(&x_wide));
      stage("calibrate");
      NIBBLE_RETURN_IF_ERROR(algo.Transform(runner, L, tick));
      runner.ReleaseCaptured();
      const LayerActs& fp = runner.Run(L, LayerStop::kFull);
      std::vector<float> x_next;
      if (o.propagation == Propagation::kFp) x_next = fp.out;
      stage("quantize");
      NIBBLE_RETURN_IF_ERROR(algo.Finish(runner, L, codes, tick));
      CalibLayer deq;
      NIBBLE_RETURN_IF_ERROR(QuantizeLayer(L, codes, &deq, o.cancel));
      if (o.propagation == Propagation::kQuantized && calib != CalibDType::kFp32) {
        runner.RunOutput(deq, &x_next);
      } else if (o.propagation == Propagation::kQuantized) {  // (the fp32 path's bytes: one pass over all rows)
        LayerActs qa;
        runner.RunFresh(deq, batch, &qa);
        x_next = std::move(qa.out);
      }
      NIBBLE_ASSIGN_OR_RETURN(rep.linears, ErrorReport(runner, orig, L, deq, runner.acts(), o.cancel));
      carried.Store(std::move(x_next));
    }
    stage("write");
    NIBBLE_RETURN_IF_ERROR(SinkLayer(L, codes, sink, o.cancel));
    if (chunked) ReleaseFreedMemory();
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
    res.layers.push_back(std::move(rep));
    if (o.on_boundary)
      NIBBLE_RETURN_IF_ERROR(o.on_boundary(l, res.layers, carried.raw(), carried.raw_dtype()));
    NIBBLE_RETURN_IF_ERROR(tick());
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace nibble
