// Weight-only 4-bit quantization of a dense HF checkpoint: resolve each linear's spec from the
// request (Quark semantics, SPEC §1.3) into the neutral QuantSpec, choose the values (RTN, or a
// calibrated algorithm on the sequential pipeline: quantize/pipeline.h), hand the codes to the
// export format's writer (formats/checkpoint_format.h), copy every other tensor unchanged in its
// dtype, write config.json with the format's quantization_config and the side files, and commit
// the output directory atomically (io/checkpoint_writer.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/memory.h"
#include "base/result.h"
#include "formats/quark_config.h"
#include "quantize/algorithm.h"
#include "quantize/calib_result.h"
#include "quantize/plan.h"
#include "quantize/resource_plan.h"

namespace nibble {

using ProcessMemoryPeaks = PeakMemorySampler::Peaks;

struct QuantizeOptions {
  std::string model_dir;
  std::string output_dir;
  QuarkQuantConfig config;          // as the user asked; policy additions are made on a copy
  /// A chain of registered algorithms (quantize/algorithm.h): "rtn", "awq", "gptq", "awq,gptq".
  std::string quant_algo = "rtn";
  std::string model_export = "hf_format";  // FormatEntry::export_name
  std::string gptq_format = "v1";          // ExportRequest::gptq_format
  // Calibration data of a calibrated chain (quantize/calibration.h).
  std::string dataset;              // plain text or JSONL ("text")
  int64_t num_calib_data = 128;     // chunks
  int64_t calib_seq_len = 512;      // tokens per chunk
  uint64_t seed = 0;                // 0 = the first chunks in order
  /// Each algorithm's settings from the flags; an entry of the algorithm's name in
  /// config.algo_config (e.g. from --quant_config) overrides them key by key (AWQ's
  /// scaling_layers, notably).
  AlgorithmFlags algorithms;
  std::function<void(const std::string&)> message;  // warnings / notes as they happen
  MisalignedPolicy misaligned = MisalignedPolicy::kError;
  /// The user's own --exclude_layers replaced the default lm_head exclusion: a quantized lm_head
  /// gets a note saying so.
  bool note_replaced_head_exclusion = false;
  int tp = 0;  // > 0: refuse up front a config vLLM would refuse at this tensor-parallel size
  int64_t max_shard_size = 5000000000;  // bytes per safetensors shard (HF's "5GB")
  bool overwrite = false;
  std::function<void(int64_t done, int64_t total)> progress;
  std::function<void(int64_t layer, int64_t layers)> on_layer;  // calibrated algorithms, per layer done
  /// Each decoder layer's stages as they start: `layer` (1-based) of `layers`, `done` layers
  /// finished, `stage` load | calibrate | quantize | write (calibrated chains; RTN: quantize).
  std::function<void(int64_t layer, int64_t layers, int64_t done, const std::string& stage)> on_stage;
  /// The memory and disk plan, once, before the first layer is read (and before it is checked).
  std::function<void(const ResourcePlan&)> on_plan;
  /// Refuse a run whose plan's peak exceeds this many bytes (0 = 90 % of MemAvailable, < 0 = no
  /// limit); a run whose output does not fit the free disk is refused too.
  int64_t max_memory = 0;
  /// Checked by the calibrated pipeline (PipelineOptions::cancel), before each tensor is exported
  /// and before the commit: cancelled, the staging directory is removed and kCancelled returned.
  const CancellationToken* cancel = nullptr;
  /// A resumable run (quantize/resume.h): a manifest at every layer boundary, and the staging
  /// directory kept when the run stops after one (cancelled, failed, killed).
  bool resumable = false;
  /// Continue the interrupted resumable run of output_dir (implies resumable).
  bool resume = false;
  /// The flags that decide the output's bytes, by flag name: a resumed run must match them.
  nlohmann::ordered_json resume_settings = nlohmann::ordered_json::object();
};

/// One linear module as exported.
struct QuantizedLayerReport {
  std::string name;
  std::string rule;        // which config rule decided (PlannedLinear::rule)
  bool quantized = false;
  std::string scheme;      // e.g. "uint4 per_group g128"; empty when kept in float
  int64_t n = 0, k = 0;
  int64_t bytes_in = 0;    // stored bytes of the input weight
  int64_t bytes_out = 0;   // stored bytes of weight + scale + zero point (or the copied weight)
  double rel_error = 0;    // ||W - dequant(Q(W))||_F / ||W||_F (0 when kept in float)
};

struct QuantizeReport {
  std::vector<QuantizedLayerReport> layers;
  AlgorithmPlan algorithms;          // the plan's chain, with the settings as run
  std::optional<CalibResult> calib;  // calibrated chains
  Propagation propagation = Propagation::kFp;  // calibrated chains, as run
  int64_t calib_chunks = 0, calib_seq_len = 0, calib_available_chunks = 0, calib_total_tokens = 0;
  /// Warnings and notes (calibration, skipped mappings; after the commit, what only the model and
  /// the written config reveal: unused config entries, engines that read it otherwise).
  std::vector<std::string> messages;
  nlohmann::ordered_json quantization_config;  // as written to config.json
  std::vector<std::string> copied_files;  // side files copied from the input (tokenizer, ...)
  int64_t shards = 0;
  int64_t total_bytes = 0;          // all tensor bytes written
  double seconds = 0;
  /// Resident memory over the run (PeakMemorySampler), bytes, -1 unknown: RssAnon at the start and
  /// its peak (what quantize itself holds), RssFile's peak (pages of the mmap'd input and of the
  /// spool being copied into a shard, which the kernel can drop) and VmHWM (peak of the total).
  ProcessMemoryPeaks memory;
  ResourcePlan plan;  // as planned before the first layer
};

/// Runs the whole export. Errors: input errors (config, tensors), a misaligned layer under
/// kError, an existing output_dir without overwrite, unwritable output (names the path).
/// The output directory is either absent / unchanged or complete (atomic rename); so after
/// kCancelled.
Result<QuantizeReport> QuantizeCheckpoint(const QuantizeOptions& options);

}  // namespace nibble
