// AutoAWQ GEMM reader, writer and engine models (layout and config in autoawq_format.h).
#include "formats/autoawq_format.h"

#include <algorithm>
#include <tuple>

#include "base/strings.h"
#include "formats/packed_linear.h"
#include "formats/quark_format.h"
#include "formats/quark_pack.h"
#include "io/json.h"

namespace nibble {
namespace {

struct AutoAwqConfig {
  int64_t group_size = 128;
  bool zero_point = true;
  bool lm_head = false;
  bool group_size_key = true;  // spelled "group_size" (ONNX Runtime GenAI reads only that key)
  std::optional<std::vector<std::string>> modules_to_not_convert;
  nlohmann::ordered_json json;  // as stored, for inspect
};

Result<std::vector<std::string>> StringListOrNull(const nlohmann::json& qc, const std::string& key, const std::string& where) {
  std::vector<std::string> out;
  const nlohmann::json& v = qc[key];
  if (!v.is_array()) return MakeErrorCode(ErrorCode::kCorruptInput, where, ": key ", Quoted(key), ": expected null or a list of strings, found ", v.dump());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      return MakeErrorCode(ErrorCode::kCorruptInput, where, ": key ", Quoted(key), "[", i, "]: expected a string, found ", v[i].dump());
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

// Refuses the variants the format family has but nibble does not read, before any tensor.
Result<AutoAwqConfig> ParseAutoAwqConfig(const nlohmann::json& qc, const std::string& where) {
  AutoAwqConfig c;
  NIBBLE_ASSIGN_OR_RETURN(std::optional<std::string> version, ConfigString(qc, "version", where));
  std::string v = version.value_or("gemm");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (v != "gemm")
    return MakeErrorCode(ErrorCode::kUnsupported, where, ": version ", Quoted(*version), " is not supported (nibble reads AutoAWQ "
                         "version \"gemm\"; gemv, gemv_fast, marlin, exllama and ipex pack the words differently)");
  NIBBLE_ASSIGN_OR_RETURN(std::optional<int64_t> bits, ConfigIntEither(qc, "bits", "w_bit", where));
  if (bits.value_or(4) != 4)
    return MakeErrorCode(ErrorCode::kUnsupported, where, ": bits ", *bits, " is not supported (expected 4)");
  NIBBLE_ASSIGN_OR_RETURN(std::optional<int64_t> g, ConfigIntEither(qc, "group_size", "q_group_size", where));
  c.group_size = g.value_or(128);
  c.group_size_key = qc.contains("group_size") || !qc.contains("q_group_size");
  NIBBLE_RETURN_IF_ERROR(CheckGroupSizeValue(c.group_size, where));
  NIBBLE_ASSIGN_OR_RETURN(std::optional<bool> zp, ConfigBool(qc, "zero_point", where));
  c.zero_point = zp.value_or(true);
  NIBBLE_ASSIGN_OR_RETURN(std::optional<bool> lm, ConfigBool(qc, "lm_head", where));
  c.lm_head = lm.value_or(false);
  if (qc.contains("modules_to_not_convert") && !qc["modules_to_not_convert"].is_null()) {
    NIBBLE_ASSIGN_OR_RETURN(c.modules_to_not_convert, StringListOrNull(qc, "modules_to_not_convert", where));
  }
  return c;
}

// The modules_to_not_convert entry that keeps `module` in float (a substring of its name).
std::optional<std::string> NotConvertedBy(const AutoAwqConfig& c, const std::string& module) {
  if (c.modules_to_not_convert)
    for (const std::string& e : *c.modules_to_not_convert)
      if (module.find(e) != std::string::npos) return e;
  return std::nullopt;
}

QuantSpec GlobalSpec(const AutoAwqConfig& c) {
  QuantSpec q;
  q.group_size = c.group_size;
  q.symmetric = !c.zero_point;
  q.scale_dtype = DType::kF16;
  return q;
}

LinearPlan ResolveAwq(const AutoAwqConfig& c, const std::string& module) {
  if (std::optional<std::string> e = NotConvertedBy(c, module)) return {std::nullopt, "modules_to_not_convert entry " + Quoted(*e)};
  if (module == "lm_head" && !c.lm_head) return {std::nullopt, "lm_head stays float (no \"lm_head\": true)"};
  return {GlobalSpec(c), std::string("global (group_size ") + std::to_string(c.group_size) +
                             ", zero_point " + (c.zero_point ? "true" : "false") + ")"};
}

std::string Layout(int64_t n, int64_t k, int64_t g) {
  return "AutoAWQ GEMM g=" + std::to_string(g) + ", N=" + std::to_string(n) + ", K=" + std::to_string(k);
}

struct AwqViews {
  const TensorView* qweight = nullptr;
  const TensorView* qzeros = nullptr;  // nullptr: zero_point false and none stored
  const TensorView* scales = nullptr;
};

// The checks every quantized module passes before its words are decoded.
Result<AwqViews> FindAwqTensors(const AutoAwqConfig& c, const TensorStore& store, const std::string& module,
                                const QuantSpec& spec, int64_t n, int64_t k) {
  const std::string where = store.description().empty() ? module : store.description() + ": " + module;
  const int64_t g = spec.EffectiveGroupSize(k);
  if (n % 8 != 0)
    return MakeErrorCode(ErrorCode::kCorruptInput, where, ": out_features N = ", n, " is not a multiple of 8 (AutoAWQ GEMM "
                         "packs 8 outputs per word and has no padding rule)");
  if (k % g != 0)
    return MakeErrorCode(ErrorCode::kCorruptInput, where, ": in_features K = ", k, " is not a multiple of group_size ", g);
  const std::string layout = Layout(n, k, g);
  AwqViews v;
  NIBBLE_ASSIGN_OR_RETURN(v.qweight, GetPackedTensor(store, module, "qweight", false, {k, n / 8}, layout));
  NIBBLE_ASSIGN_OR_RETURN(v.scales, GetPackedTensor(store, module, "scales", true, {k / g, n}, layout));
  if (c.zero_point || store.Find(module + ".qzeros") != nullptr) {
    NIBBLE_ASSIGN_OR_RETURN(v.qzeros, GetPackedTensor(store, module, "qzeros", false, {k / g, n / 8}, layout));
  }
  return v;
}

// Decodes [rows, n / 8] reorder-packed words into out[r * stride + ...] via put(row, output, nibble).
template <typename Put>
void UnpackAlongN(const TensorView& t, int64_t rows, int64_t n, Put put) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n / 8; ++c) {
      uint8_t nib[8];
      UnpackNibbleWord(PackedWord(t, r * (n / 8) + c), PackMethod::kReorder, nib);
      for (int j = 0; j < 8; ++j) put(r, 8 * c + j, nib[j]);
    }
}

Result<Int4Matrix> DecodeAwq(const AutoAwqConfig& c, const AwqViews& v, const QuantSpec& spec, int64_t n, int64_t k) {
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = spec.EffectiveGroupSize(k);
  m.symmetric = !c.zero_point;
  const int64_t G = m.groups();
  m.codes.resize(static_cast<size_t>(n * k));
  m.zero_points.assign(static_cast<size_t>(n * G), 8);
  UnpackAlongN(*v.qweight, k, n, [&](int64_t kk, int64_t nn, uint8_t q) { m.codes[static_cast<size_t>(nn * k + kk)] = q; });
  if (v.qzeros != nullptr) {
    int64_t bad_g = -1, bad_n = -1, bad = 0;
    UnpackAlongN(*v.qzeros, G, n, [&](int64_t gi, int64_t nn, uint8_t z) {
      if (!c.zero_point && z != 8 && bad_g < 0) std::tie(bad_g, bad_n, bad) = std::make_tuple(gi, nn, int64_t{z});
      m.zero_points[static_cast<size_t>(nn * G + gi)] = z;
    });
    if (bad_g >= 0)
      return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(*v.qzeros), ": zero point ", bad, " at group ", bad_g,
                           ", output ", bad_n, "; expected 8 (zero_point false means symmetric, every zero 8)");
  }
  NIBBLE_RETURN_IF_ERROR(ReadGroupScales(*v.scales, m));
  return m;
}

