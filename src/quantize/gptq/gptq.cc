// GPTQ as a pipeline algorithm (see gptq.h).
#include "quantize/gptq/gptq.h"

#include <algorithm>

#include "model/llama.h"
#include "quantize/calibrated.h"
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

Result<std::unique_ptr<GptqAlgorithm>> GptqAlgorithm::Create(const GptqSettings& s) {
  NIBBLE_RETURN_IF_ERROR(ValidateGptqSettings(s, "GPTQ"));
  return std::unique_ptr<GptqAlgorithm>(new GptqAlgorithm(s));
}

Status GptqAlgorithm::QuantizeInput(LayerInput in, const float* x, int64_t rows, const CalibLayer& L, LayerCodes& codes,
                                    std::array<GptqLinearInfo, kNumLinears>& info) {
  const std::vector<int> lins = LinearsOf(in);
  bool any = false;
  for (int i : lins) any = any || L.spec[i].has_value();
  if (!any) return Status::Ok();
  const int64_t k = L.k[lins[0]];
  const std::string name = L.name + "." + DecoderLinearNames()[lins[0]];
  if (rows < k)
    messages_.insert("warning: GPTQ: " + name + " (and the linears sharing its input) sees " + std::to_string(rows) +
                     " calibration tokens for in_features " + std::to_string(k) +
                     ": the Hessian is singular and only the damping makes it invertible; use more calibration data");
  std::vector<float> h = GramMatrix(x, rows, k, GramFill::kLowerMirrored);
  const float scale = 2.0f / static_cast<float>(rows);
  for (float& v : h) v *= scale;
  const int64_t copies = st_.actorder == GptqActOrder::kNone ? 2 : 3;  // H, the damped copy, the permuted H
  peak_bytes_ = std::max(peak_bytes_, copies * k * k * static_cast<int64_t>(sizeof(float)));
  auto f = FactorGptqHessian(std::move(h), k, st_);
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

std::vector<std::string> GptqAlgorithm::Messages() const { return {messages_.begin(), messages_.end()}; }

Result<GptqResult> RunGptq(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                           const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len, const GptqSettings& st,
                           const std::optional<AwqSettings>& awq, const LayerTensorSink& sink,
                           const std::function<void(int64_t, int64_t)>& progress,
                           const CancellationToken* cancel) {
  return RunCalibrated(mc, store, plan, tokens, batch, seq_len, awq, st, st.propagation, sink, progress, cancel);
}

}  // namespace nibble
