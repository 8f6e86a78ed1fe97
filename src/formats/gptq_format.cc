// GPTQ reader and engine models (layout and config in gptq_format.h; the writer is in
// gptq_writer.cc).
#include "formats/gptq_format.h"

#include <algorithm>

#include "base/strings.h"
#include "formats/fnmatch.h"
#include "formats/gptq_config.h"
#include "formats/packed_linear.h"
#include "formats/quark_pack.h"
#include "io/file.h"
#include "io/json.h"

namespace nibble {
namespace {

std::string Layout(const GptqConfig& c, int64_t n, int64_t k, int64_t g) {
  return std::string("GPTQ ") + (c.v2 ? "gptq_v2" : "gptq (v1)") + " g=" + std::to_string(g) + ", N=" + std::to_string(n) +
         ", K=" + std::to_string(k);
}

struct GptqViews {
  const TensorView* qweight = nullptr;
  const TensorView* qzeros = nullptr;
  const TensorView* scales = nullptr;
  const TensorView* g_idx = nullptr;  // nullptr: not stored
};

Result<GptqViews> FindGptqTensors(const GptqConfig& c, const TensorStore& store, const std::string& module,
                                  const QuantSpec& spec, int64_t n, int64_t k) {
  const std::string where = store.description().empty() ? module : store.description() + ": " + module;
  const int64_t g = spec.EffectiveGroupSize(k);
  if (k % 8 != 0 || n % 8 != 0)
    return MakeErrorCode(ErrorCode::kCorruptInput, where, ": N = ", n, ", K = ", k, " must both be multiples of 8 (GPTQ "
                         "packs 8 inputs per qweight word and 8 outputs per qzeros word)");
  if (k % g != 0)
    return MakeErrorCode(ErrorCode::kCorruptInput, where, ": in_features K = ", k, " is not a multiple of group_size ", g);
  const std::string layout = Layout(c, n, k, g);
  GptqViews v;
  NIBBLE_ASSIGN_OR_RETURN(v.qweight, GetPackedTensor(store, module, "qweight", false, {k / 8, n}, layout));
  NIBBLE_ASSIGN_OR_RETURN(v.qzeros, GetPackedTensor(store, module, "qzeros", false, {k / g, n / 8}, layout));
  NIBBLE_ASSIGN_OR_RETURN(v.scales, GetPackedTensor(store, module, "scales", true, {k / g, n}, layout));
  if (store.Find(module + ".g_idx") != nullptr || spec.act_order) {
    NIBBLE_ASSIGN_OR_RETURN(v.g_idx, GetPackedTensor(store, module, "g_idx", false, {k}, layout + (spec.act_order ? ", desc_act true needs g_idx" : "")));
  }
  return v;
}

// Zero points [G, N / 8] (sequential along N): v1 nibbles hold z − 1, v2 z; sym needs z = 8.
Status DecodeZeros(const GptqConfig& c, const TensorView& t, const QuantSpec& spec, Int4Matrix& m) {
  const int64_t n = m.n, G = m.groups();
  for (int64_t gi = 0; gi < G; ++gi)
    for (int64_t col = 0; col < n / 8; ++col) {
      uint8_t nib[8];
      UnpackNibbleWord(PackedWord(t, gi * (n / 8) + col), PackMethod::kOrder, nib);
      for (int j = 0; j < 8; ++j) {
        const int64_t out = 8 * col + j;
        if (!c.v2 && nib[j] == 15)
          return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(t), ": group ", gi, ", output ", out,
                               ": stored zero 15 means z = 16 under checkpoint_format \"gptq\" (v1 stores z - 1), which "
                               "4 bits cannot hold; this is not a valid v1 file (a z = 0 written with word arithmetic "
                               "borrows into the next nibble); if it holds v2 zeros, set checkpoint_format \"gptq_v2\"");
        const int z = c.v2 ? nib[j] : nib[j] + 1;
        if (spec.symmetric && z != 8)
          return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(t), ": group ", gi, ", output ", out, ": stored zero ",
                               int{nib[j]}, " (z = ", z, "), expected stored ", c.v2 ? 8 : 7, " (z = 8): the config says sym true");
        m.zero_points[static_cast<size_t>(out * G + gi)] = static_cast<uint8_t>(z);
      }
    }
  return Status::Ok();
}

