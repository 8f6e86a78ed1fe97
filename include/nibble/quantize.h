// Quantizing a float checkpoint (RTN, AWQ, GPTQ) into a quantized checkpoint, converting
// quantized checkpoints between formats, inspecting a checkpoint without running it, and
// summarising quantization reports. Requests use AMD Quark's vocabulary
// (quantize_quark.py flags and its quantization_config).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nibble/cancel.h>
#include <nibble/error.h>

namespace nibble {

/// A checkpoint's size in the one convention nibble prints everywhere (quantize, inspect,
/// compare): bits per weight over the quantized linears' weights, their scales and zero points
/// included, and the bytes of all tensors, against the same checkpoint with those linears in float.
struct SizeSummary {
  int64_t quantized_linears = 0;
  int64_t quantized_weights = 0;   // out_features x in_features summed over the quantized linears
  int64_t quantized_bytes = 0;     // their stored bytes: packed weights, scales, zero points
  int64_t tensor_bytes = 0;        // every tensor of the checkpoint
  int64_t float_tensor_bytes = 0;  // the same with the quantized linears in float (float_bits each)
  int float_bits = 0;              // bits of the float weights (16 or 32)
  double bits_per_weight() const {
    return quantized_weights > 0 ? 8.0 * static_cast<double>(quantized_bytes) / static_cast<double>(quantized_weights) : 0.0;
  }
};

/// The size as one line: "4.25 bits/weight in 42 quantized linears (scales and zero points
/// included); tensors 3,104,768 bytes (3.10 MB), 3.76x smaller than with 16-bit float linears".
std::string FormatSize(const SizeSummary& size);

/// Where a quantize run is (QuantizeRequest::on_stage): decoder layer `layer` (1-based) of
/// `layers` starts `stage`, `layers_done` finished. Calibrated chains: load, calibrate (AWQ's
/// search and the fp pass), quantize (GPTQ, the codes, the error report), write; RTN: quantize.
struct QuantizeStage {
  int64_t layer = 0, layers = 0, layers_done = 0;
  std::string stage;
  int64_t rss_anon_bytes = -1;  // the process's RssAnon now, -1 unknown
};

/// `nibble quantize` request, in AMD Quark's vocabulary (quantize_quark.py flags).
struct QuantizeRequest {
  std::string model_dir;
  std::string output_dir;
  /// w_uint4_per_group_asym | w_int4_per_group_sym | w_uint4_per_channel_asym | w_int4_per_channel_sym
  std::string quant_scheme = "w_uint4_per_group_asym";
  int64_t group_size = 128;           // per_group schemes
  std::string quant_algo = "rtn";  // rtn | awq | gptq | awq,gptq (DescribeQuantAlgo)
  std::string model_export = "hf_format";  // the checkpoint format written (hf_format: AMD Quark)
  std::string gptq_format = "v1";  // --model_export gptq: v1 (stores z - 1) | v2 (stores z)
  std::string pack_method = "reorder";  // reorder | order
  std::vector<std::string> exclude_layers = {"lm_head"};  // fnmatch patterns or "re:<regex>"; "" entries ignored
  /// False: exclude_layers is the default, and a layer_quant_config pattern matching lm_head
  /// lifts the default lm_head exclusion (an explicit override wins over a default). True (the
  /// user gave the list): Quark semantics, exclude wins over every override.
  bool exclude_layers_given = false;
  /// Per-layer overrides "PATTERN:key=value[,key=value]", keys: group_size, quant_scheme.
  std::vector<std::string> layer_quant_config;
  /// A Quark `quantization_config` JSON file applied as written (replaces the flags above).
  std::string quant_config_file;
  std::string misaligned = "error";   // error | exclude | per_channel
  /// > 0: refuse, before quantizing, a configuration vLLM would refuse at this tensor-parallel size.
  int tp = 0;
  int64_t max_shard_size = 5000000000;
  bool overwrite = false;
  int threads = 0;  // 0 = the calling thread's setting
  /// Progress in steps; `total` changes between phases (AWQ layer×mapping steps, then export).
  std::function<void(int64_t done, int64_t total)> progress;
  /// Calibrated algorithms: called as each decoder layer is done (1-based), for logs.
  std::function<void(int64_t layer, int64_t layers)> on_layer;
  /// As each stage of a decoder layer starts (QuantizeStage), for progress displays.
  std::function<void(const QuantizeStage& stage)> on_stage;
  /// The memory and disk plan as one line ("plan: expected peak ..."), once, before the first
  /// layer is read (QuantizeSummary::plan_line).
  std::function<void(const std::string& line)> on_plan;
  /// Refuse, before any layer is read, a run whose planned peak of anonymous memory exceeds this
  /// many bytes (kResourceExhausted, with the numbers and the largest terms); 0 = 90 % of
  /// MemAvailable (DefaultMaxMemory), < 0 = no limit. A run whose output and spool do not fit the
  /// free disk at the output's parent is refused too.
  int64_t max_memory = 0;

