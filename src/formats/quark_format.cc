#include "formats/quark_format.h"

#include "formats/float_dtype.h"
#include "formats/quark_canonical.h"
#include "formats/quark_engines.h"
#include "formats/quark_pack.h"

namespace nibble {

Result<QuantSpec> QuantSpecFromQuark(const WeightQuantSpec& s) {
  if ((s.dtype == QuantDType::kInt4) != s.symmetric)
    return MakeErrorCode(ErrorCode::kUnsupported, "dtype ", QuantDTypeName(s.dtype), " with symmetric ", s.symmetric ? "true" : "false",
                     " is not supported (expected int4 symmetric or uint4 asymmetric)");
  QuantSpec q;
  q.granularity = s.qscheme == QScheme::kPerChannel ? Granularity::kPerChannel : Granularity::kPerGroup;
  q.group_size = s.group_size;
  q.symmetric = s.symmetric;
  if (s.scale_type == "float32") q.scale_dtype = DType::kF32;
  if (s.scale_type == "float16") q.scale_dtype = DType::kF16;
  if (s.scale_type == "bfloat16") q.scale_dtype = DType::kBF16;
  q.rounding = s.round_method == "half_even" ? Rounding::kHalfEven
               : s.round_method == "round"   ? Rounding::kRound
                                             : Rounding::kFloor;
  return q;
}

WeightQuantSpec QuarkSpecFor(const QuantSpec& q) {
  WeightQuantSpec s;
  s.dtype = q.symmetric ? QuantDType::kInt4 : QuantDType::kUint4;
  s.symmetric = q.symmetric;
  s.qscheme = q.granularity == Granularity::kPerChannel ? QScheme::kPerChannel : QScheme::kPerGroup;
  s.ch_axis = q.granularity == Granularity::kPerChannel ? 0 : 1;
  s.group_size = q.group_size;
  return s;
}

Result<LinearPlan> ResolveQuarkLinear(const QuarkQuantConfig& config, const std::string& module) {
  NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(config, module));
  LinearPlan plan;
  plan.rule = r.rule;
  if (r.spec) {
    auto q = QuantSpecFromQuark(*r.spec);
    if (!q.ok()) return q.error().WithContext("layer " + module + " (" + r.rule + ")");
    plan.spec = *q;
  }
  return plan;
}

namespace {

class QuarkFormat final : public QuantizedFormat {
 public:
  explicit QuarkFormat(QuarkQuantConfig c) : c_(std::move(c)) {}
  std::string name() const override { return "quark"; }
  Result<LinearPlan> Resolve(const std::string& module) const override { return ResolveQuarkLinear(c_, module); }
  Result<std::optional<Int4Matrix>> Import(const TensorStore& store, const std::string& module, const LinearPlan& plan,
                                           int64_t n, int64_t k) const override;
  Result<std::optional<DeferredInt4>> ImportDeferred(const TensorStore& store, const std::string& module,
                                                     const LinearPlan& plan, int64_t n, int64_t k) const override;
  Status CheckLinear(const TensorStore& store, const std::string& module, const LinearPlan& plan, int64_t n,
                     int64_t k) const override;
  std::vector<std::string> TensorSuffixes() const override { return QuarkTensorSuffixes(); }
  nlohmann::ordered_json ConfigJson() const override { return ToJson(c_); }
  std::vector<std::pair<std::string, std::string>> Properties() const override {
    return {{"pack_method", PackMethodName(c_.export_config.pack_method)}};
  }
  Result<EnginesReport> Engines(const std::vector<LinearShapeInfo>& linears, bool tied) const override {
    return ReportEngines(c_, linears, tied);
  }
  Result<std::vector<std::string>> UnusedConfigEntries(const std::vector<std::string>& modules) const override {
    return nibble::UnusedConfigEntries(c_, modules);
  }
  Result<DType> StoredScaleDType(const TensorStore& store, const std::string& module) const override {
    NIBBLE_ASSIGN_OR_RETURN(QuarkLinearViews views, FindQuarkLinearViews(store, module));
    if (views.weight_scale == nullptr)
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": module ", module, " has no scale tensor");
    return views.weight_scale->dtype;
  }

 private:
  QuarkQuantConfig c_;
};

// A module the stored tensors contradict (quantized in the config but a float weight on disk, or
// the reverse) is an error naming the module and the rule.
Result<std::optional<Int4Matrix>> QuarkFormat::Import(const TensorStore& store, const std::string& module,
                                                      const LinearPlan& plan, int64_t n, int64_t k) const {
  const TensorView* w = store.Find(module + ".weight");
  const bool float_weight = w != nullptr && IsFloatScaleDType(w->dtype);
  if (!plan.spec) {
    if (w != nullptr && !float_weight)
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": module ", module, " is not quantized by the config (", plan.rule,
                       ") but its weight is stored as ", DTypeName(w->dtype), " ", w->ShapeString(),
                       "; expected a float weight of shape [", n, ", ", k, "]");
    NIBBLE_ASSIGN_OR_RETURN(QuarkLinearViews views, FindQuarkLinearViews(store, module));
    if (views.weight_scale != nullptr)
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": module ", module, " is not quantized by the config (", plan.rule,
                       ") but has a scale tensor (", views.weight_scale->name, ")");
    return std::optional<Int4Matrix>{};
  }
  // fake_quantized: the QDQ'd float weight is stored; it runs dense (SPEC §1.4).
  if (c_.export_config.weight_format == WeightFormat::kFakeQuantized) return std::optional<Int4Matrix>{};
  if (float_weight)
    return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": module ", module, " is quantized by the config (", plan.rule, ": ",
                     DescribeSpec(*plan.spec), ") but its weight is stored as float ", DTypeName(w->dtype), " ",
                     w->ShapeString(), "; expected packed int32");
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m,
                          ImportQuarkLinear(store, module, QuarkSpecFor(*plan.spec), c_.export_config.pack_method, n, k));
  return std::optional<Int4Matrix>(std::move(m));
}