std::optional<QuantSpec> SpecOf(const LinearPlan& p) { return p.spec; }

using Read = EngineRead;

// vLLM: skipped when an entry is a substring of the layer's name; q/k/v and gate/up are fused and
// each shard is tested (they must agree, else ValueError); lm_head only with "lm_head": true.
Read ReadVllm(const AutoAwqConfig& c, const std::string& name, bool tied) {
  if (name == "lm_head" && tied) return {};
  std::string fused;
  std::vector<std::string> shards = FusedShards(name, &fused);
  if (shards.empty()) shards = {name};
  const bool skipped = NotConvertedBy(c, name).has_value();
  for (const std::string& s : shards)
    if (NotConvertedBy(c, s).has_value() != skipped)
      return {std::nullopt, "fused " + fused + ": some shards in modules_to_not_convert, others not (ValueError)", "",
              "keep q/k/v_proj (gate/up_proj) of a layer all quantized or all float"};
  if (skipped || (name == "lm_head" && !c.lm_head)) return {};
  return {GlobalSpec(c)};
}

// Transformers' AWQ integration: the same substring rule, and the output embedding always float.
Read ReadTransformers(const AutoAwqConfig& c, const std::string& name, bool tied) {
  if (name == "lm_head") {
    if (c.lm_head && !tied) return {std::nullopt, "", "keeps lm_head in float whatever the config says", "keep lm_head float"};
    return {};
  }
  if (NotConvertedBy(c, name)) return {};
  return {GlobalSpec(c)};
}

