// compressed-tensors pack-quantized tensors <-> Int4Matrix, and the registry entry (layout in the
// header).
#include "formats/compressed_tensors_format.h"

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "base/strings.h"
#include "formats/compressed_tensors_engines.h"
#include "formats/float_dtype.h"
#include "formats/quark_format.h"
#include "formats/quark_pack.h"

namespace nibble {

namespace {

using OJ = nlohmann::ordered_json;

// The compressed-tensors release whose config schema the writer follows.
constexpr const char* kCtVersion = "0.18.0";

int64_t CeilDiv8(int64_t v) { return (v + 7) / 8; }

uint32_t LoadWord(const uint8_t* base, int64_t idx) {
  uint32_t w;
  std::memcpy(&w, base + idx * 4, 4);
  return w;
}

// A float as the shortest text that reads back to it (9 significant digits at most).
std::string FloatText(float v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string Label(const TensorView& t) { return "tensor " + t.name + (t.file.empty() ? "" : " (" + t.file + ")"); }

struct CtViews {
  const TensorView *packed = nullptr, *scale = nullptr, *zero = nullptr, *shape = nullptr, *g_idx = nullptr,
                   *weight = nullptr;
};

CtViews FindViews(const TensorStore& s, const std::string& p) {
  return {s.Find(p + ".weight_packed"), s.Find(p + ".weight_scale"), s.Find(p + ".weight_zero_point"),
          s.Find(p + ".weight_shape"),  s.Find(p + ".weight_g_idx"), s.Find(p + ".weight")};
}

// The module's layout under its spec: g is K for the channel strategy and when K < group_size
// (one group, SPEC §9.3).
struct CtLayout {
  int64_t n = 0, k = 0, g = 0, groups = 0;
  bool symmetric = false, act_group = false;
  std::string text;  // for messages
};

Result<CtLayout> LayoutFor(const std::string& module, const QuantSpec& spec, int64_t n, int64_t k) {
  CtLayout l;
  l.n = n;
  l.k = k;
  l.g = spec.granularity == Granularity::kPerChannel || spec.group_size == -1 ? k : std::min(spec.group_size, k);
  l.symmetric = spec.symmetric;
  l.act_group = spec.act_order;
  if (n < 1 || k < 1 || l.g < 1 || k % l.g != 0)
    return MakeErrorCode(ErrorCode::kUnsupported, "module ", module, ": in_features K = ", k, " is not a multiple of group_size ",
                         spec.group_size, " (the last group would be partial; nibble reads whole groups only)");
  l.groups = k / l.g;
  l.text = std::string("compressed-tensors ") + (spec.symmetric ? "symmetric" : "asymmetric") + " g=" + std::to_string(l.g) +
           ", N=" + std::to_string(n) + ", K=" + std::to_string(k);
  return l;
}

Status CheckView(const TensorView& v, bool is_float, const std::vector<int64_t>& shape, const CtLayout& l) {
  const bool dtype_ok = is_float ? IsFloatScaleDType(v.dtype) : v.dtype == DType::kI32;
  if (!dtype_ok)
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(v), ": dtype ", DTypeName(v.dtype), ", expected ",
                         is_float ? "F32, F16 or BF16" : "I32", " (", l.text, ")");
  if (v.shape != shape)
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(v), ": shape ", v.ShapeString(), ", expected ", ShapeToString(shape), " (",
                         l.text, ")");
  if (v.nbytes != static_cast<size_t>(v.numel()) * DTypeSize(v.dtype) || (v.data == nullptr && v.nbytes != 0))
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(v), ": holds ", v.nbytes, " bytes, expected ",
                         static_cast<size_t>(v.numel()) * DTypeSize(v.dtype));
  return Status::Ok();
}

