// GPTQ as a pipeline algorithm (see gptq.h).
#include "quantize/gptq/gptq.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <future>

#include "io/json.h"
#include "model/llama.h"
#include "quantize/gram.h"

namespace nibble {

namespace {

// The linears each capture point feeds, in slot order.
std::vector<int> LinearsOf(LayerInput in) {
  std::vector<int> out;
  for (int i = 0; i < kNumLinears; ++i)
    if (InputOf(i) == in) out.push_back(i);
  return out;
}

}  // namespace

Status GptqAlgorithm::QuantizeInput(LayerInput in, const float* x, int64_t rows, const CalibLayer& L, LayerCodes& codes,
                                    std::array<GptqLinearInfo, kNumLinears>& info) {
  const std::vector<int> lins = LinearsOf(in);
  bool any = false;
  for (int i : lins) any = any || L.spec[i].has_value();
  if (!any) return Status::Ok();
  return QuantizeGram(in, GramMatrix(x, rows, L.k[lins[0]], GramFill::kLowerMirrored), rows, L, codes, info);
}

Status GptqAlgorithm::QuantizeGram(LayerInput in, std::vector<float> g, int64_t rows, const CalibLayer& L,
                                   LayerCodes& codes, std::array<GptqLinearInfo, kNumLinears>& info) {
  return QuantizeWithFactor(in, FactorInput(in, std::move(g), rows, L), rows, L, codes, info);
}

Result<GptqFactor> GptqAlgorithm::FactorInput(LayerInput in, std::vector<float> h, int64_t rows,
                                              const CalibLayer& L) const {
  const float scale = 2.0f / static_cast<float>(rows);
  for (float& v : h) v *= scale;
  // A 16-bit calibration factorises with half the arithmetic; fp32 keeps its pipeline's bytes.
  const GptqFactorization how =
      L.calib == CalibDType::kFp32 ? GptqFactorization::kCholeskyOfInverse : GptqFactorization::kReversedCholesky;
  return FactorGptqHessian(std::move(h), L.k[LinearsOf(in)[0]], st_, how);
}

Status GptqAlgorithm::QuantizeWithFactor(LayerInput in, Result<GptqFactor> f, int64_t rows, const CalibLayer& L,
                                         LayerCodes& codes, std::array<GptqLinearInfo, kNumLinears>& info) {
  const std::vector<int> lins = LinearsOf(in);
  const int64_t k = L.k[lins[0]];
  const std::string name = L.name + "." + DecoderLinearNames()[lins[0]];
  if (rows < k) {  // the same in every layer: one message per input, not per layer
    std::string which;
    for (int i : lins) which += (which.empty() ? "" : ", ") + DecoderLinearNames()[i];
    messages_.insert("warning: GPTQ: every layer's " + which + " sees " + std::to_string(rows) +
                     " calibration tokens for in_features " + std::to_string(k) +
                     ": the Hessian is singular and only the damping makes it invertible; use more calibration data");
  }
  const int64_t copies = st_.actorder == GptqActOrder::kNone ? 2 : 3;  // H, the damped copy, the permuted H
  peak_bytes_ = std::max(peak_bytes_, copies * k * k * static_cast<int64_t>(sizeof(float)));
  if (!f.ok()) return f.error().WithContext("GPTQ " + name);
  if (f->retries > 0 || f->fallback_rtn)
    messages_.insert("GPTQ: " + name + ": the damped Hessian did not factorise " + std::to_string(f->retries) +
                     " time(s); " + (f->fallback_rtn ? "no damping below 1 did, so these linears are plain RTN"
                                                     : "dampening_frac " + std::to_string(f->dampening_frac) + " did"));
  for (int i : lins) {
    if (!L.spec[i]) continue;
    const DType dt = L.spec[i]->scale_dtype.value_or(L.dtype[i]);
    auto q = GptqQuantize(L.w[i]->data(), L.n[i], L.k[i], *f, *L.spec[i], dt, st_);
    if (!q.ok()) return q.error().WithContext("GPTQ " + L.name + "." + DecoderLinearNames()[i]);
    codes[i] = std::move(q).value();
    info[i] = {true, f->dampening_frac, f->retries, static_cast<int64_t>(f->dead.size()), f->fallback_rtn};
  }
  return Status::Ok();
}

Status GptqAlgorithm::Finish(const LayerRunner& runner, CalibLayer& L, LayerCodes& codes,
                             const std::function<Status()>& step) {
  std::array<GptqLinearInfo, kNumLinears> info{};
  const std::array<LayerInput, 4> inputs = {LayerInput::kAttnIn, LayerInput::kAttnConcat, LayerInput::kMlpIn,
                                            LayerInput::kMlpAct};
  if (!st_.true_sequential) {
    for (LayerInput in : inputs) {
      NIBBLE_RETURN_IF_ERROR(QuantizeInput(in, runner.acts().Of(in), runner.rows(), L, codes, info));
      NIBBLE_RETURN_IF_ERROR(step());
    }
  } else {
    // Each input from the layer with every linear before it already quantized (dequantized).
    CalibLayer deq = L.Clone();
    LayerActs acts;
    const LayerActs* a = &runner.acts();
    for (LayerInput in : inputs) {
      NIBBLE_RETURN_IF_ERROR(QuantizeInput(in, a->Of(in), runner.rows(), L, codes, info));
      NIBBLE_RETURN_IF_ERROR(step());
      for (int i : LinearsOf(in))
        if (codes[i]) DequantizeRef(*codes[i], deq.w[i]->data());
      if (in != LayerInput::kMlpAct) {
        runner.RunFresh(deq, runner.batch(), &acts);
        a = &acts;
      }
    }
  }
  infos_.push_back(info);
  return Status::Ok();
}

Status GptqAlgorithm::FinishGrams(LayerGrams& grams, const CalibLayer& L, LayerCodes& codes,
                                  const std::function<Status()>& step) {
  if (st_.true_sequential) return MakeError("GPTQ with true_sequential needs the calibration activations, not only XᵀX");
  constexpr std::array<LayerInput, 4> kInputs = {LayerInput::kAttnIn, LayerInput::kAttnConcat, LayerInput::kMlpIn,
                                                 LayerInput::kMlpAct};
  std::array<std::vector<float>, 4> g;
  std::array<bool, 4> has{};
  for (size_t j = 0; j < kInputs.size(); ++j) {
    g[j] = std::move(grams.Of(kInputs[j]));
    has[j] = !g[j].empty();
  }
  grams.g = {};
  // LAPACK factorises on one core. With more threads, one thread of its own factorises the
  // Hessians in input order (one LAPACK call at a time) while the OpenMP team runs the column
  // loops of the inputs already factorised: down_proj's factorisation, the largest, overlaps the
  // loops of q/k/v, o and gate/up. The factors are those of the sequential order.
  const bool ahead = omp_get_max_threads() > 1;
  std::array<std::promise<Result<GptqFactor>>, 4> promised;
  std::atomic<bool> stop{false};
  std::future<void> factorizer;  // declared after what it uses: joined first on every return
  if (ahead)
    factorizer = std::async(std::launch::async, [&] {
      for (size_t j = 0; j < kInputs.size(); ++j) {
        if (!has[j]) continue;
        if (stop.load()) {  // an early return (an error, a cancelled run) waits for no more of them
          promised[j].set_value(MakeError("GPTQ stopped before this Hessian's factorisation"));
          continue;
        }
        try {
          promised[j].set_value(FactorInput(kInputs[j], std::move(g[j]), grams.rows, L));
        } catch (...) {  // rethrown on the calling thread by get(), as the sequential path throws
          promised[j].set_exception(std::current_exception());
        }
      }
    });
  struct StopOnReturn {  // destroyed before `factorizer` joins
    std::atomic<bool>& stop;
    ~StopOnReturn() { stop.store(true); }
  } stop_on_return{stop};
  std::array<GptqLinearInfo, kNumLinears> info{};
  for (size_t j = 0; j < kInputs.size(); ++j) {
    if (has[j]) {
      Result<GptqFactor> f = ahead ? promised[j].get_future().get() : FactorInput(kInputs[j], std::move(g[j]), grams.rows, L);
      NIBBLE_RETURN_IF_ERROR(QuantizeWithFactor(kInputs[j], std::move(f), grams.rows, L, codes, info));
    }
    NIBBLE_RETURN_IF_ERROR(step());
  }
  infos_.push_back(info);
  return Status::Ok();
}

std::vector<std::string> GptqAlgorithm::Messages() const { return {messages_.begin(), messages_.end()}; }

namespace {

// A run's GPTQ settings (see ResolveGptq), with the names errors give them.
class GptqRunSettings final : public AlgorithmSettings {
 public:
  GptqRunSettings(const GptqSettings& s, const GptqSettingNames& names) : st_(s), names_(names) {}
  Propagation propagation() const override { return st_.propagation; }
  bool Chunkable() const override { return !st_.true_sequential; }  // (GptqAlgorithm::FinishGrams)
  bool NeedsGrams() const override { return true; }
  Status CheckExport(const FormatEntry& format, const std::string& model_export) const override {
    if (st_.actorder != GptqActOrder::kGroup || format.holds_g_idx) return Status::Ok();
    return MakeErrorCode(ErrorCode::kUnsupported, names_.actorder, " group needs a g_idx in the checkpoint; --model_export ",
                         model_export, " (", format.description, ") cannot hold one; use --model_export gptq or "
                         "compressed-tensors, or --actorder static (groups on the natural columns) or none");
  }
  std::unique_ptr<ChainAlgorithm> MakeAlgorithm() const override { return std::make_unique<GptqAlgorithm>(st_); }
  std::vector<MemoryPhase> MemoryPhases(const LayerMemoryShape& layer) const override;
  std::vector<nlohmann::ordered_json> AlgoConfig(const CalibResult&, const ModelConfig&) const override {
    return {GptqAlgoConfigEntry(st_)};
  }
  nlohmann::ordered_json ReportJson(const CalibResult& run) const override {
    return {{"dampening_frac", st_.dampening_frac}, {"block_size", st_.block_size},
            {"scale_timing", GptqScaleTimingName(st_.scale_timing)}, {"actorder", GptqActOrderName(st_.actorder)},
            {"true_sequential", st_.true_sequential}, {"hessian_peak_bytes", run.hessian_peak_bytes}};
  }

