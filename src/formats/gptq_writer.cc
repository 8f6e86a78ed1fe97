// The GPTQ writer (layout in gptq_format.h). The request is in Quark's vocabulary; a GPTQ config
// has one global spec and no exclude list, so every other decision becomes a `dynamic` entry by
// exact name, which GPTQModel (Transformers' GPTQ backend) and vLLM honour.
#include <algorithm>
#include <atomic>
#include <map>
#include <string_view>

#include "formats/gptq_config.h"
#include "formats/gptq_format.h"
#include "formats/packed_linear.h"
#include "formats/quark_format.h"
#include "formats/quark_pack.h"

namespace nibble {

std::string RegexEscape(const std::string& name) {
  std::string out;
  for (char ch : name) {
    if (std::string_view("\\.^$|?*+()[]{}").find(ch) != std::string_view::npos) out += '\\';
    out += ch;
  }
  return out;
}

namespace {

// An exact module name as a dynamic pattern. re.match anchors the start; "(\.|$)" ends it at the
// module, and still matches the tensor names ("P.qweight") ONNX Runtime GenAI matches against.
std::string ExactPattern(const std::string& module) { return "^" + RegexEscape(module) + "(\\.|$)"; }

struct Choice {
  int64_t group_size = 128;
  bool sym = true;
  bool operator==(const Choice&) const = default;
  auto operator<=>(const Choice&) const = default;
};

Choice ChoiceOf(const QuantSpec& q) {
  return {q.granularity == Granularity::kPerChannel ? -1 : q.group_size, q.symmetric};
}

class GptqWriter final : public FormatWriter {
 public:
  GptqWriter(bool v2, Choice base, bool lm_head, nlohmann::ordered_json dynamic)
      : v2_(v2), base_(base), lm_head_(lm_head), dynamic_(std::move(dynamic)) {}
  Result<std::vector<TensorToWrite>> WriteLinear(const std::string& module, const Int4Matrix& m, const QuantSpec& spec,
                                                 DType scale_dtype) const override;
  std::optional<std::vector<TensorSlot>> LinearLayout(const std::string& module, int64_t n, int64_t k, const QuantSpec& spec,
                                                      DType) const override {
    const int64_t g = spec.EffectiveGroupSize(k);
    if (spec.act_order || n < 1 || k < 1 || n % 8 != 0 || k % 8 != 0 || g < 1 || k % g != 0) return std::nullopt;
    return std::vector<TensorSlot>{{module + ".qweight", DType::kI32, {k / 8, n}},
                                   {module + ".qzeros", DType::kI32, {k / g, n / 8}},
                                   {module + ".scales", DType::kF16, {k / g, n}},
                                   {module + ".g_idx", DType::kI32, {k}}};
  }
  nlohmann::ordered_json QuantizationConfig(const ExportRequest& request) const override;
  std::vector<std::pair<std::string, std::string>> ExtraFiles(const ExportRequest& request) const override {
    // AutoGPTQ and older GPTQModel releases read only this file; the same object as config.json's.
    return {{"quantize_config.json", QuantizationConfig(request).dump(2) + "\n"}};
  }
  std::optional<DType> ScaleDType() const override { return DType::kF16; }
  nlohmann::ordered_json SaveState() const override { return {{"act_order", act_order_.load()}}; }
  Status LoadState(const nlohmann::ordered_json& state) const override {
    if (!state.is_object() || !state.contains("act_order") || !state["act_order"].is_boolean())
      return MakeErrorCode(ErrorCode::kCorruptInput, "GPTQ writer state: expected {\"act_order\": true|false}, found ",
                           state.dump());
    act_order_ = state["act_order"].get<bool>();
    return Status::Ok();
  }