// weight_shape: an integer [2] holding [N, K] as config.json gives them.
Status CheckWeightShape(const TensorView& v, const CtLayout& l) {
  if ((v.dtype != DType::kI32 && v.dtype != DType::kI64) || v.shape != std::vector<int64_t>{2} ||
      v.nbytes != 2 * DTypeSize(v.dtype) || v.data == nullptr)
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(v), ": dtype ", DTypeName(v.dtype), " shape ", v.ShapeString(),
                         ", expected I64 (or I32) [2] holding [N, K]");
  int64_t d[2];
  for (int i = 0; i < 2; ++i) {
    if (v.dtype == DType::kI64) {
      std::memcpy(&d[i], v.data + 8 * i, 8);
    } else {
      int32_t x;
      std::memcpy(&x, v.data + 4 * i, 4);
      d[i] = x;
    }
  }
  if (d[0] != l.n || d[1] != l.k)
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(v), ": holds [", d[0], ", ", d[1], "], expected [", l.n, ", ", l.k,
                         "] (out_features, in_features from config.json)");
  return Status::Ok();
}

Status CheckTensors(const TensorStore& store, const CtViews& v, const std::string& p, const CtLayout& l) {
  const std::vector<int64_t> packed{l.n, CeilDiv8(l.k)}, scale{l.n, l.groups}, zero{CeilDiv8(l.n), l.groups};
  if (v.packed == nullptr) {
    std::string found;
    if (v.weight != nullptr)
      found = "; found " + p + ".weight (" + DTypeName(v.weight->dtype) + " " + v.weight->ShapeString() +
              ") instead: the tensors are not compressed-tensors pack-quantized (Quark hf_format, or a float weight?)";
    return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": tensor ", p, ".weight_packed: missing; expected I32 ",
                         ShapeToString(packed), " (", l.text, ")", found);
  }
  if (v.weight != nullptr)
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(*v.weight), ": a quantized module stores weight_packed, expected no ",
                         p, ".weight beside it");
  NIBBLE_RETURN_IF_ERROR(CheckView(*v.packed, false, packed, l));
  if (v.scale == nullptr)
    return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": tensor ", p, ".weight_scale: missing; expected float ",
                         ShapeToString(scale), " (", l.text, ")");
  NIBBLE_RETURN_IF_ERROR(CheckView(*v.scale, true, scale, l));
  if (l.symmetric && v.zero != nullptr)
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(*v.zero), ": the config declares the layer symmetric, which stores no "
                         "zero point; found ", DTypeName(v.zero->dtype), " ", v.zero->ShapeString());
  if (!l.symmetric) {
    if (v.zero == nullptr)
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": tensor ", p, ".weight_zero_point: missing; expected I32 ",
                           ShapeToString(zero), " (", l.text, ")");
    NIBBLE_RETURN_IF_ERROR(CheckView(*v.zero, false, zero, l));
  }
  if (v.shape == nullptr)
    return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": tensor ", p, ".weight_shape: missing; expected I64 [2] = [",
                         l.n, ", ", l.k, "]");
  NIBBLE_RETURN_IF_ERROR(CheckWeightShape(*v.shape, l));
  if (v.g_idx == nullptr && l.act_group)
    return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": tensor ", p, ".weight_g_idx: missing; expected I32 [", l.k,
                         "] (the config's actorder is \"group\")");
  if (v.g_idx != nullptr) NIBBLE_RETURN_IF_ERROR(CheckView(*v.g_idx, false, {l.k}, l));
  return Status::Ok();
}

