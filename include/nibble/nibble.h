// nibble public C++ API: load a Hugging Face Llama-family checkpoint (dense now; quantized
// formats as they land), generate text, and measure perplexity. Errors are values (Result /
// Status, <nibble/result.h>) whose messages name the file, tensor or key involved.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nibble/result.h>

namespace nibble {

/// Sets the number of worker threads for all compute (0 = all cores). Default: all cores.
void SetNumThreads(int n);
/// Threads compute currently uses.
int NumThreads();

/// What was loaded (config.json numbers and how the weights are stored).
struct ModelInfo {
  std::string dir;
  std::string architecture;  // "LlamaForCausalLM", ...
  std::string model_type;
  std::string torch_dtype;
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0, num_attention_heads = 0,
          num_key_value_heads = 0, head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int64_t num_parameters = 0;  // logical weight count (embeddings, norms, linears, lm_head if untied)
  std::string weight_format;   // "dense"
  int64_t int4_linears = 0;    // linears (projections and lm_head) stored as int4
};

/// A loaded model with its tokenizer.
class Model {
 public:
  /// Loads `dir` (config.json, model.safetensors or a sharded index, tokenizer.model).
  /// Errors: missing / malformed files, unsupported architecture, tensors whose shape or dtype
  /// disagree with config.json, PyTorch pickles (refused).
  static Result<std::unique_ptr<Model>> Load(const std::string& dir);
  ~Model();
  const ModelInfo& info() const;

  /// Tokenizes like the HF tokenizer's default call (BOS prepended when add_bos_token).
  Result<std::vector<int32_t>> Tokenize(const std::string& text) const;
  std::string Detokenize(const std::vector<int32_t>& ids) const;

  /// fp32 logits for every position of `ids` run as one sequence from position 0: [T, vocab].
  Result<std::vector<float>> Logits(const std::vector<int32_t>& ids) const;

  /// Opt-in W4A8 (off by default; W4A16 numerics are the contract): int4 linears quantize their
  /// activations dynamically to int8 per block of 128 values (symmetric, max|x|/127, as
  /// llama.cpp's Q8 dot products) and use the int8 GEMV (AVX-512 VNNI where available) for decode
  /// and prefill. Costs perplexity; measure it with `nibble perplexity --int8_activations`.
  /// Returns how many linears switched (0 for a dense model; int4 linears with a group size other
  /// than 32, 64 or a multiple of 128 stay W4A16). Not thread-safe against concurrent use.
  int64_t SetInt8Activations(bool on);

  /// Opt-in bf16 activations (off by default): int4 linears round their activations to bf16
  /// (round to nearest even) — W4A16 as an engine running bf16 activations computes it — and use
  /// the AVX-512 BF16 kernels (vdpbf16ps, 32 products per instruction) where the CPU has
  /// avx512_bf16 and avx512_vbmi, for decode and (g a multiple of 128) prefill; other CPUs, and
  /// prefill with g = 32 / 64, run the W4A32 kernels on the bf16-rounded activations. Costs little perplexity; measure it with `nibble perplexity
  /// --bf16_activations`. Returns how many linears switched (0 for a dense model; group sizes
  /// that are not multiples of 32 stay fp32). Switching it on switches int8 activations off in
  /// those linears, and the reverse. Not thread-safe against concurrent use.
  int64_t SetBf16Activations(bool on);

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  Model();
  std::unique_ptr<Impl> impl_;
};

struct GenerateOptions {
  std::string prompt;           // may be empty: generation starts from BOS alone
  int64_t max_new_tokens = 128;
  float temperature = 0.8f;     // 0 = greedy
  int64_t top_k = 40;           // 0 = no top-k
  float top_p = 0.95f;          // 1 = no nucleus cut
  uint64_t seed = 0;
  int64_t warmup = 0;           // untimed prompt prefills before the timed run (benchmarks)
};

struct GenerateStats {
  int64_t prompt_tokens = 0;     // incl. BOS
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;    // prompt forward pass up to the first sampled token
  double decode_seconds = 0;     // all later tokens
  std::string stop_reason;       // "max_new_tokens" | "eos" | "context_full"
};

/// Generates from `options.prompt`, calling `on_text` with each new piece of UTF-8 text as soon
/// as it is complete (the prompt text itself is not echoed). Errors: prompt not UTF-8, prompt
/// longer than max_position_embeddings, empty prompt without a BOS token.
Result<GenerateStats> Generate(const Model& model, const GenerateOptions& options,
                               const std::function<void(std::string_view)>& on_text);

struct PerplexityOptions {
  int64_t seq_len = 2048;
  int64_t max_windows = 0;  // 0 = every full window
  std::function<void(int64_t done, int64_t total)> progress;
};

/// Result of the "GPTQ/AWQ paper" protocol (SPEC §6.1), with the protocol's numbers.
struct PerplexityReport {
  double ppl = 0, mean_nll = 0;
  int64_t seq_len = 0, n_tokens = 0, n_windows = 0, n_windows_available = 0, scored_tokens = 0,
          dropped_tokens = 0;
  bool bos_prepended = false;
  double seconds = 0;
  double tokens_per_second = 0;  // forward throughput (tokens run / seconds)
};

/// Tokenizes `text` once and evaluates non-overlapping windows. Errors: text not UTF-8, fewer
/// tokens than one window, seq_len out of range.
Result<PerplexityReport> EvaluatePerplexity(const Model& model, const std::string& text,
                                            const PerplexityOptions& options);

}  // namespace nibble