// ONNX Runtime GenAI's AWQModel: a module is quantized when its qweight is stored, with the
// config's "group_size" (the only spelling it reads) and the stored qzeros.
Read ReadOrt(const AutoAwqConfig& c, const std::optional<QuantSpec>& meant) {
  if (!meant) return {};
  if (!c.group_size_key)
    return {std::nullopt, "reads only the key \"group_size\" (KeyError: the config spells it q_group_size)", "",
            "re-export with nibble quantize --model_export awq (it writes group_size)"};
  if (!c.zero_point) return {std::nullopt, "reads qzeros, which a zero_point false checkpoint need not store", "", "zero_point true"};
  return {meant};
}

class AutoAwqFormat final : public QuantizedFormat {
 public:
  explicit AutoAwqFormat(AutoAwqConfig c) : c_(std::move(c)) {}
  std::string name() const override { return "autoawq"; }
  Result<LinearPlan> Resolve(const std::string& module) const override { return ResolveAwq(c_, module); }
  Result<std::optional<Int4Matrix>> Import(const TensorStore& store, const std::string& module, const LinearPlan& plan,
                                           int64_t n, int64_t k) const override {
    if (!plan.spec) {
      NIBBLE_RETURN_IF_ERROR(CheckFloatModule(store, module, n, k, {"qweight", "qzeros", "scales"}, "AutoAWQ", plan.rule));
      return std::optional<Int4Matrix>{};
    }
    NIBBLE_ASSIGN_OR_RETURN(AwqViews v, FindAwqTensors(c_, store, module, *plan.spec, n, k));
    NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m, DecodeAwq(c_, v, *plan.spec, n, k));
    return std::optional<Int4Matrix>(std::move(m));
  }
  Status CheckLinear(const TensorStore& store, const std::string& module, const LinearPlan& plan, int64_t n,
                     int64_t k) const override {
    if (!plan.spec) return CheckFloatModule(store, module, n, k, {"qweight", "qzeros", "scales"}, "AutoAWQ", plan.rule);
    auto v = FindAwqTensors(c_, store, module, *plan.spec, n, k);
    return v.ok() ? Status::Ok() : Status(v.error());
  }
  std::vector<std::string> TensorSuffixes() const override { return {"weight", "qweight", "qzeros", "scales"}; }
  nlohmann::ordered_json ConfigJson() const override { return c_.json; }
  std::vector<std::pair<std::string, std::string>> Properties() const override {
    return {{"version", "gemm"}, {"zero_point", c_.zero_point ? "true" : "false"}, {"pack_method", "reorder"}};
  }
  Result<EnginesReport> Engines(const std::vector<LinearShapeInfo>& linears, bool tied) const override;
  Result<std::vector<std::string>> UnusedConfigEntries(const std::vector<std::string>& modules) const override {
    std::vector<std::string> out;
    if (c_.modules_to_not_convert)
      for (const std::string& e : *c_.modules_to_not_convert)
        if (std::none_of(modules.begin(), modules.end(), [&](const std::string& m) { return m.find(e) != std::string::npos; }))
          out.push_back("modules_to_not_convert entry " + Quoted(e) + " is a substring of no module name");
    return out;
  }
  Result<DType> StoredScaleDType(const TensorStore& store, const std::string& module) const override {
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* s, store.Get(module + ".scales"));
    return s->dtype;
  }

 private:
  AutoAwqConfig c_;
};