// The stored g_idx into m.g_idx (left empty when it is the natural k / g).
Status ReadGIdx(const TensorView& t, const CtLayout& l, Int4Matrix& m) {
  std::vector<int32_t> g(static_cast<size_t>(l.k));
  std::memcpy(g.data(), t.data, g.size() * 4);
  std::vector<int64_t> count(static_cast<size_t>(l.groups), 0);
  bool natural = true;
  for (int64_t c = 0; c < l.k; ++c) {
    const int32_t x = g[static_cast<size_t>(c)];
    if (x < 0 || x >= l.groups)
      return MakeErrorCode(ErrorCode::kCorruptInput, Label(t), ": g_idx[", c, "] = ", x, ", expected a group in 0..", l.groups - 1);
    ++count[static_cast<size_t>(x)];
    natural = natural && x == c / l.g;
  }
  for (int64_t gi = 0; gi < l.groups; ++gi)
    if (count[static_cast<size_t>(gi)] != l.g)
      return MakeErrorCode(ErrorCode::kCorruptInput, Label(t), ": group ", gi, " has ", count[static_cast<size_t>(gi)],
                           " columns, expected group_size ", l.g);
  if (natural) return Status::Ok();
  if (!l.act_group)
    return MakeErrorCode(ErrorCode::kCorruptInput, Label(t), ": a g_idx other than the natural k / ", l.g,
                         " needs the config's actorder \"group\" (found another actorder; vLLM would ignore the g_idx)");
  m.g_idx = std::move(g);
  return Status::Ok();
}

Status ReadScales(const TensorView& t, const CtLayout& l, Int4Matrix& m) {
  const size_t es = DTypeSize(t.dtype);
  for (size_t i = 0; i < m.scales.size(); ++i) {
    const float s = LoadFloatAs(t.data + i * es, t.dtype);
    if (!IsValidScale(s))
      return InvalidScaleError(Label(t) + ": scale [" + std::to_string(i / l.groups) + "][" + std::to_string(i % l.groups) + "]", s);
    m.scales[i] = s;
  }
  return Status::Ok();
}

Result<Int4Matrix> Decode(const CtViews& v, const CtLayout& l) {
  Int4Matrix m;
  m.n = l.n;
  m.k = l.k;
  m.group_size = l.g;
  m.symmetric = l.symmetric;
  m.codes.resize(static_cast<size_t>(l.n * l.k));
  m.scales.resize(static_cast<size_t>(l.n * l.groups));
  m.zero_points.assign(m.scales.size(), 8);
  const int64_t words = CeilDiv8(l.k);
#pragma omp parallel for schedule(static) if (l.n * l.k >= (int64_t{1} << 20))
  for (int64_t r = 0; r < l.n; ++r) {
    uint8_t nib[8];
    for (int64_t c = 0; c < words; ++c) {
      UnpackNibbleWord(LoadWord(v.packed->data, r * words + c), PackMethod::kOrder, nib);
      for (int64_t j = 0; j < 8 && 8 * c + j < l.k; ++j) m.codes[static_cast<size_t>(r * l.k + 8 * c + j)] = nib[j];
    }
  }
  if (!l.symmetric) {
    uint8_t nib[8];
    for (int64_t rw = 0; rw < CeilDiv8(l.n); ++rw)
      for (int64_t gi = 0; gi < l.groups; ++gi) {
        UnpackNibbleWord(LoadWord(v.zero->data, rw * l.groups + gi), PackMethod::kOrder, nib);
        for (int64_t j = 0; j < 8 && 8 * rw + j < l.n; ++j) m.zero_points[static_cast<size_t>((8 * rw + j) * l.groups + gi)] = nib[j];
      }
  }
  NIBBLE_RETURN_IF_ERROR(ReadScales(*v.scale, l, m));
  if (v.g_idx != nullptr) NIBBLE_RETURN_IF_ERROR(ReadGIdx(*v.g_idx, l, m));
  return m;
}

}  // namespace

Result<Int4Matrix> ImportCtLinear(const TensorStore& store, const std::string& prefix, const QuantSpec& spec, int64_t n,
                                  int64_t k) {
  NIBBLE_ASSIGN_OR_RETURN(CtLayout l, LayoutFor(prefix, spec, n, k));
  const CtViews v = FindViews(store, prefix);
  NIBBLE_RETURN_IF_ERROR(CheckTensors(store, v, prefix, l));
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m, Decode(v, l));
  NIBBLE_RETURN_IF_ERROR(ValidateInt4Matrix(m, prefix));
  return m;
}