 private:
  bool v2_;
  Choice base_;
  bool lm_head_;
  nlohmann::ordered_json dynamic_;  // object, possibly empty
  mutable std::atomic<bool> act_order_{false};  // some layer stored a non-natural g_idx
};

// Zero points [G, N / 8] sequential along N: v2 stores z, v1 z − 1 (refusing z = 0).
Result<std::vector<uint8_t>> PackZeros(const std::string& module, const Int4Matrix& m, bool v2) {
  const int64_t n = m.n, G = m.groups();
  std::vector<uint8_t> bytes;
  for (int64_t gi = 0; gi < G; ++gi)
    for (int64_t c = 0; c < n / 8; ++c) {
      uint8_t nib[8];
      for (int j = 0; j < 8; ++j) {
        const uint8_t z = m.zero_points[static_cast<size_t>((8 * c + j) * G + gi)];
        if (!v2 && z == 0)
          return MakeErrorCode(ErrorCode::kUnsupported, module, ": zero point 0 at row ", 8 * c + j, ", group ", gi,
                               " cannot be stored as GPTQ v1 (which stores z - 1); use --gptq_format v2");
        nib[j] = v2 ? z : static_cast<uint8_t>(z - 1);
      }
      AppendWord(bytes, PackNibbleWord(nib, PackMethod::kOrder));
    }
  return bytes;
}

Result<std::vector<TensorToWrite>> GptqWriter::WriteLinear(const std::string& module, const Int4Matrix& m,
                                                           const QuantSpec& spec, DType) const {
  NIBBLE_RETURN_IF_ERROR(ValidateInt4Matrix(m, module));
  if (m.k % 8 != 0 || m.n % 8 != 0)
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": N = ", m.n, ", K = ", m.k, " must both be multiples of 8 for "
                         "GPTQ (8 inputs per qweight word, 8 outputs per qzeros word); exclude the layer");
  if (m.group_size != spec.EffectiveGroupSize(m.k) || m.symmetric != spec.symmetric)
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": matrix (group size ", m.group_size, ", ",
                         m.symmetric ? "symmetric" : "asymmetric", ") differs from its spec ", DescribeSpec(spec));
  const int64_t n = m.n, k = m.k, G = m.groups();
  std::vector<TensorToWrite> out(4);
  out[0] = {module + ".qweight", DType::kI32, {k / 8, n}, {}, nullptr, 0};
  out[0].bytes.reserve(static_cast<size_t>(k / 2 * n));
  for (int64_t r = 0; r < k / 8; ++r)
    for (int64_t nn = 0; nn < n; ++nn) AppendWord(out[0].bytes, PackNibbleWord(&m.codes[static_cast<size_t>(nn * k + 8 * r)], PackMethod::kOrder));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<uint8_t> zeros, PackZeros(module, m, v2_));
  out[1] = {module + ".qzeros", DType::kI32, {G, n / 8}, std::move(zeros), nullptr, 0};
  NIBBLE_ASSIGN_OR_RETURN(out[2], WriteGroupScalesF16(module, m, module + ".scales"));
  out[3] = {module + ".g_idx", DType::kI32, {k}, {}, nullptr, 0};
  for (int64_t c = 0; c < k; ++c) AppendWord(out[3].bytes, static_cast<uint32_t>(m.GroupOf(c)));
  if (!m.g_idx.empty() && !HasNaturalGroups(m)) act_order_ = true;
  return out;
}

nlohmann::ordered_json GptqWriter::QuantizationConfig(const ExportRequest& r) const {
  double damp = 0.01;
  bool true_sequential = true;
  if (r.config.algo_config.is_array())
    for (const auto& a : r.config.algo_config)
      if (a.is_object() && a.value("name", "") == "gptq") {
        damp = a.value("damp_percent", damp);
        true_sequential = a.value("true_sequential", true_sequential);
      }
  nlohmann::ordered_json j;
  j["bits"] = 4;
  j["group_size"] = base_.group_size;
  j["desc_act"] = act_order_.load();
  j["sym"] = base_.sym;
  j["static_groups"] = false;
  j["true_sequential"] = true_sequential;
  j["damp_percent"] = damp;
  j["checkpoint_format"] = v2_ ? "gptq_v2" : "gptq";
  j["quant_method"] = "gptq";
  j["lm_head"] = lm_head_;
  if (!dynamic_.empty()) j["dynamic"] = dynamic_;
  return j;
}