// Only a module Import would decode (quantized, real_quantized, packed int32 weight); the
// others go through Import and its errors.
Result<std::optional<DeferredInt4>> QuarkFormat::ImportDeferred(const TensorStore& store, const std::string& module,
                                                                const LinearPlan& plan, int64_t n, int64_t k) const {
  const TensorView* w = store.Find(module + ".weight");
  if (!plan.spec || c_.export_config.weight_format == WeightFormat::kFakeQuantized || w == nullptr ||
      IsFloatScaleDType(w->dtype))
    return std::optional<DeferredInt4>{};
  NIBBLE_ASSIGN_OR_RETURN(QuarkLinearViews views, FindQuarkLinearViews(store, module));
  auto r = ImportQuarkLinearDeferred(views, module, QuarkSpecFor(*plan.spec), c_.export_config.pack_method, n, k);
  if (!r.ok() && !store.description().empty()) return r.error().WithContext(store.description());
  return r;
}

Status QuarkFormat::CheckLinear(const TensorStore& store, const std::string& module, const LinearPlan& plan, int64_t n,
                                int64_t k) const {
  if (!plan.spec || c_.export_config.weight_format == WeightFormat::kFakeQuantized) {
    // A float weight (or none): Import's consistency checks, and the loader's float shape.
    if (plan.spec == std::nullopt) {
      auto none = Import(store, module, plan, n, k);
      if (!none.ok()) return none.error();
    }
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* w, store.Get(module + ".weight"));
    if (w->shape != std::vector<int64_t>{n, k} || !IsFloatScaleDType(w->dtype))
      return MakeErrorCode(ErrorCode::kCorruptInput, w->file, ": tensor \"", w->name, "\" has shape ", w->ShapeString(), " / dtype ",
                           DTypeName(w->dtype), ", expected float [", n, ", ", k, "] from config.json");
    return Status::Ok();
  }
  NIBBLE_ASSIGN_OR_RETURN(const QuarkLinearViews views, FindQuarkLinearViews(store, module));
  const Status s = CheckQuarkLinearTensors(views, module, QuarkSpecFor(*plan.spec), n, k);
  if (!s.ok() && !store.description().empty()) return s.error().WithContext(store.description());
  return s;
}

class QuarkWriter final : public FormatWriter {
 public:
  explicit QuarkWriter(QuarkQuantConfig c) : c_(std::move(c)) {}
  Result<std::vector<TensorToWrite>> WriteLinear(const std::string& module, const Int4Matrix& m, const QuantSpec& spec,
                                                 DType scale_dtype) const override {
    if (!HasNaturalGroups(m))
      return MakeErrorCode(ErrorCode::kUnsupported, module, ": its g_idx (act-order) is not the natural k / group_size, "
                           "which Quark hf_format cannot hold (convert to gptq or compressed-tensors instead)");
    NIBBLE_ASSIGN_OR_RETURN(QuarkLinearTensors t,
                            ExportQuarkLinear(module, m, QuarkSpecFor(spec), c_.export_config.pack_method, scale_dtype));
    std::vector<TensorToWrite> out;
    out.push_back(std::move(t.weight));
    out.push_back(std::move(t.weight_scale));
    out.push_back(std::move(t.weight_zero_point));
    return out;
  }
  std::optional<std::vector<TensorSlot>> LinearLayout(const std::string& module, int64_t n, int64_t k, const QuantSpec& spec,
                                                      DType scale_dtype) const override {
    if (spec.act_order || !IsFloatScaleDType(scale_dtype)) return std::nullopt;
    auto shapes = QuarkLinearShapes(QuarkSpecFor(spec), n, k);
    if (!shapes.ok()) return std::nullopt;
    return std::vector<TensorSlot>{{module + ".weight", DType::kI32, shapes->weight},
                                   {module + ".weight_scale", scale_dtype, shapes->weight_scale},
                                   {module + ".weight_zero_point", DType::kI32, shapes->weight_zero_point}};
  }
  // The canonical form when the modules are known; its only error (an invalid `re:` entry) was
  // refused when the request was parsed.
  nlohmann::ordered_json QuantizationConfig(const ExportRequest& r) const override {
    if (r.modules.empty()) return ToJson(r.config);
    auto canonical = CanonicalQuarkConfig(r.config, r.modules, r.absent_modules);
    return ToJson(canonical.ok() ? *canonical : r.config);
  }

 private:
  QuarkQuantConfig c_;
};

Result<std::unique_ptr<QuantizedFormat>> OpenQuark(const std::string& text, const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(QuarkQuantConfig cfg, ParseQuarkQuantConfigFromConfigJson(text, path));
  return MakeQuarkFormat(std::move(cfg));
}

Result<std::unique_ptr<FormatWriter>> MakeQuarkWriter(const ExportRequest& r) {
  return std::unique_ptr<FormatWriter>(new QuarkWriter(r.config));
}

}  // namespace

std::unique_ptr<QuantizedFormat> MakeQuarkFormat(QuarkQuantConfig config) {
  return std::make_unique<QuarkFormat>(std::move(config));
}

const FormatEntry& QuarkFormatEntry() {
  static const FormatEntry e{"quark", "hf_format", "AMD Quark hf_format", OpenQuark, MakeQuarkWriter, false};
  return e;
}

}  // namespace nibble