namespace {

TensorToWrite Words(const std::string& name, std::vector<int64_t> shape, const std::vector<uint32_t>& words) {
  TensorToWrite t{name, DType::kI32, std::move(shape), std::vector<uint8_t>(words.size() * 4)};
  std::memcpy(t.bytes.data(), words.data(), t.bytes.size());
  return t;
}

// Codes [N, K] packed along K into [N, ceil(K/8)]; zero points [N, G] packed along N into
// [ceil(N/8), G]. Padding nibbles are 0.
std::vector<uint32_t> PackCodes(const Int4Matrix& m) {
  const int64_t words = CeilDiv8(m.k);
  std::vector<uint32_t> out(static_cast<size_t>(m.n * words));
  for (int64_t r = 0; r < m.n; ++r)
    for (int64_t c = 0; c < words; ++c) {
      uint8_t nib[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t j = 0; j < 8 && 8 * c + j < m.k; ++j) nib[j] = m.codes[static_cast<size_t>(r * m.k + 8 * c + j)];
      out[static_cast<size_t>(r * words + c)] = PackNibbleWord(nib, PackMethod::kOrder);
    }
  return out;
}

std::vector<uint32_t> PackZeros(const Int4Matrix& m) {
  const int64_t G = m.groups();
  std::vector<uint32_t> out(static_cast<size_t>(CeilDiv8(m.n) * G));
  for (int64_t rw = 0; rw < CeilDiv8(m.n); ++rw)
    for (int64_t gi = 0; gi < G; ++gi) {
      uint8_t nib[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t j = 0; j < 8 && 8 * rw + j < m.n; ++j) nib[j] = m.zero_points[static_cast<size_t>((8 * rw + j) * G + gi)];
      out[static_cast<size_t>(rw * G + gi)] = PackNibbleWord(nib, PackMethod::kOrder);
    }
  return out;
}

}  // namespace

Result<std::vector<TensorToWrite>> ExportCtLinear(const std::string& prefix, const Int4Matrix& m, const QuantSpec& spec,
                                                  DType scale_dtype) {
  NIBBLE_RETURN_IF_ERROR(ValidateInt4Matrix(m, prefix));
  if (m.symmetric != spec.symmetric)
    return MakeError(prefix, ": the matrix is ", m.symmetric ? "symmetric" : "asymmetric", " but the spec (", DescribeSpec(spec),
                     ") is not");
  if (!IsFloatScaleDType(scale_dtype)) return MakeError(prefix, ": scale dtype ", DTypeName(scale_dtype), " is not F32, F16 or BF16");
  const int64_t G = m.groups();
  std::vector<TensorToWrite> out;
  out.push_back(Words(prefix + ".weight_packed", {m.n, CeilDiv8(m.k)}, PackCodes(m)));
  TensorToWrite scale{prefix + ".weight_scale", scale_dtype, {m.n, G}, std::vector<uint8_t>(m.scales.size() * DTypeSize(scale_dtype))};
  for (size_t i = 0; i < m.scales.size(); ++i) {
    const float s = m.scales[i];
    if (!(RoundToDType(s, scale_dtype) == s))
      return MakeErrorCode(ErrorCode::kUnsupported, prefix, ": scale [", i / G, "][", i % G, "] = ", FloatText(s), " is not exactly representable in ",
                           DTypeName(scale_dtype), " (compressed-tensors stores weight_scale in it)");
    StoreFloatAs(s, scale_dtype, scale.bytes.data() + i * DTypeSize(scale_dtype));
  }
  out.push_back(std::move(scale));
  if (!m.symmetric) out.push_back(Words(prefix + ".weight_zero_point", {CeilDiv8(m.n), G}, PackZeros(m)));
  TensorToWrite shape{prefix + ".weight_shape", DType::kI64, {2}, std::vector<uint8_t>(16)};
  const int64_t nk[2] = {m.n, m.k};
  std::memcpy(shape.bytes.data(), nk, 16);
  out.push_back(std::move(shape));
  if (!m.g_idx.empty()) {
    TensorToWrite g{prefix + ".weight_g_idx", DType::kI32, {m.k}, std::vector<uint8_t>(m.g_idx.size() * 4)};
    std::memcpy(g.bytes.data(), m.g_idx.data(), g.bytes.size());
    out.push_back(std::move(g));
  }
  return out;
}