 private:
  GptqSettings st_;
  GptqSettingNames names_;
};

// Per distinct input (QuantizeInput), while its Hessian is factorised: the codes of the linears
// before it, H and its damped copy (and the permuted H under act-order), GramMatrix's per-thread
// blocks (K x 64, fp32 and double; a chunked layer instead: the Gram matrices still waiting, the
// damped copy of one being factorised ahead, and the chunk's forward scratch the runner keeps);
// then the column loop: the factor U, Wᵀ in fp32, the codes and the block's errors.
// true_sequential adds the dequantized layer and its activations.
std::vector<MemoryPhase> GptqRunSettings::MemoryPhases(const LayerMemoryShape& s) const {
  std::vector<MemoryPhase> out;
  int64_t codes_before = 0;
  // Chunked layers: the Gram matrices of the inputs not yet quantized wait beside the current one.
  std::array<int64_t, 4> gram{};
  for (int i = 0; i < kNumLinears; ++i)
    if (s.quantized[i]) gram[static_cast<size_t>(InputOf(i))] = s.k[i] * s.k[i] * 4;
  for (LayerInput in : {LayerInput::kAttnIn, LayerInput::kAttnConcat, LayerInput::kMlpIn, LayerInput::kMlpAct}) {
    const std::vector<int> lins = LinearsOf(in);
    int64_t later = 0;
    for (size_t j = static_cast<size_t>(in) + 1; j < gram.size(); ++j) later += gram[j];
    int64_t n_max = 0, codes = 0;
    int widest = lins[0];
    for (int i : lins) {
      if (!s.quantized[i]) continue;
      if (s.n[i] > n_max) widest = i;
      n_max = std::max(n_max, s.n[i]);
      codes += s.CodesBytes(i);
    }
    if (n_max == 0) continue;
    const int64_t k = s.k[lins[0]];
    const int64_t copies = st_.actorder == GptqActOrder::kNone ? 2 : 3;
    const int64_t factor = copies * k * k * 4;
    const int64_t loop = k * k * 4 + n_max * k * 5 + st_.block_size * n_max * 4;
    MemoryPhase p;
    p.name = "GPTQ of " + s.linear[lins[0]];
    if (factor >= loop)
      p.terms.push_back({"GPTQ Hessian of " + s.linear[lins[0]] + " " + Dims(k, k) + " fp32 and its damped copy" +
                             (copies == 3 ? " and the act-order permutation" : ""),
                         factor});
    else
      p.terms.push_back({"GPTQ column loop of " + s.linear[widest] + ": factor " + Dims(k, k) + " fp32, W^T and codes",
                         loop});
    if (s.chunked) {
      p.terms.push_back({"Gram matrices of the inputs after it", later});
      // FinishGrams factorises ahead on a thread of its own: the largest later one's damped copy.
      int64_t ahead = 0;
      for (size_t j = static_cast<size_t>(in) + 1; j < gram.size() && s.threads > 1; ++j)
        ahead = std::max(ahead, (copies - 1) * gram[j]);
      if (ahead > 0) p.terms.push_back({"a later Hessian's damped copy, factorised meanwhile", ahead});
      p.terms.push_back({"the fp pass's forward scratch of one chunk (kept)", s.chunk_rows * s.ScratchRowBytes()});
    } else p.terms.push_back({"Gram matrix blocks per thread", s.threads * k * 64 * 12});
    if (codes_before > 0) p.terms.push_back({"codes of the linears quantized before it", codes_before});
    if (st_.true_sequential) {
      int64_t w = 0;
      for (int i = 0; i < kNumLinears; ++i) w += s.WeightBytes(i);
      p.terms.push_back({"true_sequential: the dequantized layer and its activations", w + s.rows * s.ActsRowBytes()});
    }
    out.push_back(std::move(p));
    codes_before += codes;
  }
  return out;
}

}  // namespace

Result<std::shared_ptr<const AlgorithmSettings>> ResolveGptq(const AlgorithmFlags& flags, Propagation propagation,
                                                             const nlohmann::ordered_json* entry, const std::string& where) {
  GptqSettings s = flags.gptq;
  s.propagation = propagation;
  GptqSettingNames names;
  if (entry != nullptr) NIBBLE_RETURN_IF_ERROR(ApplyGptqAlgoConfig(*entry, where, s, names));
  NIBBLE_RETURN_IF_ERROR(ValidateGptqSettings(s, names));
  return std::shared_ptr<const AlgorithmSettings>(std::make_shared<GptqRunSettings>(s, names));
}

Status CheckGptqFlagsUnused(const AlgorithmFlags& flags, const std::string& chain) {
  if (flags.gptq.actorder != GptqActOrder::kNone)
    return MakeError("--actorder ", GptqActOrderName(flags.gptq.actorder), " is a GPTQ setting; --quant_algo ", chain,
                     " does not use it (use a chain with gptq, or drop --actorder)");
  return ValidateGptqSettings(flags.gptq);
}

nlohmann::ordered_json GptqAlgorithm::SaveState() const {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& infos : infos_) {
    nlohmann::ordered_json l = nlohmann::ordered_json::array();
    for (const GptqLinearInfo& g : infos)
      l.push_back({{"ran", g.ran}, {"dampening_frac", DoubleJson(g.dampening_frac)}, {"retries", g.retries},
                   {"dead_columns", g.dead_columns}, {"fallback_rtn", g.fallback_rtn}});
    layers.push_back(std::move(l));
  }
  return {{"infos", layers}, {"messages", messages_}, {"peak_bytes", peak_bytes_}};
}

Status GptqAlgorithm::LoadState(const nlohmann::ordered_json& j) {
  try {
    infos_.clear();
    for (const auto& l : j.at("infos")) {
      if (l.size() != kNumLinears) return MakeErrorCode(ErrorCode::kCorruptInput, "GPTQ state: a layer of ", l.size(), " linears");
      std::array<GptqLinearInfo, kNumLinears> infos{};
      for (size_t i = 0; i < infos.size(); ++i) {
        const auto& e = l[i];
        infos[i] = {e.at("ran").get<bool>(), DoubleFromJson(e.at("dampening_frac")), e.at("retries").get<int>(),
                    e.at("dead_columns").get<int64_t>(), e.at("fallback_rtn").get<bool>()};
      }
      infos_.push_back(infos);
    }
    messages_ = j.at("messages").get<std::set<std::string>>();
    peak_bytes_ = j.at("peak_bytes").get<int64_t>();
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, "GPTQ state: ", e.what());
  }
  return Status::Ok();
}

}  // namespace nibble
