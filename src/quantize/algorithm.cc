// The algorithm registry and the chain rules (see algorithm.h).
#include "quantize/algorithm.h"

#include <algorithm>

#include "quantize/awq/awq.h"
#include "quantize/gptq/gptq.h"

namespace nibble {

const std::vector<QuantAlgorithm>& QuantAlgorithms() {
  static const std::vector<QuantAlgorithm> kAll = {
      {"rtn", "RTN", "RTN (round to nearest)", "RTN rounding", CalibrationNeed::kNone, AlgorithmRole::kRounding,
       Propagation::kFp, nullptr, nullptr},
      {"awq", "AWQ", "AWQ (activation-aware scaling)", "AWQ scaling", CalibrationNeed::kLayerInputs,
       AlgorithmRole::kSmoothing, Propagation::kFp, ResolveAwq, CheckAwqFlagsUnused},
      {"gptq", "GPTQ", "GPTQ (error-compensating rounding)", "GPTQ rounding", CalibrationNeed::kLayerInputs,
       AlgorithmRole::kRounding, Propagation::kQuantized, ResolveGptq, CheckGptqFlagsUnused},
  };
  return kAll;
}

namespace {

std::string JoinNames(const std::vector<const QuantAlgorithm*>& chain) {
  std::string out;
  for (const QuantAlgorithm* a : chain) out += (out.empty() ? "" : ",") + std::string(a->name);
  return out;
}

// The rules a chain of known, distinct names must follow (see ParseAlgorithmChain).
Status CheckChainOrder(const std::vector<const QuantAlgorithm*>& chain) {
  const QuantAlgorithm* rounding = nullptr;
  for (const QuantAlgorithm* a : chain) {
    if (chain.size() > 1 && a->calibration == CalibrationNeed::kNone) {
      std::vector<const QuantAlgorithm*> rest;
      for (const QuantAlgorithm* b : chain)
        if (b != a) rest.push_back(b);
      return MakeError(a->name, " runs alone, not in a chain: the linears no algorithm of a chain rounds get RTN "
                       "anyway (use ", JoinNames(rest), ")");
    }
    if (a->role == AlgorithmRole::kSmoothing && rounding != nullptr) {
      std::vector<const QuantAlgorithm*> fixed = chain;
      std::stable_partition(fixed.begin(), fixed.end(),
                            [](const QuantAlgorithm* b) { return b->role == AlgorithmRole::kSmoothing; });
      return MakeError(a->name, " changes the float weights, so it runs before ", rounding->name,
                       ", which rounds them (use ", JoinNames(fixed), ")");
    }
    if (a->role == AlgorithmRole::kRounding && rounding != nullptr)
      return MakeError(rounding->name, " and ", a->name, " both choose the codes: a chain has one rounding algorithm");
    if (a->role == AlgorithmRole::kRounding) rounding = a;
  }
  return Status::Ok();
}

// The first entry of a Quark algo_config (a list, or a legacy single object) whose "name" is
// `name`, and "algo_config[i]" naming it; nullptr when there is none.
const nlohmann::ordered_json* FindAlgoConfigEntry(const nlohmann::ordered_json& algo_config, const std::string& name,
                                                  std::string* where) {
  if (algo_config.is_null()) return nullptr;
  if (!algo_config.is_array()) {
    *where = "algo_config[0]";
    return algo_config.is_object() && algo_config.value("name", nlohmann::ordered_json()) == name ? &algo_config : nullptr;
  }
  for (size_t e = 0; e < algo_config.size(); ++e) {
    const auto& j = algo_config[e];
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>() != name) continue;
    *where = "algo_config[" + std::to_string(e) + "]";
    return &j;
  }
  return nullptr;
}

}  // namespace