  // AWQ (quant_algo "awq", SPEC §2.1). Calibration: `dataset` is a plain-text file (one text) or
  // JSONL with a "text" field; texts are encoded (BOS per text), concatenated and cut into
  // `num_calib_data` chunks of `seq_len` tokens — the first chunks when seed is 0, a seeded
  // shuffle otherwise. Fewer tokens than asked is a warning (on_message) with the real count.
  std::string dataset;
  int64_t num_calib_data = 128;
  int64_t seq_len = 512;
  uint64_t seed = 0;
  bool awq_clip = false;            // AutoAWQ clip search (SPEC §2.3)
  /// fp | quantized: the next layer's calibration input; empty = the algorithm's default (awq: fp,
  /// as AutoAWQ; gptq and awq,gptq: quantized, llm-compressor's sequential pipeline).
  std::string propagate;
  std::string duo_scaling = "true"; // true | false | both (llm-compressor)
  int64_t n_grid = 20;
  /// AWQ and GPTQ: the dtype the calibration forward runs in: auto (the model's torch_dtype, as
  /// llm-compressor and AutoAWQ run it on a GPU) | bf16 | fp16 | fp32 (docs/AWQ.md).
  std::string calib_dtype = "auto";
  // GPTQ (quant_algo "gptq" or "awq,gptq", SPEC §3.1); a "gptq" entry of --quant_config's
  // algo_config (Quark's damp_percent, desc_act, static_groups, block_size) overrides these.
  double dampening_frac = 0.01;           // of the Hessian's mean diagonal
  int64_t block_size = 128;               // columns per lazy batch update
  std::string gptq_scale_timing = "up_front";  // up_front (llm-compressor) | dynamic (GPTQModel)
  std::string actorder = "none";          // none | static | group
  bool true_sequential = false;           // Hessians after the linears before them are quantized
  /// Warnings and notes (calibration shortfall, skipped GQA mappings) as they happen.
  std::function<void(const std::string&)> on_message;
  /// When set and cancelled (from any thread): Quantize stops at its next check (every decoder
  /// layer, AWQ mapping, GPTQ Hessian and linear of the calibrated pipeline; every tensor of the
  /// export) with ErrorCode::kCancelled. The staging directory is removed (kept for `resume` when
  /// `resumable` and a layer boundary was written) and output_dir is left as it was (absent, or
  /// the old checkpoint under overwrite).
  const CancellationToken* cancel = nullptr;
  /// Resumable: the staging directory gets a manifest at every decoder-layer boundary and is kept
  /// when the run stops after one (cancelled, failed, killed); the error then says so. `resume`
  /// continues such a run of output_dir with the same request (--resume): the output is byte for
  /// byte what one uninterrupted run writes; a request or input that differs is refused naming
  /// each difference. docs/ARCHITECTURE.md "Resuming a run".
  bool resumable = false;
  bool resume = false;
};

/// A --quant_algo value as the algorithm registry reads it: a chain of algorithm names run in
/// order on each layer ("awq,gptq", also written "awq+gptq").
struct QuantAlgoInfo {
  std::string name;   // canonical: "awq,gptq"
  std::string label;  // for people: "AWQ+GPTQ"
  bool calibrated = false;  // needs calibration data (--dataset)
};

/// Checks a --quant_algo value against the registry without running anything. Errors name an
/// unknown algorithm and the known ones, a repeated one, and a chain in an order it cannot run
/// in (smoothing after rounding, two rounding algorithms, rtn in a chain).
Result<QuantAlgoInfo> DescribeQuantAlgo(const std::string& quant_algo);

/// The registry's algorithm names, in the order errors list them ("rtn", "awq", "gptq").
std::vector<std::string> QuantAlgoNames();

/// AWQ outcome of one scaling_layers mapping in one decoder layer.
struct AwqMappingSummary {
  std::string prev_op;
  std::vector<std::string> layers;
  bool skipped = false;
  std::string skip_reason;
  double ratio = 0;      // chosen grid ratio
  bool duo = false;      // chosen candidate used duo scaling
  double loss_rtn = 0;   // MSE of the inspected module's output with plain RTN (identity scales)
  double loss_best = 0;  // MSE with the chosen scales
  int64_t rejected = 0;  // grid candidates rejected (overflow / non-finite)
  int64_t stopped_early = 0;  // grid candidates dropped once their partial loss exceeded the best so far
  double scale_min = 0, scale_max = 0;
};

/// Outcome of one decoder layer of a calibrated algorithm (AWQ, GPTQ, AWQ+GPTQ).
struct CalibLayerSummary {
  struct Linear {
    std::string name;
    bool quantized = false;
    double rtn_error = 0;     // relative output error ||XWᵀ − XŴᵀ||² / ||XWᵀ||² of plain RTN
    double method_error = 0;  // the same for the algorithm's weights on their (smoothed) inputs
    // GPTQ only: the damping that factorised, the failed factorisations before it, inputs whose
    // Hessian diagonal is 0, and whether it fell back to RTN.
    bool gptq = false;
    double dampening_frac = 0;
    int retries = 0;
    int64_t dead_columns = 0;
    bool fallback_rtn = false;
  };
  int64_t layer = 0;
  std::vector<AwqMappingSummary> mappings;
  std::vector<Linear> linears;
  double seconds = 0;
};

struct QuantizeSummary {
  struct Layer {
    std::string name, rule, scheme;  // scheme empty when kept in float
    bool quantized = false;
    int64_t n = 0, k = 0, bytes_in = 0, bytes_out = 0;
    double rel_error = 0;  // ||W - dequant||_F / ||W||_F
  };
  std::vector<Layer> layers;
  int64_t shards = 0, total_bytes = 0;
  SizeSummary size;  // of the written checkpoint
  std::vector<std::string> copied_files;  // files copied from the input (tokenizer, generation config, ...)
  double seconds = 0;
  std::string quantization_config_json;  // as written into config.json
  std::string quant_algo;        // the chain as run, canonical (QuantAlgoInfo::name)
  std::string quant_algo_label;  // QuantAlgoInfo::label
  bool calibrated = false;       // a calibrated chain: the fields below are filled
  // Calibrated algorithms only:
  std::vector<CalibLayerSummary> calib_layers;  // AWQ mappings empty for GPTQ
  double calib_seconds = 0;
  std::string propagate;           // as run: fp | quantized
  int64_t hessian_peak_bytes = 0;  // GPTQ: the largest one Hessian and its factorisation took
  int64_t calib_chunks = 0, calib_seq_len = 0, calib_available_chunks = 0, calib_total_tokens = 0;
  /// Resident memory of the process during the run (/proc/self/status, sampled), bytes, -1 when
  /// unknown: RssAnon at the start and its peak (memory quantize itself holds), the peak of
  /// RssFile (pages of mapped files, chiefly the input: the kernel can drop them) and VmHWM.
  int64_t start_anon_bytes = -1, peak_anon_bytes = -1, peak_file_bytes = -1, vm_hwm_bytes = -1;
  std::vector<std::string> messages;
  /// The memory and disk plan made before the first layer: its line and its JSON object
  /// (peak_anon_bytes, peak_phase, terms, output_bytes, disk_bytes, free_disk_bytes, disk_dir).
  std::string plan_line, plan_json;
  int64_t plan_peak_anon_bytes = 0;
  /// The machine-readable report (`nibble quantize --report`): settings, calibration, per layer
  /// mappings and per-linear errors, per-linear export summary. JSON text.
  std::string report_json;
};

/// Quantizes a float checkpoint into an AMD Quark hf_format checkpoint (atomically written).
/// Errors: bad flags (unknown scheme / pack method, malformed overrides), conflicting flags with
/// --quant_config, every config / tensor / output error of the pipeline.
Result<QuantizeSummary> Quantize(const QuantizeRequest& request);

/// What `nibble inspect` shows for a model directory.
struct InspectReport {
  struct Layer {
    std::string name;
    bool quantized = false;
    std::string scheme;  // "uint4 per_group g128" or "float (BF16)"
    std::string rule;    // why: layer_quant_config["…"] / layer_type_quant_config / global / excluded by "…" / not quantized
    int64_t n = 0, k = 0;
    int64_t stored_bytes = 0;  // bytes of this module's weight tensors on disk
    int64_t float_bytes = 0;   // bytes the same weight takes in the model dtype
  };
  std::string dir;
  std::string format;  // "dense" | a checkpoint format's name ("quark")
  std::string torch_dtype;
  /// The format's own properties, in order (Quark: {"pack_method", "reorder"}); empty for dense.
  std::vector<std::pair<std::string, std::string>> format_properties;
  std::string quantization_config_json;  // quantized checkpoints only
  std::vector<Layer> layers;
  int64_t total_tensor_bytes = 0;  // all tensors on disk
  SizeSummary size;
  std::vector<std::string> warnings;  // as ModelInfo::warnings, plus config entries that match no layer
  /// `inspect --engines` (quantized checkpoints): per linear what each engine resolves.
  std::vector<std::string> engines;  // "nibble", "transformers", "vllm", ...
  struct EngineRow {
    std::string name, meant;            // the linear and what the file means (Quark semantics)
    std::vector<std::string> readings;  // per engine: "uint4 per_group g128", "float", "fails to load"
    std::vector<bool> agrees;
  };
  std::vector<EngineRow> engine_rows;
  std::vector<std::string> engine_disagreements;  // one line per engine and reason
  struct TensorParallel {
    int tp = 1;
    bool ok = true;
    std::string failure;  // the first layer vLLM would refuse at this size, and why
  };
  std::vector<TensorParallel> tensor_parallel;  // TP = 1, 2, 4, 8
};

/// Inspects a model directory without running it. Errors: unreadable / malformed files.
Result<InspectReport> Inspect(const std::string& dir);

/// `nibble inspect --json`'s object, indented by 2: dir, format, torch_dtype, the format's
/// properties, total_tensor_bytes, size (SizeSummaryJson), layers (name, quantized, scheme, rule,
/// out_features, in_features, stored_bytes, float_bytes, bits_per_weight), quantization_config,
/// with `engines` the engines' readings and tensor-parallel readiness, and warnings.
std::string InspectJson(const InspectReport& report, bool engines);
/// A size as a JSON object (one line): bits_per_weight and every SizeSummary field.
std::string SizeSummaryJson(const SizeSummary& size);

/// `nibble convert`: a quantized checkpoint re-written in another format (or the same one with
/// other packing) without re-quantizing: every code, zero point and scale is carried over, the
/// float tensors, tokenizer files and generation_config are copied, and the output is staged and
/// renamed into place when complete.
struct ConvertRequest {
  std::string input_dir;
  std::string output_dir;
  std::string to;           // hf_format (or quark) | compressed-tensors | awq | gptq
  std::string pack_method;  // hf_format: reorder | order; "" = the input's when it is Quark, else reorder
  std::string gptq_format;  // gptq: v1 | v2; "" = the writer's default
  int64_t max_shard_size = 5000000000;
  bool overwrite = false;
  std::function<void(const std::string&)> on_message;
  /// As QuantizeRequest::cancel: checked before every linear read and every tensor written.
  const CancellationToken* cancel = nullptr;
};

struct ConvertSummary {
  std::string from, to;  // format names ("quark", "compressed-tensors", ...)
  int64_t quantized_linears = 0;
  int64_t float_tensors = 0;  // tensors copied as they are
  int64_t shards = 0;
  int64_t total_bytes = 0;
  std::vector<std::string> copied_files;
  std::vector<std::string> messages;  // notes and warnings, as printed
  std::string quantization_config_json;
  double seconds = 0;
};

/// Errors: a dense input (nothing to convert), an unknown target, whatever the target format
/// cannot hold (named per layer by its writer), every read error of the input.
Result<ConvertSummary> Convert(const ConvertRequest& request);

/// `nibble verify A B`: two checkpoints of any formats (dense included) compared as the model
/// sees them: each linear's dequantized weight and every other tensor's values.
struct VerifyRequest {
  std::string a_dir, b_dir;
};

struct VerifyEntry {
  std::string name;        // a linear module, or a tensor name
  bool linear = false;     // a linear's (dequantized) weight, else a tensor copied as it is
  bool identical = false;  // every value equal (and, for a tensor, same dtype and shape)
  double max_abs_diff = 0; // over the values that differ
  int64_t differing = 0, total = 0;
  std::string a, b;        // how each side stores it ("uint4 asym g128", "float BF16 [64, 64]", "absent")
};

struct VerifyReport {
  std::string a_format, b_format;  // "quark", "gptq", ..., "dense"
  std::vector<VerifyEntry> entries;  // linears in model order, then tensors by name
  bool identical() const {
    for (const VerifyEntry& e : entries)
      if (!e.identical) return false;
    return true;
  }
};

/// Errors: either side unreadable (every load error of a checkpoint, named by file and tensor),
/// or the two configs giving a linear different shapes.
Result<VerifyReport> Verify(const VerifyRequest& request);


}  // namespace nibble