namespace nibble {

/// `nibble quantize` request, in AMD Quark's vocabulary (quantize_quark.py flags).
struct QuantizeRequest {
  std::string model_dir;
  std::string output_dir;
  /// w_uint4_per_group_asym | w_int4_per_group_sym | w_uint4_per_channel_asym | w_int4_per_channel_sym
  std::string quant_scheme = "w_uint4_per_group_asym";
  int64_t group_size = 128;           // per_group schemes
  std::string quant_algo = "rtn";
  std::string pack_method = "reorder";  // reorder | order
  std::vector<std::string> exclude_layers = {"lm_head"};  // fnmatch patterns or "re:<regex>"
  /// Per-layer overrides "PATTERN:key=value[,key=value]", keys: group_size, quant_scheme.
  std::vector<std::string> layer_quant_config;
  /// A Quark `quantization_config` JSON file applied as written (replaces the flags above).
  std::string quant_config_file;
  std::string misaligned = "error";   // error | exclude | per_channel
  int64_t max_shard_size = 5000000000;
  bool overwrite = false;
  /// Progress in steps; `total` changes between phases (AWQ layer×mapping steps, then export).
  std::function<void(int64_t done, int64_t total)> progress;

  // AWQ (quant_algo "awq", SPEC §2.1). Calibration: `dataset` is a plain-text file (one text) or
  // JSONL with a "text" field; texts are encoded (BOS per text), concatenated and cut into
  // `num_calib_data` chunks of `seq_len` tokens — the first chunks when seed is 0, a seeded
  // shuffle otherwise. Fewer tokens than asked is a warning (on_message) with the real count.
  std::string dataset;
  int64_t num_calib_data = 128;
  int64_t seq_len = 512;
  uint64_t seed = 0;
  bool awq_clip = false;            // AutoAWQ clip search (SPEC §2.3)
  std::string propagate = "fp";     // fp | quantized: the next layer's calibration input
  std::string duo_scaling = "true"; // true | false | both (llm-compressor)
  int64_t n_grid = 20;
  /// Warnings and notes (calibration shortfall, skipped GQA mappings) as they happen.
  std::function<void(const std::string&)> on_message;
};

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

/// AWQ outcome of one decoder layer.
struct AwqLayerSummary {
  struct Linear {
    std::string name;
    bool quantized = false;
    double rtn_error = 0;  // relative output error of plain RTN on calibration inputs
    double awq_error = 0;  // same for the AWQ weights on their (smoothed) inputs
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
  double seconds = 0;
  std::string quantization_config_json;  // as written into config.json
  std::string quant_algo;
  // AWQ only:
  std::vector<AwqLayerSummary> awq_layers;
  double awq_seconds = 0;
  std::string propagate;
  int64_t calib_chunks = 0, calib_seq_len = 0, calib_available_chunks = 0, calib_total_tokens = 0;
  std::vector<std::string> messages;
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
  std::string format;  // "dense" | "quark"
  std::string torch_dtype;
  std::string pack_method;  // quark only
  std::string quantization_config_json;  // quark only
  std::vector<Layer> layers;
  int64_t total_tensor_bytes = 0;  // all tensors on disk
};

/// Inspects a model directory without running it. Errors: unreadable / malformed files.
Result<InspectReport> Inspect(const std::string& dir);

}  // namespace nibble

namespace nibble {

/// Options of CompareModels: the perplexity protocol (SPEC §6.1) shared by every model.
struct CompareOptions {
  int64_t seq_len = 512;
  int64_t max_windows = 0;  // 0 = every full window
  std::function<void(int64_t done, int64_t total)> progress;
};

/// One model compared with the base (float) model on the same windows.
struct ComparisonRow {
  std::string dir;
  PerplexityReport perplexity;
  double mean_kld = 0;        // mean over scored positions of KL(P_base || P_model), nats
  double max_kld = 0;
  double top1_agreement = 0;  // fraction of positions whose argmax equals the base's
};

struct ComparisonReport {
  PerplexityReport base;
  std::vector<ComparisonRow> rows;
};

/// Tokenizes `text` with the base model's tokenizer once and runs the base and every model on
/// the same windows (the measures of llama.cpp's --kl-divergence, over all scored positions).
/// Errors: no models, vocab sizes that differ, text not UTF-8, fewer tokens than one window,
/// seq_len out of range.
Result<ComparisonReport> CompareModels(const Model& base, const std::vector<const Model*>& models, const std::string& text,
                                       const CompareOptions& options);

/// Human summary of a `nibble quantize --report` JSON file (per layer: chosen ratio, loss
/// before / after, per-linear errors). Errors: unreadable file, not a nibble report.
Result<std::string> SummarizeQuantizeReport(const std::string& report_path);

/// Draws per-linear relative output error (RTN vs AWQ, log scale) of a report into a PNG
/// (cairo). Errors: unreadable / malformed report, a report without AWQ layers, unwritable PNG,
/// a build without cairo ("built without cairo: PNG plots are unavailable").
Status PlotQuantizeReport(const std::string& report_path, const std::string& png_path);

/// Writes `bytes` to `path` atomically (a temporary file beside it, fsync, rename): a reader never
/// sees a half-written file, and a failed write leaves any previous file at `path` as it was. Used
/// for `nibble quantize --report`. Errors name the path and the OS reason (missing directory,
/// permission, full disk).
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace nibble
