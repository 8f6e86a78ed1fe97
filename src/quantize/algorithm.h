// The quantization algorithms (RTN, AWQ, GPTQ) as one registry, as the checkpoint formats are
// one (formats/checkpoint_format.h). A --quant_algo value is a chain of registry names run in
// order on each layer ("awq,gptq": AWQ's scaling, then GPTQ's rounding); ResolveAlgorithms turns
// it once per run into an AlgorithmPlan: each algorithm's entry and its settings (the request's
// flags, overridden key by key by the algorithm's algo_config entry), validated once. The plan
// (quantize/plan.h) holds it; the pipeline run, the written algo_config, the model card and the
// --report read it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "formats/checkpoint_format.h"
#include "model/config.h"
#include "quantize/awq/settings.h"
#include "quantize/calib_result.h"
#include "quantize/gptq/settings.h"
#include "quantize/memory_model.h"
#include "quantize/pipeline.h"

namespace nibble {

/// The settings the request's flags give each algorithm, before its algo_config entry overrides
/// them: one field per algorithm that has settings.
struct AlgorithmFlags {
  AwqSettings awq;
  GptqSettings gptq;
  /// --propagate, for every algorithm of the chain; nullopt: the default of the chain's last one.
  std::optional<Propagation> propagation;
  /// --calib_dtype, for every algorithm of the chain (kAuto: the model's torch_dtype).
  CalibDType calib_dtype = CalibDType::kAuto;
};

/// One algorithm's part of a calibrated run: a LayerAlgorithm of the pipeline that reports its
/// outcome into the one report type (quantize/calib_result.h).
class ChainAlgorithm : public LayerAlgorithm {
 public:
  /// Its outcome on the `i`-th layer the run processed.
  virtual void ReportLayer(size_t i, CalibLayerResult& out) const = 0;
  /// Its outcome over the run (mappings used, peak memory).
  virtual void ReportRun(CalibResult& out) const {}
  /// What it accumulated over the layers done (reports, messages), saved at each layer boundary
  /// of a resumable run (quantize/resume.h), and restored by a resumed run: ReportLayer, ReportRun
  /// and Messages then give what one uninterrupted run gives. Errors: a malformed state.
  virtual nlohmann::ordered_json SaveState() const { return nullptr; }
  virtual Status LoadState(const nlohmann::ordered_json& state) { return Status::Ok(); }
};

/// One algorithm's settings for a run, resolved and validated once: what the rest of the run
/// needs from them.
class AlgorithmSettings {
 public:
  virtual ~AlgorithmSettings() = default;
  /// Where the next layer's calibration input comes from (the chain's last algorithm decides).
  virtual Propagation propagation() const = 0;
  /// LayerRunner's reuse of the attention stages (false recomputes them: a test switch).
  virtual bool reuse_attention() const { return true; }
  /// Its algorithm may run a layer in chunks (LayerAlgorithm::FinishGrams serves: the pipeline's
  /// and the memory plan's chunked layer, AlgorithmPlan::ChunkedLayers) / reads Gram matrices.
  virtual bool Chunkable() const { return false; }
  virtual bool NeedsGrams() const { return false; }
  /// Refuses an export format that cannot hold what the algorithm produces; `model_export` is
  /// the format as the request named it.
  virtual Status CheckExport(const FormatEntry& format, const std::string& model_export) const { return Status::Ok(); }
  /// The per-run algorithm (cannot fail: the settings are valid).
  virtual std::unique_ptr<ChainAlgorithm> MakeAlgorithm() const = 0;
  /// The phases of a layer in which it holds buffers of its own (Hessians, candidate weights),
  /// each with those buffers only: the memory plan (quantize/resource_plan.h) adds `layer.base`.
  virtual std::vector<MemoryPhase> MemoryPhases(const LayerMemoryShape& layer) const { return {}; }
  /// Whether its Transform of a chunked layer leaves the attention residual kept
  /// (LayerRunner::ForEachChunk) into the fp pass: the plan counts it there.
  virtual bool KeepsAttention(const LayerMemoryShape& layer) const { return false; }
  /// Its algo_config entries written to config.json after `run`.
  virtual std::vector<nlohmann::ordered_json> AlgoConfig(const CalibResult& run, const ModelConfig& mc) const = 0;
  /// Its section of the --report JSON (under its name), after `run`.
  virtual nlohmann::ordered_json ReportJson(const CalibResult& run) const = 0;
};

/// What an algorithm needs besides the weights.
enum class CalibrationNeed {
  kNone,         // the weights alone (RTN)
  kLayerInputs,  // calibration tokens through the sequential pipeline: each linear's inputs
};

/// An algorithm's place in a chain.
enum class AlgorithmRole {
  kSmoothing,  // changes the float weights (AWQ's scales); the linears are rounded after it
  kRounding,   // chooses the codes (RTN, GPTQ): at most one per chain, and last
};

/// One registered algorithm.
struct QuantAlgorithm {
  const char* name;           // its --quant_algo name and its algo_config entry's "name"
  const char* label;          // in summaries and errors: "AWQ"
  const char* card;           // the model card's algorithm when it runs alone
  const char* card_in_chain;  // its part of that line in a chain: "AWQ scaling"
  CalibrationNeed calibration;
  AlgorithmRole role;
  Propagation default_propagation;  // as the chain's last algorithm, without --propagate
  /// Its settings for a run: `flags`' with `propagation`, its algo_config entry over them (`entry`:
  /// FindAlgoConfigEntry's, nullptr when none; `where` names it in errors), validated. nullptr: it
  /// has none (RTN).
  Result<std::shared_ptr<const AlgorithmSettings>> (*resolve)(const AlgorithmFlags& flags, Propagation propagation,
                                                              const nlohmann::ordered_json* entry, const std::string& where);
  /// When it is not in the chain `chain`: refuses its flags that would change the run (GPTQ's
  /// --actorder), and checks the others as they would run. nullptr: nothing to check.
  Status (*check_unused)(const AlgorithmFlags& flags, const std::string& chain);
};

/// Every algorithm, in the order errors list them.
const std::vector<QuantAlgorithm>& QuantAlgorithms();

/// A chain's names ("awq,gptq", or "awq+gptq") as registry entries, in order. Errors (kUnsupported
/// for an unknown name, else kInvalidArgument) name the name and the known ones, a repeated name,
/// a smoothing algorithm after the rounding one, two rounding algorithms, and an algorithm
/// without calibration (RTN) in a chain of several.
Result<std::vector<const QuantAlgorithm*>> ParseAlgorithmChain(const std::string& text);

/// One algorithm of a run with its settings (nullptr for RTN).
struct PlannedAlgorithm {
  const QuantAlgorithm* algo = nullptr;
  std::shared_ptr<const AlgorithmSettings> settings;
};

/// The run's chain, resolved once.
struct AlgorithmPlan {
  std::vector<PlannedAlgorithm> chain;
  /// The dtype the calibration forward runs in (PipelineOptions::calib_dtype).
  CalibDType calib_dtype = CalibDType::kFp32;