Result<EnginesReport> AutoAwqFormat::Engines(const std::vector<LinearShapeInfo>& linears, bool tied) const {
  EnginesReport rep;
  rep.engines = {"nibble", "transformers", "vllm", "onnxruntime-genai"};
  for (const LinearShapeInfo& l : linears) {
    const std::optional<QuantSpec> meant = SpecOf(ResolveAwq(c_, l.name));
    EnginesReport::Linear out{l, EngineSpecText(meant, l.k), {}};
    const Read reads[4] = {RunsEmbedding(l.name, tied) ? Read{} : Read{meant}, ReadTransformers(c_, l.name, tied), ReadVllm(c_, l.name, tied), ReadOrt(c_, meant)};
    for (const Read& got : reads) out.readings.push_back(EngineCell(got, meant, l.k, "untie lm_head or keep it float"));
    rep.linears.push_back(std::move(out));
  }
  const AutoAwqConfig& c = c_;
  SpecResolver resolve = [&c](const std::string& m) -> Result<std::optional<QuantSpec>> { return SpecOf(ResolveAwq(c, m)); };
  NIBBLE_ASSIGN_OR_RETURN(rep.tp, TensorParallelTable(resolve, linears));
  return rep;
}

Result<std::unique_ptr<QuantizedFormat>> OpenAutoAwq(const std::string& text, const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(text, path));
  const std::string where = path + ": quantization_config";
  NIBBLE_ASSIGN_OR_RETURN(AutoAwqConfig c, ParseAutoAwqConfig(j["quantization_config"], where));
  c.json = nlohmann::ordered_json::parse(text)["quantization_config"];
  return std::unique_ptr<QuantizedFormat>(new AutoAwqFormat(std::move(c)));
}


// Packs [rows, n] nibbles get(row, output) along N in reorder order: [rows, n / 8] words.
template <typename Get>
std::vector<uint8_t> PackAlongN(int64_t rows, int64_t n, Get get) {
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(rows * (n / 8) * 4));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n / 8; ++c) {
      uint8_t nib[8];
      for (int j = 0; j < 8; ++j) nib[j] = get(r, 8 * c + j);
      AppendWord(bytes, PackNibbleWord(nib, PackMethod::kReorder));
    }
  return bytes;
}

class AutoAwqWriter final : public FormatWriter {
 public:
  AutoAwqWriter(int64_t group_size, std::optional<std::vector<std::string>> floats)
      : group_size_(group_size), floats_(std::move(floats)) {}
  Result<std::vector<TensorToWrite>> WriteLinear(const std::string& module, const Int4Matrix& m, const QuantSpec& spec,
                                                 DType scale_dtype) const override;
  nlohmann::ordered_json QuantizationConfig(const ExportRequest&) const override {
    nlohmann::ordered_json j;
    j["quant_method"] = "awq";
    j["zero_point"] = true;
    j["group_size"] = group_size_;
    j["bits"] = 4;
    j["version"] = "gemm";
    j["modules_to_not_convert"] = floats_ ? nlohmann::ordered_json(*floats_) : nlohmann::ordered_json();
    return j;
  }
  std::optional<DType> ScaleDType() const override { return DType::kF16; }
  std::optional<std::vector<TensorSlot>> LinearLayout(const std::string& module, int64_t n, int64_t k, const QuantSpec& spec,
                                                      DType) const override {
    const int64_t g = spec.EffectiveGroupSize(k);
    if (spec.act_order || spec.symmetric || n < 1 || k < 1 || n % 8 != 0 || g < 1 || k % g != 0) return std::nullopt;
    return std::vector<TensorSlot>{{module + ".qweight", DType::kI32, {k, n / 8}},
                                   {module + ".qzeros", DType::kI32, {k / g, n / 8}},
                                   {module + ".scales", DType::kF16, {k / g, n}}};
  }

 private:
  int64_t group_size_;
  std::optional<std::vector<std::string>> floats_;  // nullopt: the request named no modules
};

