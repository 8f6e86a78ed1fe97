// What other engines make of a Quark checkpoint's config: per linear, the spec vLLM, ONNX Runtime
// GenAI, Transformers and nibble resolve, every disagreement with what the file means (Quark
// semantics, SPEC §1.3), and tensor-parallel readiness as vLLM checks it at load.
//
// Engine models (SPEC §1.3, §1.7, §1.8; what each reads, not what it should read):
// * nibble: ResolveLayer (Quark semantics; comma-separated keys split; `re:` excludes).
// * Transformers: Quark's own importer — fnmatch keys and excludes; a comma key is one literal
//   pattern; no `re:`; a tied model runs the embedding as lm_head.
// * vLLM: `exclude` entries equal to the name or `re:` regexes (re.match); a layer_quant_config key
//   without `*` matches when the layer name is a substring of the key, with `*` by fnmatch; the
//   type map is never consulted; q/k/v and gate/up are fused, so their shards must resolve alike
//   (else ValueError); group_size must be a positive integer; a tied model runs the embedding.
// * vLLM (fnmatch versions): the same with fnmatch `exclude` entries.
// * ONNX Runtime GenAI: a module is quantized when its tensors are stored; its group size is that
//   of layer_quant_config[top-level module name] (e.g. "model", "lm_head"), else the global one;
//   codes are read as uint4 in `reorder` order with the per_group [K, N/8] layout.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/quark_config.h"

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

/// The report for `c` over `linears`; `tied` is the model's tie_word_embeddings.
/// Errors: as ResolveLayer.
Result<EnginesReport> ReportEngines(const QuarkQuantConfig& c, const std::vector<LinearShapeInfo>& linears, bool tied);

/// One line per (engine, reason) with the number of linears it affects, the first of them and the
/// flag that avoids it ("" when every engine agrees).
std::vector<std::string> EngineDisagreementLines(const EnginesReport& r);

/// Whether the quantized linears fit tensor parallelism of `tp` shards as vLLM checks at load: a
/// row-parallel layer (o_proj, down_proj) needs K / tp to be a whole number of groups, a
/// column-parallel one N / tp to be a multiple of 8 (its packed words). "" when they do, else the
/// first layer that does not and why.
Result<std::string> TensorParallelFailure(const QuarkQuantConfig& c, const std::vector<LinearShapeInfo>& linears, int tp);

/// TensorParallelFailure as an error naming the layer and the TP sizes (of 1, 2, 4, 8) that work.
Status CheckTensorParallel(const QuarkQuantConfig& c, const std::vector<LinearShapeInfo>& linears, int tp);

}  // namespace nibble