namespace {

bool IsFusedShard(const std::string& module) {
  const std::string leaf = module.substr(module.rfind('.') + 1);
  return leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj" || leaf == "gate_proj" || leaf == "up_proj";
}

OJ GroupJson(const OJ& targets, const OJ& weights) {
  return OJ{{"format", "pack-quantized"}, {"input_activations", nullptr}, {"output_activations", nullptr},
            {"targets", targets}, {"weights", weights}};
}

OJ ConfigJson(OJ groups, const std::vector<std::string>& ignore) {
  return OJ{{"config_groups", std::move(groups)}, {"format", "pack-quantized"}, {"global_compression_ratio", nullptr},
            {"ignore", ignore}, {"kv_cache_scheme", nullptr}, {"quant_method", "compressed-tensors"},
            {"quantization_status", "compressed"}, {"version", kCtVersion}};
}

// No module list: the global spec for every linear, the request's plain exclude names ignored.
OJ GlobalOnlyConfig(const QuarkQuantConfig& c) {
  std::vector<std::string> ignore;
  for (const std::string& e : c.exclude)
    if (!e.empty() && e.find_first_of("*?[,") == std::string::npos && e.rfind("re:", 0) != 0) ignore.push_back(e);
  OJ groups = OJ::object();
  if (c.global) {
    auto q = QuantSpecFromQuark(*c.global);
    if (q.ok()) groups["group_0"] = GroupJson(OJ::array({"Linear"}), CtWeightArgsJson(*q, false));
  }
  return ConfigJson(std::move(groups), ignore);
}

}  // namespace

OJ CtQuantizationConfig(const ExportRequest& r, const std::vector<std::string>& g_idx_modules) {
  if (r.modules.empty()) return GlobalOnlyConfig(r.config);
  const std::set<std::string> with_g_idx(g_idx_modules.begin(), g_idx_modules.end());
  std::vector<std::string> ignore, keys;       // keys: distinct weight args, first-use order
  std::map<std::string, OJ> args;              // key -> QuantizationArgs
  std::map<std::string, std::vector<std::string>> members;
  std::map<std::string, std::string> key_of;
  const auto plans = ModulePlans(r);  // its errors were refused when the request was parsed
  for (size_t i = 0; i < r.modules.size(); ++i) {
    const std::string& m = r.modules[i];
    if (!plans.ok() || !(*plans)[i].spec) {
      ignore.push_back(m);
      continue;
    }
    const OJ w = CtWeightArgsJson(*(*plans)[i].spec, with_g_idx.count(m) != 0);
    const std::string key = w.dump();
    if (!args.count(key)) keys.push_back(key);
    args[key] = w;
    members[key].push_back(m);
    key_of[m] = key;
  }
  if (keys.empty()) return ConfigJson(OJ::object(), ignore);
  // The most common spec (ties: the first used) takes "Linear" unless a fused shard resolves to
  // another spec: vLLM matches its fused q/k/v and gate/up layers by class before their shards'
  // names, so there every spec must be named.
  std::string common = keys.front();
  for (const std::string& k : keys)
    if (members[k].size() > members[common].size()) common = k;
  bool use_class = true;
  for (const auto& [m, k] : key_of) use_class = use_class && (k == common || !IsFusedShard(m));
  if (use_class)
    for (const std::string& a : r.absent_modules) ignore.push_back(a);
  OJ groups = OJ::object();
  groups["group_0"] = GroupJson(use_class ? OJ::array({"Linear"}) : OJ(members[common]), args[common]);
  size_t next = 1;
  for (const std::string& k : keys)
    if (k != common) groups["group_" + std::to_string(next++)] = GroupJson(OJ(members[k]), args[k]);
  return ConfigJson(std::move(groups), ignore);
}

