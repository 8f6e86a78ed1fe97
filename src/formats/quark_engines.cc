// Engine models of Quark config resolution and tensor-parallel readiness (SPEC §1.3, §1.6-1.8).
#include "formats/quark_engines.h"

#include <map>
#include <tuple>

#include "base/strings.h"
#include "formats/fnmatch.h"

namespace nibble {

namespace {

std::string SpecText(const std::optional<WeightQuantSpec>& s, int64_t k) {
  if (!s) return "float";
  return std::string(QuantDTypeName(s->dtype)) + " " + QSchemeName(s->qscheme) + " g" +
         std::to_string(s->EffectiveGroupSize(k));
}

bool SameSpec(const std::optional<WeightQuantSpec>& a, const std::optional<WeightQuantSpec>& b, int64_t k) {
  if (!a || !b) return !a && !b;
  return a->dtype == b->dtype && a->qscheme == b->qscheme && a->EffectiveGroupSize(k) == b->EffectiveGroupSize(k);
}

// An engine's resolution of one name: a spec, or a refusal to load.
struct QuarkRead {
  std::optional<WeightQuantSpec> spec;
  std::string fails;  // non-empty: the engine refuses the checkpoint
};

Result<bool> VllmIgnored(const QuarkQuantConfig& c, const std::string& name, bool glob_exclude) {
  for (const std::string& e : c.exclude) {
    if (e == name) return true;
    if (e.rfind("re:", 0) == 0) {
      NIBBLE_ASSIGN_OR_RETURN(bool hit, MatchesExcludeEntry(name, e));
      if (hit) return true;
    } else if (glob_exclude && FnMatch(name, e)) {
      return true;
    }
  }
  return false;
}

std::optional<WeightQuantSpec> VllmLayerSpec(const QuarkQuantConfig& c, const std::string& name) {
  for (const auto& [key, spec] : c.layer_quant_config) {
    const bool glob = key.find('*') != std::string::npos;
    if (glob ? FnMatch(name, key) : key.find(name) != std::string::npos) return spec;
  }
  return c.global;
}

Result<QuarkRead> ReadVllm(const QuarkQuantConfig& c, const std::string& name, bool glob_exclude, bool tied) {
  if (name == "lm_head" && tied) return QuarkRead{};
  std::string fused;
  std::vector<std::string> shards = FusedShards(name, &fused);
  if (shards.empty()) shards = {name};
  NIBBLE_ASSIGN_OR_RETURN(bool ignored, VllmIgnored(c, name, glob_exclude));
  for (const std::string& s : shards) {
    NIBBLE_ASSIGN_OR_RETURN(bool other, VllmIgnored(c, s, glob_exclude));
    if (other != ignored) return QuarkRead{std::nullopt, "fused " + fused + ": some shards excluded, others not (ValueError)"};
  }
  if (ignored) return QuarkRead{};
  const std::optional<WeightQuantSpec> spec = VllmLayerSpec(c, name);
  for (const std::string& s : shards)
    if (VllmLayerSpec(c, s) != spec) return QuarkRead{std::nullopt, "fused " + fused + ": shards resolve to different specs (ValueError)"};
  if (spec && spec->group_size <= 0)
    return QuarkRead{std::nullopt, "group_size " + std::string(spec->qscheme == QScheme::kPerChannel ? "null (per_channel)" : "-1") +
                                  ": vLLM's W4A16 scheme needs a positive group_size"};
  return QuarkRead{spec, ""};
}

QuarkRead ReadTransformers(const QuarkQuantConfig& c, const std::string& name, bool tied) {
  if (name == "lm_head" && tied) return QuarkRead{};
  for (const std::string& e : c.exclude)
    if (FnMatch(name, e)) return QuarkRead{};
  for (const auto& [key, spec] : c.layer_quant_config)
    if (FnMatch(name, key)) return QuarkRead{spec, ""};
  if (auto it = c.layer_type_quant_config.find("Linear"); it != c.layer_type_quant_config.end()) return QuarkRead{it->second, ""};
  return QuarkRead{c.global, ""};
}

// ORT GenAI decodes what is stored: `meant` says whether the module's tensors are quantized.
QuarkRead ReadOrt(const QuarkQuantConfig& c, const std::string& name, const std::optional<WeightQuantSpec>& meant) {
  if (!meant) return QuarkRead{};
  const std::string top = name.substr(0, name.find('.'));
  std::optional<WeightQuantSpec> spec = c.global;
  for (const auto& [key, s] : c.layer_quant_config)
    if (key == top) spec = s;
  if (!spec) return QuarkRead{std::nullopt, "no weight spec for top-level module " + Quoted(top)};
  WeightQuantSpec r = *spec;
  r.dtype = QuantDType::kUint4;  // codes are never sign-extended
  r.qscheme = QScheme::kPerGroup;
  return QuarkRead{r, ""};
}

// Why an engine's reading differs from the file's meaning, and what avoids it.
std::pair<std::string, std::string> Explain(const std::string& engine, const QuarkQuantConfig& c, const std::string& name,
                                            const std::optional<WeightQuantSpec>& meant, const QuarkRead& got, bool tied) {
  if (!got.fails.empty()) {
    if (got.fails.rfind("fused", 0) == 0)
      return {got.fails, "give q/k/v_proj (gate/up_proj) of a layer the same --layer_quant_config and --exclude_layers"};
    if (got.fails.rfind("group_size", 0) == 0)
      return {got.fails, "a per_group scheme (--misaligned per_channel writes one group per row as per_group)"};
    return {got.fails, "a global weight spec"};
  }
  if (name == "lm_head" && tied && meant) return {"tie_word_embeddings is true: runs the embedding", "re-export with nibble quantize (it unties a quantized lm_head)"};
  if (engine.rfind("onnxruntime", 0) == 0) {
    if (meant->dtype == QuantDType::kInt4) return {"reads int4 codes as uint4 (no sign extension)", "--quant_scheme w_uint4_per_group_asym"};
    if (meant->qscheme == QScheme::kPerChannel) return {"assumes the per_group [K, N/8] layout", "a per_group scheme"};
    return {"per-layer specs are looked up by the top-level module name only: the global group size applies inside decoder layers",
            "no per-layer group sizes inside decoder layers (--misaligned exclude instead of per_channel, no --layer_quant_config there); ORT GenAI's builder cannot express them"};
  }
  for (const std::string& e : c.exclude)
    if (e != name && !e.empty()) {
      auto hit = MatchesExcludeEntry(name, e);
      if (hit.ok() && *hit) return {"exclude entry " + Quoted(e) + " is not matched as Quark matches it", "list excluded layers by exact name (nibble quantize writes them so)"};
    }
  return {"layer_quant_config keys are matched differently (substring, comma or glob)", "one exact-name key per layer (nibble quantize writes them so)"};
}

}  // namespace

// Quark semantics (ResolveLayer) as the neutral resolver the tensor-parallel check reads.
SpecResolver QuarkSpecResolver(const QuarkQuantConfig& c) {
  return [&c](const std::string& module) -> Result<std::optional<QuantSpec>> {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig r, ResolveLayer(c, module));
    if (!r.spec) return std::optional<QuantSpec>{};
    QuantSpec q;
    q.granularity = r.spec->qscheme == QScheme::kPerChannel ? Granularity::kPerChannel : Granularity::kPerGroup;
    q.group_size = r.spec->group_size;
    q.symmetric = r.spec->symmetric;
    return std::optional<QuantSpec>(q);
  };
}