Result<std::vector<const QuantAlgorithm*>> ParseAlgorithmChain(const std::string& text) {
  std::string known;
  for (const QuantAlgorithm& a : QuantAlgorithms()) known += (known.empty() ? "" : ", ") + std::string(a.name);
  std::vector<const QuantAlgorithm*> chain;
  for (size_t pos = 0;;) {
    const size_t end = text.find_first_of(",+", pos);
    const std::string name = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    const QuantAlgorithm* found = nullptr;
    for (const QuantAlgorithm& a : QuantAlgorithms())
      if (name == a.name) found = &a;
    if (found == nullptr)
      return MakeErrorCode(ErrorCode::kUnsupported, name.empty() ? std::string("empty algorithm name") : "unknown algorithm \"" + name + "\"",
                           " (known: ", known, "; a chain joins several with , or + in the order they run)");
    if (std::find(chain.begin(), chain.end(), found) != chain.end())
      return MakeError(name, " appears twice: a chain runs each algorithm once per layer");
    chain.push_back(found);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  NIBBLE_RETURN_IF_ERROR(CheckChainOrder(chain));
  return chain;
}

Result<AlgorithmPlan> ResolveAlgorithms(const std::vector<const QuantAlgorithm*>& chain, const AlgorithmFlags& flags,
                                        const nlohmann::ordered_json& algo_config) {
  const std::string name = JoinNames(chain);
  for (const QuantAlgorithm& a : QuantAlgorithms())
    if (a.check_unused != nullptr && std::find(chain.begin(), chain.end(), &a) == chain.end())
      NIBBLE_RETURN_IF_ERROR(a.check_unused(flags, name));
  const Propagation prop = flags.propagation.value_or(chain.empty() ? Propagation::kFp : chain.back()->default_propagation);
  AlgorithmPlan plan;
  plan.calib_dtype = flags.calib_dtype;
  for (const QuantAlgorithm* a : chain) {
    PlannedAlgorithm p{a, nullptr};
    if (a->resolve != nullptr) {
      std::string where;
      const nlohmann::ordered_json* entry = FindAlgoConfigEntry(algo_config, a->name, &where);
      NIBBLE_ASSIGN_OR_RETURN(p.settings, a->resolve(flags, prop, entry, where));
    }
    plan.chain.push_back(std::move(p));
  }
  return plan;
}

std::string AlgorithmPlan::Name() const {
  std::string out;
  for (const PlannedAlgorithm& p : chain) out += (out.empty() ? "" : ",") + std::string(p.algo->name);
  return out;
}

std::string AlgorithmPlan::Label() const {
  std::string out;
  for (const PlannedAlgorithm& p : chain) out += (out.empty() ? "" : "+") + std::string(p.algo->label);
  return out;
}

bool AlgorithmPlan::Calibrated() const {
  for (const PlannedAlgorithm& p : chain)
    if (p.algo->calibration != CalibrationNeed::kNone) return true;
  return false;
}

Propagation AlgorithmPlan::propagation() const {
  for (auto p = chain.rbegin(); p != chain.rend(); ++p)
    if (p->settings) return p->settings->propagation();
  return Propagation::kFp;
}

bool AlgorithmPlan::ReuseAttention() const {
  for (const PlannedAlgorithm& p : chain)
    if (p.settings && !p.settings->reuse_attention()) return false;
  return true;
}

bool AlgorithmPlan::ChunkedLayers(const ModelConfig& mc) const {
  return ResolveCalibDType(calib_dtype, mc) != CalibDType::kFp32 && !chain.empty() &&
         std::all_of(chain.begin(), chain.end(), [](const PlannedAlgorithm& p) { return p.settings && p.settings->Chunkable(); });
}

bool AlgorithmPlan::NeedsGrams() const {
  return std::any_of(chain.begin(), chain.end(), [](const PlannedAlgorithm& p) { return p.settings && p.settings->NeedsGrams(); });
}

std::string AlgorithmPlan::CardLine() const {
  if (chain.size() == 1) return chain[0].algo->card;
  std::string out;
  for (const PlannedAlgorithm& p : chain) out += (out.empty() ? "" : ", then ") + std::string(p.algo->card_in_chain);
  return out;
}

Status AlgorithmPlan::CheckExport(const FormatEntry& format, const std::string& model_export) const {
  for (const PlannedAlgorithm& p : chain)
    if (p.settings) NIBBLE_RETURN_IF_ERROR(p.settings->CheckExport(format, model_export));
  return Status::Ok();
}

std::vector<std::unique_ptr<ChainAlgorithm>> AlgorithmPlan::MakeAlgorithms() const {
  std::vector<std::unique_ptr<ChainAlgorithm>> out;
  for (const PlannedAlgorithm& p : chain)
    if (p.settings) out.push_back(p.settings->MakeAlgorithm());
  return out;
}

nlohmann::ordered_json AlgorithmPlan::AlgoConfig(const CalibResult& run, const ModelConfig& mc) const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const PlannedAlgorithm& p : chain)
    if (p.settings)
      for (nlohmann::ordered_json& e : p.settings->AlgoConfig(run, mc)) out.push_back(std::move(e));
  return out;
}

nlohmann::ordered_json AlgorithmPlan::ReportJson(const CalibResult& run) const {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const PlannedAlgorithm& p : chain)
    if (p.settings) out[p.algo->name] = p.settings->ReportJson(run);
  return out;
}

}  // namespace nibble