// The most common (group_size, sym) among the quantized modules other than lm_head (first seen
// wins a tie), so the fewest modules need a dynamic entry.
Choice BaseChoice(const std::vector<std::pair<std::string, std::optional<QuantSpec>>>& plans) {
  std::map<Choice, int> count;
  std::vector<Choice> order;
  for (const auto& [name, spec] : plans)
    if (spec && name != "lm_head" && count[ChoiceOf(*spec)]++ == 0) order.push_back(ChoiceOf(*spec));
  if (order.empty())
    for (const auto& [name, spec] : plans)
      if (spec) return ChoiceOf(*spec);
  Choice best = order.empty() ? Choice{} : order[0];
  for (const Choice& c : order)
    if (count[c] > count[best]) best = c;
  return best;
}

// Every module whose decision differs from the base gets an exact-name entry; when all shards of
// a vLLM fused module (q/k/v, gate/up) get the same entry, the fused name gets it too, because
// vLLM matches dynamic against the fused module's name.
nlohmann::ordered_json DynamicEntries(const std::vector<std::pair<std::string, std::optional<QuantSpec>>>& plans, Choice base) {
  nlohmann::ordered_json d = nlohmann::ordered_json::object();
  std::map<std::string, nlohmann::ordered_json> value_of;  // module -> entry value ("-" for excluded)
  std::vector<std::pair<std::string, std::vector<std::string>>> fused_modules;  // fused name -> shards
  for (const auto& [name, spec] : plans) {
    if (name == "lm_head" && !spec) continue;  // lm_head false says it
    if (spec && ChoiceOf(*spec) == base) continue;
    nlohmann::ordered_json v = nlohmann::ordered_json::object();
    if (spec) v = {{"group_size", ChoiceOf(*spec).group_size}, {"sym", spec->symmetric}};
    d[(spec ? "+:" : "-:") + ExactPattern(name)] = v;
    value_of[name] = spec ? v : nlohmann::ordered_json("-");
    std::string fused;
    std::vector<std::string> shards = FusedShards(name, &fused);
    if (!shards.empty() && std::none_of(fused_modules.begin(), fused_modules.end(), [&](const auto& f) { return f.first == fused; }))
      fused_modules.emplace_back(fused, std::move(shards));
  }
  for (const auto& [fused, shards] : fused_modules) {
    bool same = true;
    for (const std::string& s : shards) same = same && value_of.count(s) != 0 && value_of[s] == value_of[shards[0]];
    if (!same) continue;
    const nlohmann::ordered_json& v = value_of[shards[0]];
    d[(v.is_string() ? "-:" : "+:") + ExactPattern(fused)] = v.is_string() ? nlohmann::ordered_json::object() : v;
  }
  return d;
}

}  // namespace

Result<std::unique_ptr<FormatWriter>> MakeGptqWriter(const ExportRequest& r) {
  if (r.gptq_format != "v1" && r.gptq_format != "v2")
    return MakeErrorCode(ErrorCode::kUnsupported, "--gptq_format \"", r.gptq_format, "\" is not supported (supported: v1, v2)");
  const bool v2 = r.gptq_format == "v2";
  if (r.modules.empty()) {
    if (!r.config.global) return MakeErrorCode(ErrorCode::kUnsupported, "GPTQ export: the request has no global weight spec");
    NIBBLE_ASSIGN_OR_RETURN(QuantSpec q, QuantSpecFromQuark(*r.config.global));
    return std::unique_ptr<FormatWriter>(new GptqWriter(v2, ChoiceOf(q), false, nlohmann::ordered_json::object()));
  }
  std::vector<std::pair<std::string, std::optional<QuantSpec>>> plans;
  bool lm_head = false, any = false;
  NIBBLE_ASSIGN_OR_RETURN(const std::vector<LinearPlan> module_plans, ModulePlans(r));
  for (size_t i = 0; i < r.modules.size(); ++i) {
    const std::string& module = r.modules[i];
    if (std::find(r.absent_modules.begin(), r.absent_modules.end(), module) != r.absent_modules.end()) continue;
    const LinearPlan& plan = module_plans[i];
    lm_head = lm_head || (module == "lm_head" && plan.spec);
    any = any || plan.spec.has_value();
    plans.emplace_back(module, plan.spec);
  }
  if (!any) return MakeErrorCode(ErrorCode::kUnsupported, "GPTQ export: no linear is quantized");
  const Choice base = BaseChoice(plans);
  return std::unique_ptr<FormatWriter>(new GptqWriter(v2, base, lm_head, DynamicEntries(plans, base)));
}

}  // namespace nibble
