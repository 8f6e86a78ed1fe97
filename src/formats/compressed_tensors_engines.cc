// Engine models of compressed-tensors config resolution (see the header).
#include "formats/compressed_tensors_engines.h"

#include <algorithm>
#include <cctype>
#include <tuple>

#include "formats/fnmatch.h"

namespace nibble {

namespace {

using Read = EngineRead;

std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::optional<QuantSpec> GroupSpec(const CtConfig& c, size_t gi) {
  const auto& w = c.groups[gi].weights;
  return w ? std::optional<QuantSpec>(CtSpecFor(*w)) : std::nullopt;
}

// The compressed-tensors library: ignore by name / regex / class; targets ordered exact, regex,
// class, each kind sorted as strings.
Result<Read> ReadTransformers(const CtConfig& c, const std::string& name, bool tied) {
  if (name == "lm_head" && tied) return Read{};
  for (const std::string& e : c.ignore) {
    NIBBLE_ASSIGN_OR_RETURN(bool hit, CtEntryMatches(name, e));
    if (hit) return Read{};
  }
  std::optional<std::tuple<int, std::string, size_t>> best;  // (kind, target, group)
  for (const auto& [t, gi] : c.targets) {
    int kind = -1;
    if (t == name) kind = 0;
    else if (IsCtLinearClass(t)) kind = 2;
    else if (IsRegexEntry(t)) {
      NIBBLE_ASSIGN_OR_RETURN(bool hit, MatchesExcludeEntry(name, t));
      if (hit) kind = 1;
    }
    if (kind >= 0 && (!best || std::make_tuple(kind, t) < std::make_tuple(std::get<0>(*best), std::get<1>(*best))))
      best = std::make_tuple(kind, t, gi);
  }
  if (!best) return Read{};
  return Read{GroupSpec(c, std::get<2>(*best)), ""};
}

// vLLM's name for the layer a projection runs in, its class, and the shards fused into it.
struct VllmLayer {
  std::string name, cls;
  std::vector<std::string> shards;  // empty: not fused
};

VllmLayer VllmLayerOf(const std::string& module) {
  const size_t dot = module.rfind('.');
  const std::string prefix = module.substr(0, dot + 1), leaf = module.substr(dot + 1);
  if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj")
    return {prefix + "qkv_proj", "QKVParallelLinear", {prefix + "q_proj", prefix + "k_proj", prefix + "v_proj"}};
  if (leaf == "gate_proj" || leaf == "up_proj")
    return {prefix + "gate_up_proj", "MergedColumnParallelLinear", {prefix + "gate_proj", prefix + "up_proj"}};
  return {module, "RowParallelLinear", {}};
}

Result<bool> VllmIgnored(const CtConfig& c, const std::string& name) {
  for (const std::string& e : c.ignore) {
    NIBBLE_ASSIGN_OR_RETURN(bool hit, CtEntryMatches(name, e, false));
    if (hit) return true;
  }
  return false;
}

// The first target matching `value` by name or regex (vLLM's _find_first_match); with
// `contains`, a plain target contained in it, case-insensitively (the class-name pass).
Result<std::optional<size_t>> VllmFirstMatch(const CtConfig& c, const std::string& value, bool contains) {
  for (const auto& [t, gi] : c.targets) {
    bool hit = false;
    if (IsRegexEntry(t)) {
      NIBBLE_ASSIGN_OR_RETURN(hit, MatchesExcludeEntry(value, t));
    } else {
      hit = contains ? Lower(value).find(Lower(t)) != std::string::npos : t == value;
    }
    if (hit) return std::optional<size_t>(gi);
  }
  return std::optional<size_t>{};
}

Result<std::optional<size_t>> VllmTarget(const CtConfig& c, const VllmLayer& l) {
  NIBBLE_ASSIGN_OR_RETURN(std::optional<size_t> g, VllmFirstMatch(c, l.name, false));
  if (g) return g;
  NIBBLE_ASSIGN_OR_RETURN(g, VllmFirstMatch(c, l.cls, true));
  if (g || l.shards.empty()) return g;
  std::optional<size_t> first;
  for (const std::string& s : l.shards) {
    NIBBLE_ASSIGN_OR_RETURN(std::optional<size_t> m, VllmFirstMatch(c, s, false));
    if (!m) return std::optional<size_t>{};
    if (!first) first = m;
  }
  return first;
}

bool SameSpec(const std::optional<QuantSpec>& a, const std::optional<QuantSpec>& b, int64_t k) {
  return SameEngineSpec(a, b, k) && (!a || a->act_order == b->act_order);
}

Result<Read> ReadVllm(const CtConfig& c, const std::string& name, bool tied) {
  if (name == "lm_head") {
    if (tied) return Read{};
    NIBBLE_ASSIGN_OR_RETURN(CtResolved meant, ResolveCt(c, name));
    if (meant.spec) return Read{std::nullopt, "lm_head is a ParallelLMHead, which the compressed-tensors config does not quantize"};
    return Read{};
  }
  const VllmLayer l = VllmLayerOf(name);
  bool ignored = false;
  if (l.shards.empty() || std::find(c.ignore.begin(), c.ignore.end(), l.name) != c.ignore.end()) {
    NIBBLE_ASSIGN_OR_RETURN(ignored, VllmIgnored(c, l.name));
  } else {
    NIBBLE_ASSIGN_OR_RETURN(ignored, VllmIgnored(c, l.shards[0]));
    for (const std::string& s : l.shards) {
      NIBBLE_ASSIGN_OR_RETURN(bool other, VllmIgnored(c, s));
      if (other != ignored) return Read{std::nullopt, "fused " + l.name + ": some shards ignored, others not"};
    }
  }
  if (ignored) return Read{};
  NIBBLE_ASSIGN_OR_RETURN(std::optional<size_t> g, VllmTarget(c, l));
  if (!g) return Read{std::nullopt, "no target matches " + l.name + " (" + l.cls + ") and it is not ignored"};
  const std::optional<QuantSpec> spec = GroupSpec(c, *g);
  for (const std::string& s : l.shards) {
    NIBBLE_ASSIGN_OR_RETURN(CtResolved r, ResolveCt(c, s));
    if (!SameSpec(r.spec, spec, int64_t{1} << 30))
      return Read{std::nullopt, "fused " + l.name + ": its shards mean different specs, one scheme is made for the fused weight"};
  }
  return Read{spec, ""};
}

std::pair<std::string, std::string> Explain(size_t engine, const std::string& name, const Read& got, bool tied,
                                            const std::optional<QuantSpec>& meant) {
  if (engine == 3)
    return {"its model builder reads Quark, AWQ and GPTQ checkpoints, not quant_method \"compressed-tensors\"",
            meant && meant->act_order
                ? "re-quantize without --actorder group (ONNX models have no g_idx), then nibble export-onnx"
                : "nibble export-onnx --model DIR --out ONNX_DIR writes the ONNX model ONNX Runtime GenAI runs"};
  if (name == "lm_head" && tied && meant)
    return {"tie_word_embeddings is true: runs the embedding", "re-export with nibble quantize (it unties a quantized lm_head)"};
  if (got.fails.rfind("fused", 0) == 0)
    return {got.fails, "give q/k/v_proj (gate/up_proj) of a layer the same spec and --exclude_layers"};
  if (got.fails.rfind("lm_head", 0) == 0) return {got.fails, "keep lm_head in float (--exclude_layers lm_head)"};
  if (!got.fails.empty()) return {got.fails, "target or ignore every linear by exact name (nibble quantize writes them so)"};
  if (engine == 1)
    return {"matching targets are ordered exact name, regex, class, each sorted as strings (not in list order)",
            "one exact-name target per module (nibble quantize writes them so)"};
  return {"ignore entries match by name or regex only, and targets are matched against fused layers and vLLM class names",
          "exact-name targets and ignore entries (nibble quantize writes them so)"};
}

}  // namespace

SpecResolver CtSpecResolver(const CtConfig& c) {
  return [&c](const std::string& module) -> Result<std::optional<QuantSpec>> {
    NIBBLE_ASSIGN_OR_RETURN(CtResolved r, ResolveCt(c, module));
    return r.spec;
  };
}

Result<EnginesReport> ReportCtEngines(const CtConfig& c, const std::vector<LinearShapeInfo>& linears, bool tied) {
  EnginesReport rep;
  rep.engines = {"nibble", "transformers", "vllm", "onnxruntime-genai"};
  for (const LinearShapeInfo& l : linears) {
    NIBBLE_ASSIGN_OR_RETURN(CtResolved meant, ResolveCt(c, l.name));
    EnginesReport::Linear out;
    out.shape = l;
    out.meant = EngineSpecText(meant.spec, l.k);
    std::vector<Read> reads(4);
    if (!RunsEmbedding(l.name, tied)) reads[0] = Read{meant.spec, ""};
    NIBBLE_ASSIGN_OR_RETURN(reads[1], ReadTransformers(c, l.name, tied));
    NIBBLE_ASSIGN_OR_RETURN(reads[2], ReadVllm(c, l.name, tied));
    reads[3] = Read{std::nullopt, "not read"};
    for (size_t e = 0; e < reads.size(); ++e) {
      EngineReading r;
      const Read& got = reads[e];
      r.text = got.fails.empty() ? EngineSpecText(got.spec, l.k) : "fails to load";
      r.agrees = got.fails.empty() && SameSpec(got.spec, meant.spec, l.k);
      if (!r.agrees) std::tie(r.why, r.avoid) = Explain(e, l.name, got, tied, meant.spec);
      out.readings.push_back(std::move(r));
    }
    rep.linears.push_back(std::move(out));
  }
  NIBBLE_ASSIGN_OR_RETURN(rep.tp, TensorParallelTable(CtSpecResolver(c), linears));
  return rep;
}

}  // namespace nibble