Result<std::vector<TensorToWrite>> AutoAwqWriter::WriteLinear(const std::string& module, const Int4Matrix& m,
                                                              const QuantSpec&, DType) const {
  NIBBLE_RETURN_IF_ERROR(ValidateInt4Matrix(m, module));
  if (m.symmetric)
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": symmetric int4 cannot be written as AutoAWQ GEMM (its kernels "
                         "read zero points); use --model_export gptq or compressed-tensors");
  if (!HasNaturalGroups(m))
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": its g_idx (act-order) is not the natural k / group_size, "
                         "which AutoAWQ GEMM cannot hold (it has no g_idx); use --model_export gptq or compressed-tensors");
  if (m.n % 8 != 0)
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": out_features N = ", m.n, " is not a multiple of 8, which "
                         "AutoAWQ GEMM needs (8 outputs per word, no padding rule); exclude the layer");
  if (m.group_size != (group_size_ == -1 ? m.k : group_size_))
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": group size ", m.group_size, " differs from the config's ",
                         group_size_, " (AutoAWQ has one global group size)");
  const int64_t n = m.n, k = m.k, G = m.groups();
  std::vector<TensorToWrite> out(3);
  out[0] = {module + ".qweight", DType::kI32, {k, n / 8},
            PackAlongN(k, n, [&](int64_t kk, int64_t nn) { return m.codes[static_cast<size_t>(nn * k + kk)]; }), nullptr, 0};
  out[1] = {module + ".qzeros", DType::kI32, {G, n / 8},
            PackAlongN(G, n, [&](int64_t gi, int64_t nn) { return m.zero_points[static_cast<size_t>(nn * G + gi)]; }), nullptr, 0};
  NIBBLE_ASSIGN_OR_RETURN(out[2], WriteGroupScalesF16(module, m, module + ".scales"));
  return out;
}

// One quantized module's spec against what AutoAWQ GEMM holds; `g` takes the first group size.
Status CheckAwqSpec(const std::string& module, const QuantSpec& q, std::optional<int64_t>& g) {
  if (module == "lm_head")
    return MakeErrorCode(ErrorCode::kUnsupported, "lm_head: AutoAWQ GEMM keeps lm_head in float (Transformers' AWQ "
                         "integration never quantizes it); add --exclude_layers lm_head or use --model_export gptq");
  if (q.symmetric)
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": ", DescribeSpec(q), " is symmetric, which AutoAWQ GEMM cannot "
                         "hold (zero_point true only); use --model_export gptq or compressed-tensors, or an asymmetric scheme");
  if (q.granularity == Granularity::kPerChannel)
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": per_channel cannot be written as AutoAWQ GEMM; use a per_group scheme");
  if (g && *g != q.group_size)
    return MakeErrorCode(ErrorCode::kUnsupported, module, ": group_size ", q.group_size, " differs from ", *g,
                         " of the other quantized layers; AutoAWQ has one global group size (use --model_export gptq)");
  g = q.group_size;
  return Status::Ok();
}

// Resolves the request: one group size for every quantized linear, the float ones listed by
// exact name, and no entry a substring of a quantized module's name (it would exclude it too).
Result<std::unique_ptr<FormatWriter>> MakeAutoAwqWriter(const ExportRequest& r) {
  std::optional<int64_t> g;
  if (r.modules.empty()) {
    if (!r.config.global) return MakeErrorCode(ErrorCode::kUnsupported, "AutoAWQ export: the request has no global weight spec");
    NIBBLE_ASSIGN_OR_RETURN(QuantSpec q, QuantSpecFromQuark(*r.config.global));
    NIBBLE_RETURN_IF_ERROR(CheckAwqSpec("global spec", q, g));
    return std::unique_ptr<FormatWriter>(new AutoAwqWriter(*g, std::nullopt));
  }
  std::vector<std::string> floats, quantized;
  NIBBLE_ASSIGN_OR_RETURN(const std::vector<LinearPlan> plans, ModulePlans(r));
  for (size_t i = 0; i < r.modules.size(); ++i) {
    const std::string& module = r.modules[i];
    const LinearPlan& plan = plans[i];
    if (!plan.spec) {
      if (std::find(r.absent_modules.begin(), r.absent_modules.end(), module) == r.absent_modules.end()) floats.push_back(module);
      continue;
    }
    NIBBLE_RETURN_IF_ERROR(CheckAwqSpec(module, *plan.spec, g));
    quantized.push_back(module);
  }
  if (!g) return MakeErrorCode(ErrorCode::kUnsupported, "AutoAWQ export: no linear is quantized");
  for (const std::string& f : floats)
    for (const std::string& q : quantized)
      if (q.find(f) != std::string::npos)
        return MakeErrorCode(ErrorCode::kUnsupported, f, ": kept in float, but as a modules_to_not_convert entry it is a "
                             "substring of the quantized ", q, ", which AutoAWQ readers would keep in float too");
  return std::unique_ptr<FormatWriter>(new AutoAwqWriter(*g, floats));
}

}  // namespace

const FormatEntry& AutoAwqFormatEntry() {
  static const FormatEntry e{"awq", "awq", "AutoAWQ GEMM", OpenAutoAwq, MakeAutoAwqWriter, false};
  return e;
}

}  // namespace nibble