// g_idx: K entries in 0..G−1, g columns per group; kept only when it is not the natural k / g.
Status DecodeGIdx(const TensorView& t, const QuantSpec& spec, Int4Matrix& m) {
  const int64_t G = m.groups();
  std::vector<int32_t> gi(static_cast<size_t>(m.k));
  std::vector<int64_t> count(static_cast<size_t>(G), 0);
  int64_t first_off = -1;  // the first column not in its natural group
  for (int64_t c = 0; c < m.k; ++c) {
    const int32_t v = static_cast<int32_t>(PackedWord(t, c));
    if (v < 0 || v >= G)
      return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(t), ": g_idx[", c, "] = ", v, ", expected a group 0..", G - 1);
    gi[static_cast<size_t>(c)] = v;
    ++count[static_cast<size_t>(v)];
    if (v != c / m.group_size && first_off < 0) first_off = c;
  }
  for (int64_t g = 0; g < G; ++g)
    if (count[static_cast<size_t>(g)] != m.group_size)
      return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(t), ": group ", g, " has ", count[static_cast<size_t>(g)],
                           " columns, expected group_size ", m.group_size);
  if (first_off < 0) return Status::Ok();
  if (!spec.act_order)
    return MakeErrorCode(ErrorCode::kCorruptInput, PackedTensorLabel(t), ": g_idx is not the natural k / ", m.group_size,
                         " (g_idx[", first_off, "] = ", gi[static_cast<size_t>(first_off)],
                         ") but desc_act is false: act-order columns need desc_act true");
  m.g_idx = std::move(gi);
  return Status::Ok();
}

Result<Int4Matrix> DecodeGptq(const GptqConfig& c, const GptqViews& v, const QuantSpec& spec, int64_t n, int64_t k) {
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = spec.EffectiveGroupSize(k);
  m.symmetric = spec.symmetric;
  m.codes.resize(static_cast<size_t>(n * k));
  m.zero_points.resize(static_cast<size_t>(n * m.groups()));
  for (int64_t r = 0; r < k / 8; ++r)
    for (int64_t out = 0; out < n; ++out) {
      uint8_t nib[8];
      UnpackNibbleWord(PackedWord(*v.qweight, r * n + out), PackMethod::kOrder, nib);
      std::copy(nib, nib + 8, m.codes.begin() + static_cast<ptrdiff_t>(out * k + 8 * r));
    }
  NIBBLE_RETURN_IF_ERROR(DecodeZeros(c, *v.qzeros, spec, m));
  NIBBLE_RETURN_IF_ERROR(ReadGroupScales(*v.scales, m));
  if (v.g_idx != nullptr) NIBBLE_RETURN_IF_ERROR(DecodeGIdx(*v.g_idx, spec, m));
  return m;
}

const std::vector<std::string>& PackedSuffixes() {
  static const std::vector<std::string> s = {"qweight", "qzeros", "scales", "g_idx"};
  return s;
}

// The first dynamic entry that re.match-es `name`, or nullptr.
Result<const GptqOverride*> FirstOverride(const GptqConfig& c, const std::string& name) {
  for (const GptqOverride& o : c.dynamic) {
    NIBBLE_ASSIGN_OR_RETURN(bool hit, MatchesExcludeEntry(name, "re:" + o.pattern));
    if (hit) return &o;
  }
  return static_cast<const GptqOverride*>(nullptr);
}

using Read = EngineRead;

