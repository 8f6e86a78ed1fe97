#include "quantize/plan.h"

#include <algorithm>
#include <map>

#include "formats/quark_format.h"
#include "model/llama.h"

namespace nibble {

const PlannedLinear* QuantizePlan::Find(const std::string& module) const {
  for (const PlannedLinear& l : linears)
    if (l.module == module) return &l;
  return nullptr;
}

std::vector<std::string> QuantizePlan::WrittenModules() const {
  std::vector<std::string> out;
  for (const PlannedLinear& l : linears)
    if (l.written) out.push_back(l.module);
  return out;
}

std::vector<LinearShapeInfo> QuantizePlan::WrittenShapes() const {
  std::vector<LinearShapeInfo> out;
  for (const PlannedLinear& l : linears)
    if (l.written) out.push_back({l.module, l.n, l.k});
  return out;
}

std::vector<LinearPlan> QuantizePlan::WrittenPlans() const {
  std::vector<LinearPlan> out;
  for (const PlannedLinear& l : linears)
    if (l.written) out.push_back({l.spec, l.rule});
  return out;
}

void QuantizePlan::SetScaleDType(DType dt) {
  nibble::SetScaleDType(config, dt);
  for (PlannedLinear& l : linears)
    if (l.spec) l.spec->scale_dtype = dt;
}

namespace {

// The per-channel replacement used by MisalignedPolicy::kPerChannel: one group per row written as
// per_group with group_size = K, which every Quark W4A16 loader accepts (vLLM requires a positive
// group_size).
WeightQuantSpec PerRowSpec(const WeightQuantSpec& s, int64_t k) {
  WeightQuantSpec r = s;
  r.qscheme = QScheme::kPerGroup;
  r.ch_axis = 1;
  r.group_size = k;
  return r;
}

// Applies the misaligned-K policy to `cfg` for every linear (n, k read from its weight tensor);
// `rules` gets the report's rule for each module the policy changed (the config names each one,
// which would read as a user's per-layer override).
Status ApplyMisalignedPolicy(MisalignedPolicy policy, std::vector<PlannedLinear>& linears, const TensorStore& store,
                             QuarkQuantConfig& cfg, std::map<std::string, std::string>& rules) {
  for (PlannedLinear& l : linears) {
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* w, store.Get(l.weight));
    if (w->shape.size() != 2) return MakeError(w->file, ": tensor ", w->name, " has shape ", w->ShapeString(), ", expected 2-D");
    l.n = w->shape[0];
    l.k = w->shape[1];
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(cfg, l.module));
    if (!r.spec) continue;
    const int64_t g = r.spec->EffectiveGroupSize(l.k);
    if (l.k % g == 0) continue;
    switch (policy) {
      case MisalignedPolicy::kError:
        return MakeError("layer ", l.module, ": in_features K = ", l.k, " is not divisible by group_size ", g, " (", r.rule,
                         "); use --misaligned exclude|per_channel, --exclude_layers, or a --layer_quant_config override");
      case MisalignedPolicy::kExclude:
        cfg.exclude.push_back(l.module);
        rules[l.module] = "excluded by --misaligned exclude: in_features not a multiple of group_size " + std::to_string(g);
        break;
      case MisalignedPolicy::kPerChannel:
        cfg.layer_quant_config.insert(cfg.layer_quant_config.begin(), {l.module, PerRowSpec(*r.spec, l.k)});
        rules[l.module] = "--misaligned per_channel (one scale per row: in_features not a multiple of group_size " +
                          std::to_string(g) + ")";
        break;
    }
  }
  return Status::Ok();
}

// Refuses a plan in which no written linear is quantized (it would be a float model labelled as a
// quantized format), naming the config rules (`config_rules`, as ResolveQuarkLinear states them,
// in linear order) that kept each one in float.
Status CheckSomethingQuantized(const std::vector<PlannedLinear>& linears, const std::vector<std::string>& config_rules) {
  std::map<std::string, int64_t> reasons;
  int64_t written = 0;
  for (size_t i = 0; i < linears.size(); ++i) {
    if (!linears[i].written) continue;
    if (linears[i].spec) return Status::Ok();
    ++written;
    ++reasons[config_rules[i]];
  }
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [rule, count] : reasons) by_count.emplace_back(-count, rule);
  std::sort(by_count.begin(), by_count.end());
  std::string why;
  for (size_t i = 0; i < by_count.size() && i < 3; ++i)
    why += (i ? ", " : "") + std::to_string(-by_count[i].first) + " " + by_count[i].second;
  if (by_count.size() > 3) why += ", and " + std::to_string(by_count.size() - 3) + " more rules";
  return MakeError("no linear layer would be quantized (", written, " kept in float: ", why,
                   "); nothing to export as a quantized checkpoint");
}

}  // namespace

Result<QuantizePlan> MakeQuantizePlan(const QuarkQuantConfig& config, AlgorithmPlan algorithms, MisalignedPolicy policy,
                                      const ModelConfig& mc, const TensorStore& store, const OutputProjection& proj) {
  QuantizePlan plan;
  plan.config = config;
  plan.algorithms = std::move(algorithms);
  // Every model has an lm_head; a tied one's is the embedding (FindOutputProjection).
  for (const std::string& m : LinearModuleNames(mc, true)) {
    PlannedLinear l;
    l.module = m;
    l.weight = m == "lm_head" ? proj.FloatTensor() : m + ".weight";
    plan.linears.push_back(std::move(l));
  }
  std::map<std::string, std::string> policy_rules;
  NIBBLE_RETURN_IF_ERROR(ApplyMisalignedPolicy(policy, plan.linears, store, plan.config, policy_rules));
  std::vector<std::string> config_rules;
  for (PlannedLinear& l : plan.linears) {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan r, ResolveQuarkLinear(plan.config, l.module));
    l.spec = std::move(r.spec);
    const auto changed = policy_rules.find(l.module);
    l.rule = changed != policy_rules.end() ? changed->second : r.rule;
    config_rules.push_back(std::move(r.rule));
  }
  // A tied head kept in float stays the embedding: no lm_head module is written.
  PlannedLinear& head = plan.linears.back();
  plan.head_from_embedding = proj.tied && head.spec.has_value();
  head.written = !proj.tied || plan.head_from_embedding;
  NIBBLE_RETURN_IF_ERROR(CheckSomethingQuantized(plan.linears, config_rules));
  return plan;
}

std::string LayerPrefix(const std::string& name) {
  if (!name.starts_with("model.layers.")) return "";
  const size_t dot = name.find('.', 13);
  return dot == std::string::npos ? "" : name.substr(0, dot + 1);
}

}  // namespace nibble
