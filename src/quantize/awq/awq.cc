// AWQ as a pipeline algorithm (see awq.h).
#include "quantize/awq/awq.h"

#include "model/llama.h"
#include "quantize/awq/clip.h"
#include "quantize/calibrated.h"

namespace nibble {

Result<std::unique_ptr<AwqAlgorithm>> AwqAlgorithm::Create(const AwqSettings& s) {
  NIBBLE_RETURN_IF_ERROR(ValidateAwqGrid(s, "AWQ"));
  std::unique_ptr<AwqAlgorithm> a(new AwqAlgorithm(s));
  for (const auto& m : s.scaling_layers) {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedMapping r, ResolveMapping(m));
    a->maps_.push_back(std::move(r));
  }
  return a;
}

std::string AwqAlgorithm::SkipReason(const ModelConfig& c, const ResolvedMapping& r, const CalibLayer& L) const {
  const auto& names = DecoderLinearNames();
  const int64_t kin = L.k[r.balance[0]];
  if (r.prev_op == AwqPrevOp::kLinear && L.n[r.prev_linear] < kin)
    return names[r.prev_linear] + " out_features " + std::to_string(L.n[r.prev_linear]) + " != " + r.mapping.layers[0] +
           " in_features " + std::to_string(kin) + (c.num_key_value_heads < c.num_attention_heads ? " (GQA)" : "");
  if (r.prev_op == AwqPrevOp::kLinear && r.prev_linear == kV && L.n[kV] != L.k[kO])
    return "v_proj out_features " + std::to_string(L.n[kV]) + " != o_proj in_features " + std::to_string(L.k[kO]);
  for (int i : r.balance)
    if (L.spec[i]) return "";
  return "no balance layer is quantized";
}

Status AwqAlgorithm::Transform(LayerRunner& runner, CalibLayer& L, const std::function<Status()>& step) {
  std::vector<AwqMappingReport> reps;
  for (const ResolvedMapping& r : maps_) {
    AwqMappingReport mr;
    mr.mapping = r.mapping;
    mr.skip_reason = SkipReason(runner.config(), r, L);
    mr.skipped = !mr.skip_reason.empty();
    if (mr.skipped) {
      messages_.insert("AWQ: skipped scaling_layers entry " + Describe(r.mapping) + ": " + mr.skip_reason +
                       ", as llm-compressor and AutoAWQ do");
    } else {
      const LayerActs& a = runner.Run(L, SearchStop(r));
      NIBBLE_ASSIGN_OR_RETURN(mr, SearchAndApply(runner, r, L, a, st_));
      if (ChangesAttention(r)) runner.InvalidateAttention();
      used_.insert(Describe(r.mapping));
    }
    reps.push_back(std::move(mr));
    NIBBLE_RETURN_IF_ERROR(step());
  }
  reports_.push_back(std::move(reps));
  return Status::Ok();
}

Status AwqAlgorithm::Finish(const LayerRunner& runner, CalibLayer& L, LayerCodes& codes,
                            const std::function<Status()>& step) {
  if (!st_.clip) return Status::Ok();
  for (int i = 0; i < kNumLinears; ++i) {
    if (!L.spec[i] || i == kQ || i == kK) continue;
    NIBBLE_RETURN_IF_ERROR(ClipLinear(L, i, runner.acts().Of(InputOf(i)), runner.rows()));
  }
  return Status::Ok();
}

std::vector<AwqMapping> AwqAlgorithm::Used() const {
  std::vector<AwqMapping> out;
  for (const auto& r : maps_)
    if (used_.count(Describe(r.mapping))) out.push_back(r.mapping);
  return out;
}

Result<AwqResult> RunAwq(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                         const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len, const AwqSettings& st,
                         const LayerTensorSink& sink, const std::function<void(int64_t, int64_t)>& progress,
                         const CancellationToken* cancel) {
  return RunCalibrated(mc, store, plan, tokens, batch, seq_len, st, std::nullopt, st.propagation, sink, progress, cancel);
}

}  // namespace nibble
