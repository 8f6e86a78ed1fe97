// What other engines make of a quantized checkpoint's config, in format-neutral terms: per linear
// what each engine resolves against what the file means, and tensor-parallel readiness as vLLM
// checks it at load. Each format models its engines' resolution rules itself
// (QuantizedFormat::Engines; quark_engines.h, ...); the report shape and its summary live here.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/quant_spec.h"

namespace nibble {

/// One linear of the model: HF module name, N = out_features, K = in_features.
struct LinearShapeInfo {
  std::string name;
  int64_t n = 0, k = 0;
};

/// What one engine reads for one linear.
struct EngineReading {
  std::string text;        // "uint4 per_group g128", "float", "fails to load"
  bool agrees = true;      // the same as what the file means
  std::string why;         // when it does not: the rule that differs
  std::string avoid;       // the quantize flag (or step) that avoids it
};

struct EnginesReport {
  std::vector<std::string> engines;  // column names, nibble first
  struct Linear {
    LinearShapeInfo shape;
    std::string meant;                   // what the file means (Quark semantics)
    std::vector<EngineReading> readings;  // per engine, as `engines`
  };
  std::vector<Linear> linears;
  /// Tensor-parallel readiness for TP = 1, 2, 4, 8.
  struct Tp {
    int tp = 1;
    bool ok = true;
    std::string failure;  // the first layer that fails, and why
  };
  std::vector<Tp> tp;
};

/// An engine model's reading of one module: a spec (nullopt = float) or a refusal to load
/// (`fails`), and where the reading differs from the file for another reason, why and the flag or
/// step that avoids it.
struct EngineRead {
  std::optional<QuantSpec> spec;
  std::string fails{}, why{}, avoid{};
};

/// Whether linear `name` of a model with tie_word_embeddings `tied` (as FindOutputProjection,
/// model/output_projection.h, answers it) runs the float embedding in nibble, Transformers and
/// vLLM, whatever the config or the stored lm_head tensors say.
inline bool RunsEmbedding(const std::string& name, bool tied) { return tied && name == "lm_head"; }

/// "float", or DescribeSpec with a group larger than K shown as the one group it is.
std::string EngineSpecText(const std::optional<QuantSpec>& s, int64_t k);

/// The report cell for `got` against what the file means: it agrees when it loads, names no
/// reason and has the same spec (SameEngineSpec); a disagreement with no reason of its own is the
/// tied embedding run as lm_head, avoided by `tied_avoid` unless `got` names its own avoidance.
EngineReading EngineCell(const EngineRead& got, const std::optional<QuantSpec>& meant, int64_t k,
                         const std::string& tied_avoid);

/// One line per engine that loads none of the linears ("ENGINE does not read this checkpoint:
/// why; instead: what to run"); EngineDisagreementLines leaves those engines out.
std::vector<std::string> EngineNotReadingLines(const EnginesReport& r);

/// One line per (engine, reason) with the number of linears it affects, the first of them and the
/// flag that avoids it ("" when every engine agrees).
std::vector<std::string> EngineDisagreementLines(const EnginesReport& r);

/// A linear's resolved spec (nullopt: float), as a format resolves it.
using SpecResolver = std::function<Result<std::optional<QuantSpec>>(const std::string& module)>;

/// Whether the quantized linears fit tensor parallelism of `tp` shards as vLLM checks at load: a
/// row-parallel layer (o_proj, down_proj) needs K / tp to be a whole number of groups, a
/// column-parallel one N / tp to be a multiple of 8 (its packed words). "" when they do, else the
/// first layer that does not and why.
Result<std::string> TensorParallelFailure(const SpecResolver& resolve, const std::vector<LinearShapeInfo>& linears, int tp);

/// TensorParallelFailure for TP = 1, 2, 4, 8, as the report lists it.
Result<std::vector<EnginesReport::Tp>> TensorParallelTable(const SpecResolver& resolve,
                                                           const std::vector<LinearShapeInfo>& linears);

/// TensorParallelFailure as an error naming the layer and the TP sizes (of 1, 2, 4, 8) that work.
Status CheckTensorParallel(const SpecResolver& resolve, const std::vector<LinearShapeInfo>& linears, int tp);

/// The shards of the vLLM module a Llama projection is fused into: for
/// "model.layers.0.self_attn.q_proj" sets `fused` to "model.layers.0.self_attn.qkv_proj" and returns
/// the q/k/v_proj names; gate/up_proj → gate_up_proj; empty (fused untouched) when not fused.
std::vector<std::string> FusedShards(const std::string& module, std::string* fused);

/// The same spec for an engine's purposes: dtype (symmetry), granularity and effective group size.
bool SameEngineSpec(const std::optional<QuantSpec>& a, const std::optional<QuantSpec>& b, int64_t k);

}  // namespace nibble