namespace {

class CtFormat final : public QuantizedFormat {
 public:
  explicit CtFormat(CtConfig c) : c_(std::move(c)) {}
  std::string name() const override { return "compressed-tensors"; }
  Result<LinearPlan> Resolve(const std::string& module) const override {
    NIBBLE_ASSIGN_OR_RETURN(CtResolved r, ResolveCt(c_, module));
    return LinearPlan{r.spec, r.rule};
  }
  Result<std::optional<Int4Matrix>> Import(const TensorStore& store, const std::string& module, const LinearPlan& plan,
                                           int64_t n, int64_t k) const override;
  Status CheckLinear(const TensorStore& store, const std::string& module, const LinearPlan& plan, int64_t n,
                     int64_t k) const override;
  std::vector<std::string> TensorSuffixes() const override {
    return {"weight", "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx"};
  }
  nlohmann::ordered_json ConfigJson() const override { return c_.json; }
  std::vector<std::pair<std::string, std::string>> Properties() const override;
  Result<EnginesReport> Engines(const std::vector<LinearShapeInfo>& linears, bool tied) const override {
    return ReportCtEngines(c_, linears, tied);
  }
  Result<std::vector<std::string>> UnusedConfigEntries(const std::vector<std::string>& modules) const override {
    return CtUnusedEntries(c_, modules);
  }
  Result<DType> StoredScaleDType(const TensorStore& store, const std::string& module) const override {
    const TensorView* s = store.Find(module + ".weight_scale");
    if (s == nullptr)
      return MakeErrorCode(ErrorCode::kCorruptInput, store.description(), ": module ", module, " has no weight_scale tensor");
    return s->dtype;
  }

 private:
  CtConfig c_;
};

std::vector<std::pair<std::string, std::string>> CtFormat::Properties() const {
  std::string groups;
  for (const CtGroup& g : c_.groups) {
    groups += (groups.empty() ? "" : "; ") + g.name + " " + (g.weights ? DescribeSpec(CtSpecFor(*g.weights)) : "float");
    if (g.weights && g.weights->actorder == CtActOrder::kGroup) groups += " act-order";
    groups += g.targets.size() == 1 ? " [" + g.targets[0] + "]" : " [" + std::to_string(g.targets.size()) + " targets]";
  }
  return {{"format", "pack-quantized"}, {"groups", groups}};
}

// A float module stores `weight` and no quantized tensors; a quantized one the tensors above.
Status CheckFloatModule(const TensorStore& store, const std::string& module, const LinearPlan& plan) {
  for (const char* s : {".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_g_idx"})
    if (const TensorView* t = store.Find(module + s))
      return MakeErrorCode(ErrorCode::kCorruptInput, Label(*t), ": module ", module, " is not quantized by the config (", plan.rule,
                           ") but stores ", module, s);
  return Status::Ok();
}

Result<std::optional<Int4Matrix>> CtFormat::Import(const TensorStore& store, const std::string& module, const LinearPlan& plan,
                                                   int64_t n, int64_t k) const {
  if (!plan.spec) {
    NIBBLE_RETURN_IF_ERROR(CheckFloatModule(store, module, plan));
    return std::optional<Int4Matrix>{};
  }
  auto m = ImportCtLinear(store, module, *plan.spec, n, k);
  if (!m.ok()) return m.error().WithContext("module " + module + " (" + plan.rule + ": " + DescribeSpec(*plan.spec) + ")");
  return std::optional<Int4Matrix>(std::move(m).value());
}

Status CtFormat::CheckLinear(const TensorStore& store, const std::string& module, const LinearPlan& plan, int64_t n,
                             int64_t k) const {
  if (!plan.spec) {
    NIBBLE_RETURN_IF_ERROR(CheckFloatModule(store, module, plan));
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* w, store.Get(module + ".weight"));
    if (w->shape != std::vector<int64_t>{n, k} || !IsFloatScaleDType(w->dtype))
      return MakeErrorCode(ErrorCode::kCorruptInput, w->file, ": tensor \"", w->name, "\" has shape ", w->ShapeString(), " / dtype ",
                           DTypeName(w->dtype), ", expected float [", n, ", ", k, "] from config.json (", plan.rule, ")");
    return Status::Ok();
  }
  NIBBLE_ASSIGN_OR_RETURN(CtLayout l, LayoutFor(module, *plan.spec, n, k));
  const Status s = CheckTensors(store, FindViews(store, module), module, l);
  if (!s.ok()) return s.error().WithContext("module " + module + " (" + plan.rule + ")");
  return s;
}

