// AWQ as a pipeline algorithm (see awq.h).
#include "quantize/awq/awq.h"

#include "io/json.h"
#include "model/llama.h"
#include "quantize/awq/clip.h"
#include "quantize/awq/search.h"

namespace nibble {

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
  // The calibration linears, kept across mappings: a mapping remakes those it rescaled (a 16-bit
  // calibration's are rounded copies of the weights, hundreds of MB at 7B).
  CalibLinears lin = MakeLinears(L);
  for (const ResolvedMapping& r : maps_) {
    AwqMappingReport mr;
    mr.mapping = r.mapping;
    mr.skip_reason = SkipReason(runner.config(), r, L);
    mr.skipped = !mr.skip_reason.empty();
    if (mr.skipped) {
      messages_.insert("AWQ: skipped scaling_layers entry " + Describe(r.mapping) + ": " + mr.skip_reason +
                       ", as llm-compressor and AutoAWQ do");
    } else {
      const CapturedRows& a = runner.Capture(L, lin, SearchStop(r), SearchNeeds(r, st_, L, runner.rows()));
      NIBBLE_ASSIGN_OR_RETURN(mr, SearchAndApply(runner, r, L, lin, a, st_));
      for (int i : RescaledLinears(r)) {
        lin[i].reset();  // (its pages are free before the copy's are taken)
        lin[i] = MakeCalibLinear(L.n[i], L.k[i], L.w[i], L.bias[i], L.calib);
      }
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

Status AwqAlgorithm::FinishGrams(LayerGrams&, const CalibLayer&, LayerCodes&, const std::function<Status()>&) {
  if (st_.clip) return MakeError("the AWQ clip search needs the calibration activations, not only their Gram matrices");
  return Status::Ok();
}

std::vector<AwqMapping> AwqAlgorithm::Used() const {
  std::vector<AwqMapping> out;
  for (const auto& r : maps_)
    if (used_.count(Describe(r.mapping))) out.push_back(r.mapping);
  return out;
}

namespace {

// A run's AWQ settings (see ResolveAwq).
class AwqRunSettings final : public AlgorithmSettings {
 public:
  AwqRunSettings(const AwqSettings& s, std::vector<ResolvedMapping> maps) : st_(s), maps_(std::move(maps)) {}
  Propagation propagation() const override { return st_.propagation; }
  bool reuse_attention() const override { return st_.reuse_attention; }
  bool Chunkable() const override { return !st_.clip; }  // (AwqAlgorithm::FinishGrams)
  std::unique_ptr<ChainAlgorithm> MakeAlgorithm() const override { return std::make_unique<AwqAlgorithm>(st_, maps_); }
  std::vector<MemoryPhase> MemoryPhases(const LayerMemoryShape& layer) const override;
  bool KeepsAttention(const LayerMemoryShape& layer) const override;
  std::vector<nlohmann::ordered_json> AlgoConfig(const CalibResult& run, const ModelConfig& mc) const override {
    nlohmann::ordered_json list = AwqAlgoConfigJson(st_, run.awq_used, mc);
    return {list.begin(), list.end()};
  }
  nlohmann::ordered_json ReportJson(const CalibResult&) const override {
    return {{"clip", st_.clip}, {"duo_scaling", DuoScalingName(st_.duo_scaling)}, {"n_grid", st_.n_grid}};
  }

 private:
  // Whether mapping r's search runs on layer s (AwqAlgorithm::SkipReason's shape checks).
  static bool Searched(const LayerMemoryShape& s, const ResolvedMapping& r);
  // Per searched mapping of a chunked layer, whether a kept attention residual exists while it
  // runs (a Capture that keeps it, SearchNeeds, or one kept before), and after the last one.
  std::vector<bool> HeldAttention(const LayerMemoryShape& s, bool* after) const;
  AwqSettings st_;
  std::vector<ResolvedMapping> maps_;
};

bool AwqRunSettings::Searched(const LayerMemoryShape& s, const ResolvedMapping& r) {
  if (r.prev_op == AwqPrevOp::kLinear && s.n[r.prev_linear] < s.k[r.balance[0]]) return false;  // (GQA)
  return std::any_of(r.balance.begin(), r.balance.end(), [&](int i) { return s.quantized[i]; });
}

std::vector<bool> AwqRunSettings::HeldAttention(const LayerMemoryShape& s, bool* after) const {
  std::vector<bool> held;
  bool kept = false;
  for (const ResolvedMapping& r : maps_) {
    if (!Searched(s, r)) continue;
    const bool keeps = st_.reuse_attention && !ChangesAttention(r) && SearchStop(r) >= LayerStop::kAttnResidual;
    held.push_back(kept || keeps);
    kept = held.back() && !ChangesAttention(r);
  }
  *after = kept;
  return held;
}

bool AwqRunSettings::KeepsAttention(const LayerMemoryShape& s) const {
  bool after = false;
  if (s.chunked) HeldAttention(s, &after);
  return after;
}

// A chunked layer's search of mapping r (LayerRunner::Capture on a chunked runner), in two
// phases: the capture pass (the layer's 16-bit calibration linears, one chunk's input, captures
// and scratch, and what it keeps: the inspected linear's Gram matrix, or the inspected module's
// input rows in 16 bits), then the search (the candidates; the module's fp output over every row
// and each thread's chunk input, output and scratch, or the Gram loss's per-thread blocks).
// Where the calibration dtype decides between the Gram loss and the direct one (AwqGramLoss),
// the larger of the two.
std::vector<MemoryPhase> ChunkedSearchPhases(const LayerMemoryShape& s, const ResolvedMapping& r, const AwqSettings& st,
                                             int64_t chunk_rows, bool held_attention) {
  int64_t w = 0;
  for (int i = 0; i < kNumLinears; ++i) w += s.WeightBytes(i);
  const MemoryTerm lin{"16-bit copy of its weights (calibration linears)", w / 2};
  const int64_t kin = s.k[r.balance[0]];
  const bool linear = r.inspect == AwqInspect::kLinear;
  const int64_t od = linear ? s.n[r.inspect_linear] : s.hidden, xin = linear ? s.k[r.inspect_linear] : s.hidden;
  const MemoryTerm gram{"AWQ Gram matrix of " + s.linear[r.inspect_linear < 0 ? 0 : r.inspect_linear] + " inputs " +
                            Dims(xin, xin) + " fp32",
                        xin * xin * 4 + chunk_rows * xin * 2};
  const MemoryTerm stored{"AWQ inspected input " + Dims(s.rows, xin) + " 16-bit and its fp32 output " + Dims(s.rows, od),
                          s.rows * xin * 2 + s.rows * od * 4};
  const bool may_gram = linear && (AwqGramLoss(st, CalibDType::kBf16, s.rows, kin) || AwqGramLoss(st, CalibDType::kFp16, s.rows, kin));
  const bool may_direct = !linear || !AwqGramLoss(st, CalibDType::kFp16, s.rows, kin);
  const MemoryTerm kept = !may_gram ? stored : !may_direct ? gram : (gram.bytes > stored.bytes ? gram : stored);
  const int64_t blocks = (s.rows + 1023) / 1024;
  const MemoryTerm capture{"capture pass: one chunk of " + std::to_string(chunk_rows) + " rows and the mean |x| sums",
                           chunk_rows * (s.ActsRowBytes() + s.ScratchRowBytes() + s.hidden * 4) + blocks * kin * 8};
  // The candidates (search.cc CandidateLinears): bf16 bits of each quantized balance layer in a
  // bf16 calibration, else fp32 values and the fp16 linear's rounded copy; the Gram loss makes
  // only the inspected linear's, in fp32.
  int64_t cand = 0, cand_gram = 0;
  for (int i : r.balance)
    if (s.quantized[i]) cand += s.bf16 ? s.WeightBytes(i) / 2 : 2 * s.WeightBytes(i);
  if (linear && s.quantized[r.inspect_linear]) cand_gram = s.WeightBytes(r.inspect_linear);
  const MemoryTerm candidates{"AWQ candidate weights of " + Describe(r.mapping),
                              may_direct ? std::max(cand, may_gram ? cand_gram : 0) : cand_gram};
  const MemoryTerm threads{"AWQ per-thread chunks: input, output and forward scratch",
                           may_direct ? s.threads * chunk_rows * (xin * 4 + od * 4 + s.ScratchRowBytes(false))
                                      : s.threads * 256 * xin * 8};
  const std::string m = Describe(r.mapping) + " (" + s.name + ")";
  std::vector<MemoryPhase> out = {{"AWQ capture " + m, {lin, kept, capture}}, {"AWQ " + m, {lin, kept, candidates, threads}}};
  if (held_attention)
    for (MemoryPhase& p : out) p.terms.push_back({"kept attention residual " + Dims(s.rows, s.hidden) + " fp32", s.rows * s.hidden * 4});
  return out;
}

// Per mapping's search (SearchAndApply): each candidate's balance weights W·s quantized and
// dequantized (kept for the candidate's linears) with one linear's transient copies (W·s, the
// dequantized values and codes); a single inspected linear's Gram matrix of its inputs, or the
// inspected module's fp output over every row with each thread's chunk output and forward
// scratch (a chunked layer: ChunkedSearchPhases). The clip search (--awq_clip) holds two more
// copies of one linear.
std::vector<MemoryPhase> AwqRunSettings::MemoryPhases(const LayerMemoryShape& s) const {
  std::vector<MemoryPhase> out;
  const int64_t chunk_rows = std::min(s.rows, std::max<int64_t>(1, kAwqInspectChunkRows / s.seq_len) * s.seq_len);
  if (s.chunked) {
    bool after = false;
    const std::vector<bool> held = HeldAttention(s, &after);
    size_t m = 0;
    for (const ResolvedMapping& r : maps_)
      if (Searched(s, r))
        for (MemoryPhase& q : ChunkedSearchPhases(s, r, st_, chunk_rows, held[m++])) out.push_back(std::move(q));
    return out;  // (no clip search: a chunked layer runs without it)
  }
  for (const ResolvedMapping& r : maps_) {
    if (!Searched(s, r)) continue;
    const int64_t kin = s.k[r.balance[0]];
    MemoryPhase p;
    p.name = "AWQ " + Describe(r.mapping) + " (" + s.name + ")";
    int64_t kept = 0, transient = 0;
    for (int i : r.balance) {
      if (!s.quantized[i]) continue;
      kept += s.WeightBytes(i);
      transient = std::max(transient, 2 * s.WeightBytes(i) + s.CodesBytes(i));
    }
    p.terms.push_back({"AWQ candidate weights of " + Describe(r.mapping), kept + transient});
    const int64_t od = r.inspect == AwqInspect::kLinear ? s.n[r.inspect_linear] : s.hidden;
    const MemoryTerm direct{"AWQ inspected output " + Dims(s.rows, od) + " fp32 and per-thread chunks",
                            s.rows * od * 4 + s.threads * chunk_rows * (od * 4 + s.ScratchRowBytes(false))};
    if (r.inspect == AwqInspect::kLinear && st_.gram_linear_loss) {
      const MemoryTerm gram{"AWQ Gram matrix of " + s.linear[r.inspect_linear] + " inputs " + Dims(kin, kin) + " fp32",
                            kin * kin * 4 + s.threads * kin * 64 * 12};
      // The shape does not say the calibration dtype: where a 16-bit one would run the candidate
      // forward instead (AwqGramLoss), the larger of the two.
      const bool may_run_direct = !AwqGramLoss(st_, CalibDType::kBf16, s.rows, kin);
      p.terms.push_back(may_run_direct && direct.bytes > gram.bytes ? direct : gram);
    } else {
      p.terms.push_back(direct);
    }
    out.push_back(std::move(p));
  }
  if (st_.clip) {
    int64_t w = 0;
    for (int i = 0; i < kNumLinears; ++i)
      if (s.quantized[i] && i != kQ && i != kK) w = std::max(w, s.WeightBytes(i));
    if (w > 0) out.push_back({"AWQ clip (" + s.name + ")", {{"AWQ clip: two copies of the largest linear", 2 * w}}});
  }
  return out;
}

}  // namespace

Result<std::shared_ptr<const AlgorithmSettings>> ResolveAwq(const AlgorithmFlags& flags, Propagation propagation,
                                                            const nlohmann::ordered_json* entry, const std::string& where) {
  AwqSettings s = flags.awq;
  s.propagation = propagation;
  AwqSettingNames names;
  if (entry != nullptr) NIBBLE_RETURN_IF_ERROR(ApplyAwqAlgoConfig(*entry, where, s, names));
  NIBBLE_RETURN_IF_ERROR(ValidateAwqSettings(s, names));
  std::vector<ResolvedMapping> maps;
  for (const auto& m : s.scaling_layers) {
    Result<ResolvedMapping> r = ResolveMapping(m);
    if (!r.ok()) return r.error().WithContext("AWQ");
    maps.push_back(std::move(r).value());
  }
  return std::shared_ptr<const AlgorithmSettings>(std::make_shared<AwqRunSettings>(s, std::move(maps)));
}

Status CheckAwqFlagsUnused(const AlgorithmFlags& flags, const std::string&) { return ValidateAwqSettings(flags.awq); }

nlohmann::ordered_json AwqAlgorithm::SaveState() const {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& reps : reports_) {
    nlohmann::ordered_json l = nlohmann::ordered_json::array();
    for (const AwqMappingReport& r : reps)
      l.push_back({{"prev_op", r.mapping.prev_op}, {"layers", r.mapping.layers}, {"inp", r.mapping.inp},
                   {"module2inspect", r.mapping.module2inspect}, {"skipped", r.skipped}, {"skip_reason", r.skip_reason},
                   {"ratio", DoubleJson(r.ratio)}, {"duo", r.duo}, {"loss_rtn", DoubleJson(r.loss_rtn)},
                   {"loss_best", DoubleJson(r.loss_best)}, {"rejected", r.rejected}, {"stopped_early", r.stopped_early},
                   {"scale_min", DoubleJson(r.scale_min)}, {"scale_max", DoubleJson(r.scale_max)}});
    layers.push_back(std::move(l));
  }
  return {{"reports", layers}, {"used", used_}, {"messages", messages_}};
}

Status AwqAlgorithm::LoadState(const nlohmann::ordered_json& j) {
  try {
    reports_.clear();
    for (const auto& l : j.at("reports")) {
      std::vector<AwqMappingReport> reps;
      for (const auto& e : l) {
        AwqMappingReport r;
        r.mapping = {e.at("prev_op").get<std::string>(), e.at("layers").get<std::vector<std::string>>(),
                     e.at("inp").get<std::string>(), e.at("module2inspect").get<std::string>()};
        r.skipped = e.at("skipped").get<bool>();
        r.skip_reason = e.at("skip_reason").get<std::string>();
        r.ratio = DoubleFromJson(e.at("ratio"));
        r.duo = e.at("duo").get<bool>();
        r.loss_rtn = DoubleFromJson(e.at("loss_rtn"));
        r.loss_best = DoubleFromJson(e.at("loss_best"));
        r.rejected = e.at("rejected").get<int64_t>();
        r.stopped_early = e.at("stopped_early").get<int64_t>();
        r.scale_min = DoubleFromJson(e.at("scale_min"));
        r.scale_max = DoubleFromJson(e.at("scale_max"));
        reps.push_back(std::move(r));
      }
      reports_.push_back(std::move(reps));
    }
    used_ = j.at("used").get<std::set<std::string>>();
    messages_ = j.at("messages").get<std::set<std::string>>();
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, "AWQ state: ", e.what());
  }
  return Status::Ok();
}

}  // namespace nibble