// vLLM: dynamic matched against its own layer name, which for q/k/v and gate/up is the fused
// module (qkv_proj, gate_up_proj); lm_head as the config says.
Result<Read> ReadVllm(const GptqConfig& c, const std::string& name, const std::optional<QuantSpec>& meant, bool tied) {
  if (name == "lm_head" && tied) return Read{};
  std::string fused;
  FusedShards(name, &fused);
  const std::string vname = fused.empty() ? name : fused;
  NIBBLE_ASSIGN_OR_RETURN(std::optional<QuantSpec> got, ResolveGptqSpec(c, vname));
  if (SameEngineSpec(got, meant, 0) || fused.empty()) return Read{got};
  return Read{std::nullopt, "dynamic is matched against vLLM's fused module " + fused + " (" + (got ? DescribeSpec(*got) : std::string("float")) + ")", "",
              "a dynamic entry that also matches " + fused + " (nibble quantize writes them so when every shard agrees)"};
}

// ONNX Runtime GenAI's GPTQModel: quantized when stored; group size from the first "+:"/bare
// dynamic pattern re.match-ing the tensor name ("P.qweight"); zeros always read as v1.
Result<Read> ReadOrt(const GptqConfig& c, const std::string& name, const std::optional<QuantSpec>& meant) {
  if (!meant) return Read{};
  QuantSpec s = *meant;
  s.group_size = c.group_size;
  for (const GptqOverride& o : c.dynamic) {
    if (o.exclude) continue;
    NIBBLE_ASSIGN_OR_RETURN(bool hit, MatchesExcludeEntry(name + ".qweight", "re:" + o.pattern));
    if (hit) {
      if (o.group_size) s.group_size = *o.group_size;
      break;
    }
  }
  if (c.v2) return Read{s, "", "adds 1 to every stored zero (it reads checkpoint_format gptq_v2 as v1)", "--gptq_format v1"};
  if (s.group_size != meant->group_size)
    return Read{s, "", "dynamic patterns are matched against tensor names (P.qweight) and -: entries are skipped",
                "one group size for every layer"};
  return Read{s};
}

class GptqFormat final : public QuantizedFormat {
 public:
  explicit GptqFormat(GptqConfig c) : c_(std::move(c)) {}
  std::string name() const override { return "gptq"; }
  Result<LinearPlan> Resolve(const std::string& module) const override { return ResolveGptq(c_, module); }
  Result<std::optional<Int4Matrix>> Import(const TensorStore& store, const std::string& module, const LinearPlan& plan,
                                           int64_t n, int64_t k) const override {
    if (!plan.spec) {
      NIBBLE_RETURN_IF_ERROR(CheckFloatModule(store, module, n, k, PackedSuffixes(), "GPTQ", plan.rule));
      return std::optional<Int4Matrix>{};
    }
    NIBBLE_ASSIGN_OR_RETURN(GptqViews v, FindGptqTensors(c_, store, module, *plan.spec, n, k));
    NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m, DecodeGptq(c_, v, *plan.spec, n, k));
    return std::optional<Int4Matrix>(std::move(m));
  }
  Status CheckLinear(const TensorStore& store, const std::string& module, const LinearPlan& plan, int64_t n,
                     int64_t k) const override {
    if (!plan.spec) return CheckFloatModule(store, module, n, k, PackedSuffixes(), "GPTQ", plan.rule);
    auto v = FindGptqTensors(c_, store, module, *plan.spec, n, k);
    return v.ok() ? Status::Ok() : Status(v.error());
  }
  std::vector<std::string> TensorSuffixes() const override { return {"weight", "qweight", "qzeros", "scales", "g_idx"}; }
  nlohmann::ordered_json ConfigJson() const override { return c_.json; }
  std::vector<std::pair<std::string, std::string>> Properties() const override {
    return {{"checkpoint_format", c_.v2 ? "gptq_v2" : "gptq (v1)"},
            {"desc_act", c_.desc_act ? "true" : "false"},
            {"sym", c_.sym ? "true" : "false"},
            {"dynamic", std::to_string(c_.dynamic.size()) + " entries"}};
  }
  Result<EnginesReport> Engines(const std::vector<LinearShapeInfo>& linears, bool tied) const override;
  Result<std::vector<std::string>> UnusedConfigEntries(const std::vector<std::string>& modules) const override {
    std::vector<std::string> out;
    for (const GptqOverride& o : c_.dynamic) {
      bool used = false;
      for (const std::string& m : modules) {
        NIBBLE_ASSIGN_OR_RETURN(const GptqOverride* first, FirstOverride(c_, m));
        used = used || first == &o;
      }
      if (!used) out.push_back("dynamic entry " + Quoted(o.key) + " decides no module (it matches none, or an earlier entry wins)");
    }
    return out;
  }
  Result<DType> StoredScaleDType(const TensorStore& store, const std::string& module) const override {
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* s, store.Get(module + ".scales"));
    return s->dtype;
  }

 private:
  GptqConfig c_;
};