class CtWriter final : public FormatWriter {
 public:
  Result<std::vector<TensorToWrite>> WriteLinear(const std::string& module, const Int4Matrix& m, const QuantSpec& spec,
                                                 DType scale_dtype) const override {
    NIBBLE_ASSIGN_OR_RETURN(std::vector<TensorToWrite> t, ExportCtLinear(module, m, spec, scale_dtype));
    if (!m.g_idx.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      g_idx_modules_.push_back(module);
    }
    return t;
  }
  std::optional<std::vector<TensorSlot>> LinearLayout(const std::string& module, int64_t n, int64_t k, const QuantSpec& spec,
                                                      DType scale_dtype) const override {
    auto l = LayoutFor(module, spec, n, k);
    if (spec.act_order || !l.ok() || !IsFloatScaleDType(scale_dtype)) return std::nullopt;
    std::vector<TensorSlot> out{{module + ".weight_packed", DType::kI32, {n, CeilDiv8(k)}},
                                {module + ".weight_scale", scale_dtype, {n, l->groups}}};
    if (!spec.symmetric) out.push_back({module + ".weight_zero_point", DType::kI32, {CeilDiv8(n), l->groups}});
    out.push_back({module + ".weight_shape", DType::kI64, {2}});
    return out;
  }
  nlohmann::ordered_json QuantizationConfig(const ExportRequest& r) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return CtQuantizationConfig(r, g_idx_modules_);
  }
  nlohmann::ordered_json SaveState() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return {{"g_idx_modules", g_idx_modules_}};
  }
  Status LoadState(const nlohmann::ordered_json& state) const override {
    if (!state.is_object() || !state.contains("g_idx_modules") || !state["g_idx_modules"].is_array())
      return MakeErrorCode(ErrorCode::kCorruptInput, "compressed-tensors writer state: expected {\"g_idx_modules\": [...]}, found ",
                           state.dump());
    std::lock_guard<std::mutex> lock(mu_);
    g_idx_modules_ = state["g_idx_modules"].get<std::vector<std::string>>();
    return Status::Ok();
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<std::string> g_idx_modules_;  // written with a weight_g_idx: actorder "group"
};

Result<std::unique_ptr<QuantizedFormat>> OpenCt(const std::string& text, const std::string& path) {
  OJ j;
  try {
    j = OJ::parse(text);  // OpenCheckpointFormat has checked it for syntax and duplicate keys
  } catch (const OJ::exception& e) {
    return MakeError(path, ": not valid JSON (", PrintableBytes(e.what()), ")");
  }
  NIBBLE_ASSIGN_OR_RETURN(CtConfig c, ParseCtConfig(j["quantization_config"], path + ": quantization_config"));
  return MakeCompressedTensorsFormat(std::move(c));
}

Result<std::unique_ptr<FormatWriter>> MakeCtWriter(const ExportRequest&) {
  return std::unique_ptr<FormatWriter>(new CtWriter());
}

}  // namespace

std::unique_ptr<QuantizedFormat> MakeCompressedTensorsFormat(CtConfig config) {
  return std::make_unique<CtFormat>(std::move(config));
}

const FormatEntry& CompressedTensorsFormatEntry() {
  static const FormatEntry e{"compressed-tensors", "compressed-tensors", "compressed-tensors pack-quantized (llm-compressor)", OpenCt,
                             MakeCtWriter, true};
  return e;
}

}  // namespace nibble
