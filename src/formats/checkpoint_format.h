// The registry of quantized checkpoint formats. Each format (formats/quark_format.cc, ...) is one
// entry: how to recognise its config.json `quantization_config`, how to resolve a linear module
// to the neutral QuantSpec, how to decode its tensors into the native Int4Matrix, and how to
// write them back. Loading, inspect and export find a format here instead of testing names.
//
// Adding a format: one file pair formats/<name>_format.{h,cc} implementing QuantizedFormat (and
// FormatWriter to export it), and one line in Formats() (checkpoint_format.cc).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "formats/engines.h"
#include "formats/int4_matrix.h"
#include "formats/quant_spec.h"
#include "formats/quark_config.h"
#include "io/safetensors.h"

namespace nibble {

/// What a checkpoint says about one linear module.
struct LinearPlan {
  std::optional<QuantSpec> spec;  // nullopt: stored in float
  std::string rule;               // the config rule that decided, for inspect and messages
};

/// A quantized checkpoint's parsed config, in one format.
class QuantizedFormat {
 public:
  virtual ~QuantizedFormat() = default;
  /// The format's name as `inspect` shows it ("quark").
  virtual std::string name() const = 0;
  /// Resolves module `name` (e.g. "model.layers.0.mlp.down_proj") with the format's rules.
  virtual Result<LinearPlan> Resolve(const std::string& module) const = 0;
  /// Decodes a module the plan quantizes into the native layout [n = out_features, k = in_features],
  /// checking its stored tensors against the plan (names, dtypes, shapes, values); nullopt when
  /// the format stores this quantized module as a float weight (e.g. Quark fake_quantized). For a
  /// module the plan keeps in float, checks that no quantized tensors are stored and returns nullopt.
  virtual Result<std::optional<Int4Matrix>> Import(const TensorStore& store, const std::string& module,
                                                   const LinearPlan& plan, int64_t n, int64_t k) const = 0;
  /// Import without decoding the codes, for a loader that repacks them straight from the stored
  /// words (DeferredInt4); same checks and errors as Import except the codes' values (any nibble
  /// is a valid code). nullopt when this module's codes are not stored transposed (or Import
  /// would give nullopt): the loader then calls Import.
  virtual Result<std::optional<DeferredInt4>> ImportDeferred(const TensorStore& store, const std::string& module,
                                                             const LinearPlan& plan, int64_t n, int64_t k) const {
    (void)store, (void)module, (void)plan, (void)n, (void)k;
    return std::optional<DeferredInt4>{};
  }
  /// Import's checks of the stored tensors' names, dtypes and shapes, without decoding them.
  virtual Status CheckLinear(const TensorStore& store, const std::string& module, const LinearPlan& plan, int64_t n,
                             int64_t k) const = 0;
  /// Suffixes of the tensors a module stores ("weight", "weight_scale", ...), for byte counts.
  virtual std::vector<std::string> TensorSuffixes() const = 0;
  /// The quantization_config as inspect prints it, and the format's own properties for its
  /// summary line (e.g. {"pack_method", "reorder"}).
  virtual nlohmann::ordered_json ConfigJson() const = 0;
  virtual std::vector<std::pair<std::string, std::string>> Properties() const = 0;
  /// What each serving engine resolves for `linears` under this config, against what the file
  /// means (nibble's reading first), and tensor-parallel readiness; `tied` is the model's
  /// tie_word_embeddings. `inspect --engines` and quantize's warnings print it.
  virtual Result<EnginesReport> Engines(const std::vector<LinearShapeInfo>& linears, bool tied) const = 0;
  /// Config entries (rules, patterns, ignore entries) that match none of `modules`, one warning
  /// each.
  virtual Result<std::vector<std::string>> UnusedConfigEntries(const std::vector<std::string>& modules) const = 0;
  /// The dtype a quantized module's scales are stored in (a conversion writes them back in it).
  virtual Result<DType> StoredScaleDType(const TensorStore& store, const std::string& module) const = 0;
};

/// What an export is asked for: the request in Quark's vocabulary (the flags and --quant_config,
/// after policy additions), which every writer translates into its own config.
struct ExportRequest {
  QuarkQuantConfig config;
  /// The model's linear modules as the export writes them, and those the checkpoint does not store
  /// (a tied lm_head): the written config names each decision by exact name for these
  /// (formats/quark_canonical.h). Empty: the config is written as requested.
  std::vector<std::string> modules, absent_modules;
  /// GPTQ zero-point convention: "v1" (checkpoint_format "gptq", stores z − 1; cannot hold z = 0)
  /// or "v2" ("gptq_v2", stores z). Other formats ignore it.
  std::string gptq_format = "v1";
  /// The plan of each of `modules`, in order, when the caller has resolved the request once
  /// (quantize's QuantizePlan); empty: ModulePlans resolves `config`.
  std::vector<LinearPlan> plans{};
};

/// The plan of each of request.modules, in order: request.plans when given, else each module
/// resolved from request.config with Quark semantics (ResolveQuarkLinear). Errors: as that.
Result<std::vector<LinearPlan>> ModulePlans(const ExportRequest& request);

/// The scales of every quantized spec of the request stored in `dt`: the config's and the plans'.
void SetScaleDType(ExportRequest& request, DType dt);

/// Writes one format from the native layout.
class FormatWriter {
 public:
  virtual ~FormatWriter() = default;
  /// The tensors of a quantized module (scales rounded to `scale_dtype`, the model's dtype unless
  /// the spec says otherwise). Errors name the module and what the format cannot hold.
  virtual Result<std::vector<TensorToWrite>> WriteLinear(const std::string& module, const Int4Matrix& m,
                                                         const QuantSpec& spec, DType scale_dtype) const = 0;
  /// The tensors WriteLinear gives a module of [n, k] under `spec` (names, dtypes, shapes, in its
  /// order) without computing them, so an output can be laid out before its first tensor is
  /// quantized (CheckpointWriter::LayOut); nullopt when they depend on the values (an act-order
  /// g_idx) or the format would refuse the module (WriteLinear then names why).
  virtual std::optional<std::vector<TensorSlot>> LinearLayout(const std::string& /*module*/, int64_t /*n*/, int64_t /*k*/,
                                                              const QuantSpec& /*spec*/, DType /*scale_dtype*/) const {
    return std::nullopt;
  }
  /// The `quantization_config` object written into config.json for the final request (an
  /// algorithm may have added its algo_config since the writer was made). Called after every
  /// WriteLinear (GPTQ's desc_act says whether any of them had an act-order g_idx).
  virtual nlohmann::ordered_json QuantizationConfig(const ExportRequest& request) const = 0;
  /// Files the format keeps next to config.json, as (file name, text), for the final request
  /// (GPTQ: quantize_config.json). Called after QuantizationConfig.
  virtual std::vector<std::pair<std::string, std::string>> ExtraFiles(const ExportRequest&) const { return {}; }
  /// The dtype the format stores every scale in whatever the model's dtype (AutoAWQ and GPTQ:
  /// fp16), or nullopt for the model's. quantize computes the scales in it.
  virtual std::optional<DType> ScaleDType() const { return std::nullopt; }
  /// What WriteLinear recorded for QuantizationConfig (act-order modules), saved at a resumable
  /// run's layer boundary and restored on --resume (quantize/resume.h); null when nothing.
  virtual nlohmann::ordered_json SaveState() const { return nullptr; }
  virtual Status LoadState(const nlohmann::ordered_json& /*state*/) const { return Status::Ok(); }
};

struct FormatEntry {
  const char* quant_method;  // config.json quantization_config.quant_method
  const char* export_name;   // `quantize --model_export` value
  const char* description;
  /// Parses config.json's text (`path` names it) into the format's config.
  Result<std::unique_ptr<QuantizedFormat>> (*open)(const std::string& config_text, const std::string& path);
  Result<std::unique_ptr<FormatWriter>> (*writer)(const ExportRequest& request);
  bool holds_g_idx;  // stores an act-order g_idx (a column order other than k / group_size)
};

/// Every format, in the order they are tried.
const std::vector<FormatEntry>& Formats();
/// The entry for `--model_export NAME`, or an error listing the supported names.
Result<const FormatEntry*> FindExportFormat(const std::string& export_name);

/// Reads dir/config.json: nullptr for a dense checkpoint (no quantization_config), else the
/// format's parsed config. Errors: unreadable / malformed config.json, a quant_method no entry
/// claims (listing the supported ones), the format's own parse errors.
Result<std::unique_ptr<QuantizedFormat>> OpenCheckpointFormat(const std::string& dir);

}  // namespace nibble