Result<EnginesReport> ReportEngines(const QuarkQuantConfig& c, const std::vector<LinearShapeInfo>& linears, bool tied) {
  EnginesReport rep;
  rep.engines = {"nibble", "transformers", "vllm", "vllm (fnmatch exclude)", "onnxruntime-genai"};
  const bool ort_order = c.export_config.pack_method == PackMethod::kOrder;
  for (const LinearShapeInfo& l : linears) {
    NIBBLE_ASSIGN_OR_RETURN(ResolvedLayerConfig meant, ResolveLayer(c, l.name));
    EnginesReport::Linear out;
    out.shape = l;
    out.meant = SpecText(meant.spec, l.k);
    std::vector<QuarkRead> reads(5);
    if (!RunsEmbedding(l.name, tied)) reads[0] = QuarkRead{meant.spec, ""};
    reads[1] = ReadTransformers(c, l.name, tied);
    NIBBLE_ASSIGN_OR_RETURN(reads[2], ReadVllm(c, l.name, false, tied));
    NIBBLE_ASSIGN_OR_RETURN(reads[3], ReadVllm(c, l.name, true, tied));
    reads[4] = ReadOrt(c, l.name, meant.spec);
    for (size_t e = 0; e < reads.size(); ++e) {
      EngineReading r;
      const QuarkRead& got = reads[e];
      r.text = got.fails.empty() ? SpecText(got.spec, l.k) : "fails to load";
      r.agrees = got.fails.empty() && SameSpec(got.spec, meant.spec, l.k);
      if (e == 4 && meant.spec && (meant.spec->dtype == QuantDType::kInt4 || meant.spec->qscheme == QScheme::kPerChannel))
        r.agrees = false;
      if (!r.agrees) std::tie(r.why, r.avoid) = Explain(rep.engines[e], c, l.name, meant.spec, got, tied);
      if (e == 4 && r.agrees && meant.spec && ort_order) {
        r.agrees = false;
        r.why = "assumes the reorder nibble order (export.pack_method is not read)";
        r.avoid = "--pack_method reorder";
      }
      out.readings.push_back(std::move(r));
    }
    rep.linears.push_back(std::move(out));
  }
  NIBBLE_ASSIGN_OR_RETURN(rep.tp, TensorParallelTable(QuarkSpecResolver(c), linears));
  return rep;
}

Status CheckTensorParallel(const QuarkQuantConfig& c, const std::vector<LinearShapeInfo>& linears, int tp) {
  return CheckTensorParallel(QuarkSpecResolver(c), linears, tp);
}

}  // namespace nibble