Result<EnginesReport> GptqFormat::Engines(const std::vector<LinearShapeInfo>& linears, bool tied) const {
  EnginesReport rep;
  rep.engines = {"nibble", "transformers (gptqmodel)", "vllm", "onnxruntime-genai"};
  for (const LinearShapeInfo& l : linears) {
    NIBBLE_ASSIGN_OR_RETURN(std::optional<QuantSpec> meant, ResolveGptqSpec(c_, l.name));
    EnginesReport::Linear out{l, EngineSpecText(meant, l.k), {}};
    Read reads[4];
    reads[0] = RunsEmbedding(l.name, tied) ? Read{} : Read{meant};
    reads[1] = reads[0];
    NIBBLE_ASSIGN_OR_RETURN(reads[2], ReadVllm(c_, l.name, meant, tied));
    NIBBLE_ASSIGN_OR_RETURN(reads[3], ReadOrt(c_, l.name, meant));
    for (const Read& got : reads) out.readings.push_back(EngineCell(got, meant, l.k, "re-export with nibble quantize (it unties a quantized lm_head)"));
    rep.linears.push_back(std::move(out));
  }
  const GptqConfig& c = c_;
  SpecResolver resolve = [&c](const std::string& m) { return ResolveGptqSpec(c, m); };
  NIBBLE_ASSIGN_OR_RETURN(rep.tp, TensorParallelTable(resolve, linears));
  return rep;
}

// config.json's quantization_config, or quantize_config.json when config.json has none; with
// both, the keys they share must agree (SPEC §9.4).
Result<std::unique_ptr<QuantizedFormat>> OpenGptq(const std::string& text, const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(text, path));
  const nlohmann::ordered_json raw = nlohmann::ordered_json::parse(text);
  const size_t slash = path.find_last_of('/');
  const std::string side = JoinPath(slash == std::string::npos ? "." : path.substr(0, slash), "quantize_config.json");
  const bool in_config = j.is_object() && j.contains("quantization_config") && j["quantization_config"].is_object();
  nlohmann::ordered_json qc = in_config ? raw["quantization_config"] : nlohmann::ordered_json::object();
  std::string where = path + ": quantization_config";
  if (PathExists(side)) {
    NIBBLE_ASSIGN_OR_RETURN(std::string side_text, ReadFileToString(side));
    NIBBLE_ASSIGN_OR_RETURN(nlohmann::json q2, ParseJsonText(side_text, side));
    if (!q2.is_object()) return MakeErrorCode(ErrorCode::kCorruptInput, side, ": expected a JSON object, found ", q2.type_name());
    const nlohmann::ordered_json side_qc = nlohmann::ordered_json::parse(side_text);
    if (in_config) {
      NIBBLE_RETURN_IF_ERROR(CheckGptqConfigsAgree(qc, path, side_qc, side));
    } else {
      qc = side_qc;
      where = side;
    }
  }
  NIBBLE_ASSIGN_OR_RETURN(GptqConfig c, ParseGptqConfig(qc, where));
  c.json = std::move(qc);
  return std::unique_ptr<QuantizedFormat>(new GptqFormat(std::move(c)));
}

}  // namespace

const FormatEntry& GptqFormatEntry() {
  static const FormatEntry e{"gptq", "gptq", "GPTQ (AutoGPTQ / GPTQModel, v1 and v2)", OpenGptq, MakeGptqWriter, true};
  return e;
}

}  // namespace nibble