  std::string Name() const;   // canonical: "awq,gptq"
  std::string Label() const;  // "AWQ+GPTQ"
  /// Whether it runs on the sequential pipeline with calibration data.
  bool Calibrated() const;
  /// The chain's propagation: its last algorithm's (kFp when none has settings).
  Propagation propagation() const;
  bool ReuseAttention() const;
  /// Whether the pipeline runs each layer in chunks of sequences (a 16-bit calibration dtype for
  /// `mc` and a chain of Chunkable algorithms: pipeline.h ChunkedLayer).
  bool ChunkedLayers(const ModelConfig& mc) const;
  /// Whether an algorithm of the chain reads Gram matrices after the fp pass (NeedsGrams).
  bool NeedsGrams() const;
  /// The model card's algorithm line: "AWQ scaling, then GPTQ rounding".
  std::string CardLine() const;
  Status CheckExport(const FormatEntry& format, const std::string& model_export) const;
  /// The per-run algorithms, in chain order (those with settings).
  std::vector<std::unique_ptr<ChainAlgorithm>> MakeAlgorithms() const;
  /// The algo_config list written to config.json after `run`: each algorithm's entries in order.
  nlohmann::ordered_json AlgoConfig(const CalibResult& run, const ModelConfig& mc) const;
  /// The --report sections: {name: section} in chain order.
  nlohmann::ordered_json ReportJson(const CalibResult& run) const;
};

/// `chain` (ParseAlgorithmChain) with each algorithm's settings from `flags` and `algo_config`
/// (QuantAlgorithm::resolve), after checking the flags of the algorithms not in it
/// (QuantAlgorithm::check_unused): every setting validated once. The propagation is
/// flags.propagation, else the default of the chain's last algorithm.
Result<AlgorithmPlan> ResolveAlgorithms(const std::vector<const QuantAlgorithm*>& chain, const AlgorithmFlags& flags,
                                        const nlohmann::ordered_json& algo_config);

}  // namespace nibble
