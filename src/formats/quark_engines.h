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
#include "formats/engines.h"
#include "formats/quark_config.h"

namespace nibble {

/// The report for `c` over `linears`; `tied` is the model's tie_word_embeddings.
/// Errors: as ResolveLayer.
Result<EnginesReport> ReportEngines(const QuarkQuantConfig& c, const std::vector<LinearShapeInfo>& linears, bool tied);

/// Quark semantics (ResolveLayer) as the neutral resolver; `c` must outlive it.
SpecResolver QuarkSpecResolver(const QuarkQuantConfig& c);

/// Tensor-parallel readiness of `c` (TensorParallelFailure over its resolved specs) as an error
/// naming the layer and the TP sizes (of 1, 2, 4, 8) that work.
Status CheckTensorParallel(const QuarkQuantConfig& c, const std::vector<LinearShapeInfo>& linears, int tp);

}  // namespace nibble
