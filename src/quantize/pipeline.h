// The sequential layer pipeline every calibrated quantization algorithm runs in (llm-compressor's
// sequential pipeline; AutoAWQ / llm-awq run the same loop). Per decoder layer, in order:
//   1. load the layer's weights in fp32 from the (mmap'd) checkpoint — one layer in memory;
//   2. the algorithm's Transform: it may rescale the weights (AWQ smoothing), running the layer
//      over the calibration activations through a LayerRunner as often as it needs;
//   3. the fp pass: the transformed layer over all calibration rows (its activations are what
//      the algorithm's Finish sees and what fp propagation feeds the next layer);
//   4. the algorithm's Finish: it may adjust the weights again (AWQ clip) and may produce the
//      codes of any quantized linear itself (GPTQ); every other quantized linear gets Quark RTN;
//   5. per-linear output errors for the report (RTN of the original weights against the result);
//   6. the layer's tensors go to the sink (the exporter) and are freed; the next layer's input is
//      the fp pass's output, or (quantized propagation) the output of the dequantized layer.
// A 16-bit calibration of Chunkable algorithms (AlgorithmSettings: GPTQ without true_sequential,
// AWQ without clip, their chain) runs every step in chunks of whole sequences from the 16-bit layer input: AWQ's
// searches read LayerRunner::Capture's statistics, Gram matrices and 16-bit rows; the fp pass adds
// each chunk's linear inputs into one XᵀX per input (where GPTQ needs them); no linear input is
// ever held over every row in fp32 (a layer's memory grows with the calibration rows by 16-bit
// rows, the fp32 outputs AWQ's candidates are scored against and the kept attention residual).
// Results do not depend on the thread count: every reduction runs in fixed blocks.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nibble/cancel.h>

#include "base/result.h"
#include "formats/int4_matrix.h"
#include "formats/quant_spec.h"
#include "formats/quark_config.h"
#include "formats/checkpoint_format.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/decoder_layer.h"
#include "quantize/calib_dtype.h"

namespace nibble {

struct QuantizePlan;  // quantize/plan.h (which includes this header through quantize/algorithm.h)

/// Where the pipeline reads each linear's spec: a QuantizePlan (quantize resolves its request
/// once), or a Quark config resolved module by module (direct runs of one algorithm).
class LinearPlanSource {
 public:
  LinearPlanSource(const QuantizePlan& plan) : plan_(&plan) {}      // NOLINT: implicit by design
  LinearPlanSource(const QuarkQuantConfig& config) : config_(&config) {}  // NOLINT
  /// Errors: a module the plan does not hold, a config rule that does not resolve.
  Result<LinearPlan> operator()(const std::string& module) const;

 private:
  const QuantizePlan* plan_ = nullptr;
  const QuarkQuantConfig* config_ = nullptr;
};

/// A decoder projection, in DecoderLinearNames() order.
enum LinearSlot : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown, kNumLinears };

/// The capture point that feeds a projection.
enum class LayerInput { kAttnIn, kAttnConcat, kMlpIn, kMlpAct };
LayerInput InputOf(int slot);
/// How far a layer must run to produce that input.
LayerStop StopFor(LayerInput in);

/// Where the next layer's calibration input comes from.
enum class Propagation {
  kFp,         // the transformed (e.g. smoothed) layer, unquantized (llm-awq, AutoAWQ)
  kQuantized,  // the layer with its quantized weights dequantized (llm-compressor's sequential pipeline)
};

/// A decoder layer's weights in fp32, as the algorithms edit them.
struct CalibLayer {
  int64_t index = 0;
  std::string name;  // "model.layers.3"
  std::vector<float> ln1, ln2;  // input_layernorm / post_attention_layernorm [H]
  std::vector<float> q_norm, k_norm;  // Qwen3's per-head norms [head_dim] (no algorithm edits them), else empty
  DType ln1_dtype = DType::kF32, ln2_dtype = DType::kF32;
  std::array<std::shared_ptr<std::vector<float>>, kNumLinears> w;  // [N, K]
  std::array<std::vector<float>, kNumLinears> bias;                // empty or [N]
  std::array<int64_t, kNumLinears> n{}, k{};
  std::array<std::optional<QuantSpec>, kNumLinears> spec;          // nullopt: kept in float
  std::array<DType, kNumLinears> dtype{};                          // stored dtype of each weight
  CalibDType calib = CalibDType::kFp32;  // the dtype its forwards run in (resolved)

  /// A deep copy (the weight vectors are copied, not shared).
  CalibLayer Clone() const;
};

/// The calibration linears over a CalibLayer's weights in L.calib (MakeCalibLinear: fp32 shares
/// the weights, a 16-bit dtype rounds a copy), and the layer view of them.
using CalibLinears = std::array<std::unique_ptr<Linear>, kNumLinears>;
CalibLinears MakeLinears(const CalibLayer& L);
/// The view of `lin` with L's norms (the attention and MLP blocks alone do not read the norms).
DecoderLayerView ViewOf(const CalibLayer& L, const CalibLinears& lin);

/// Rows per chunk of LayerRunner::RunOutput (whole sequences, at least one).
inline constexpr int64_t kOutputChunkRows = 2048;
inline int64_t OutputChunkRows(int64_t seq_len) { return std::max<int64_t>(1, kOutputChunkRows / seq_len) * seq_len; }
/// Weight rows per bf16 matmul of the error report where it runs in bf16 (a 16-bit calibration).
inline constexpr int64_t kReportTileRows = 512;

/// Bytes per element of LayerActs' buffers: fp32 in every calibration dtype (a 16-bit one holds
/// rounded values in them). The layer input / output between layers is CarriedActivationBytes
/// (calib_dtype.h). The memory plan (quantize/resource_plan.h) sizes the buffers from these.
inline constexpr int64_t kCalibActBytes = sizeof(float);

/// A layer's activations on the calibration rows (model/decoder_layer.h capture points), fp32.
/// In a 16-bit calibration dtype the linear inputs (attn_in, attn_concat, mlp_in, mlp_act) hold
/// the values rounded to it (what the linears multiply); attn_residual and out are not rounded.
/// On the whole-rows path (fp32 calibration, --awq_clip, GPTQ's true_sequential) every buffer
/// spans all rows; a chunked layer's span one chunk.
struct LayerActs {
  std::vector<float> attn_in, attn_concat, attn_residual, mlp_in, mlp_act, out;
  const float* Of(LayerInput in) const { return Vec(in).data(); }
  /// Columns of `in` as the last run over `rows` rows sized it (0 where that run did not reach it).
  int64_t Width(LayerInput in, int64_t rows) const { return static_cast<int64_t>(Vec(in).size()) / rows; }

 private:
  const std::vector<float>& Vec(LayerInput in) const;
};

/// Each quantized linear input's Gram matrix XᵀX [K, K] fp32 over every calibration row (by
/// LayerInput; empty where no quantized linear reads it), as a 16-bit calibration's chunked fp pass
/// accumulates it (LayerAlgorithm::NeedsGrams): no capture point exists for all rows at once.
struct LayerGrams {
  int64_t rows = 0;
  std::array<std::vector<float>, 4> g;
  std::vector<float>& Of(LayerInput in) { return g[static_cast<size_t>(in)]; }
};

/// What a search needs of one layer run over every calibration row (LayerRunner::Capture): per
/// listed input, its per-channel mean |x|, its Gram matrix, or all its rows kept.
/// `keep_attention`: the caller will not change the attention, so a chunked runner keeps the
/// attention stages this run computes for the next runs of the same layer.
struct CaptureRequest {
  std::vector<LayerInput> abs_mean, gram, rows;
  bool keep_attention = false;
};

/// A chunked pass over the carried input (LayerRunner::ForEachChunk): sequences [begin, end) (end
/// -1: to the last) run to `stop`. `attention_captures`: the caller reads attn_in / attn_concat,
/// so the attention runs even where its stages are kept. `keep_attention`: a pass over every row
/// keeps the attention residual for the passes after it.
struct ChunkPass {
  LayerStop stop = LayerStop::kFull;
  int64_t begin = 0, end = -1;
  bool attention_captures = true;
  bool keep_attention = false;
};

/// LayerRunner::Capture's answer. A whole-rows runner's rows are its LayerActs; a chunked
/// runner's were stored in the calibration dtype (exact: linear inputs hold values rounded to
/// it) and are widened range by range, and its statistics were accumulated chunk by chunk.
class CapturedRows {
 public:
  /// mean |x[:, c]| over every row: double sums over fixed 1024-row blocks, added in block order
  /// (the same value for any chunking and thread count).
  const std::vector<float>& AbsMean(LayerInput in) const { return abs_mean_[Slot(in)]; }
  /// XᵀX [k, k] fp32: GramMatrix (gram.h) of whole rows; over chunks AccumulateGramLower, mirrored.
  const std::vector<float>& Gram(LayerInput in) const { return gram_[Slot(in)]; }
  /// Rows [r0, r0 + n) of `in` as fp32: a pointer into the LayerActs, or widened into *scratch.
  const float* Rows(LayerInput in, int64_t r0, int64_t n, std::vector<float>* scratch) const;

 private:
  friend class LayerRunner;
  static size_t Slot(LayerInput in) { return static_cast<size_t>(in); }
  void Clear();
  const LayerActs* whole_ = nullptr;
  std::array<int64_t, 4> width_{};
  std::array<std::unique_ptr<CarriedActivations>, 4> stored_;
  std::array<std::vector<float>, 4> abs_mean_, gram_;
};

/// Runs layers over the current layer's calibration input [batch · t, H]: fp32 rows in memory
/// (SetInput: the whole-rows path), or the carried 16-bit input read chunk by chunk (SetCarried:
/// a chunked layer, where Capture, ForEachChunk and ForEachOutput run). One LayerActs is reused by
/// every Run (fresh multi-hundred-MB buffers per call were page-faulted and zeroed each time).
/// While nothing has rescaled input_layernorm or q / k / v / o since the attention stages were
/// computed, a run that needs only the MLP stages starts from them (the same values as a full
/// run): a whole-rows runner's are its LayerActs, a chunked runner keeps the residual h over
/// every row (fp32) where a Capture asks it to.
class LayerRunner {
 public:
  LayerRunner(const ModelConfig& c, int64_t batch, int64_t t, bool reuse_attention);
  const ModelConfig& config() const { return *c_; }
  const RopeTables& rope() const { return rope_; }
  int64_t batch() const { return batch_; }
  int64_t t() const { return t_; }
  int64_t rows() const { return batch_ * t_; }
  /// The input of the layer now being processed; invalidates the attention stages.
  void SetInput(const float* x);
  /// The same for a chunked layer: `in` (outliving the runs, null: none) is widened chunk by chunk.
  void SetCarried(const CarriedActivations* in);
  /// Runs `L` up to `stop` into acts() (whole rows); `lin`: L's calibration linears
  /// (MakeLinears) when the caller keeps them.
  const LayerActs& Run(const CalibLayer& L, LayerStop stop);
  const LayerActs& Run(const CalibLayer& L, const CalibLinears& lin, LayerStop stop);
  const LayerActs& acts() const { return acts_; }
  /// Runs `L` (linears `lin`) up to `stop` over every row, whole or in chunks of whole sequences
  /// (about kOutputChunkRows rows), and keeps what `req` asks until the next Capture or
  /// ReleaseCaptured.
  const CapturedRows& Capture(const CalibLayer& L, const CalibLinears& lin, LayerStop stop, const CaptureRequest& req);
  void ReleaseCaptured() { captured_.Clear(); }
  /// The caller changed input_layernorm or a q / k / v / o weight: the attention stages are stale
  /// (a chunked runner frees the ones it kept).
  void InvalidateAttention();
  /// Per chunk of whole sequences (about kOutputChunkRows rows) of the carried input, in order:
  /// `L` (linears `lin`, the layer any kept attention stages belong to) runs as `pass` says and
  /// f(b0, nb, captures) sees the chunk's captures of sequences [b0, b0 + nb).
  using ChunkFn = std::function<Status(int64_t b0, int64_t nb, const LayerActs& a)>;
  Status ForEachChunk(const CalibLayer& L, const CalibLinears& lin, const ChunkPass& pass, const ChunkFn& f);
  /// Per chunk of whole sequences (about kOutputChunkRows rows) of the input, fp32 rows or
  /// carried, in order: f(b0, nb, out) sees L's output [nb · t, H] (nothing captured; L may be
  /// another layer than the one whose attention stages are kept, e.g. the dequantized one).
  using OutputFn = std::function<Status(int64_t b0, int64_t nb, const float* out)>;
  Status ForEachOutput(const CalibLayer& L, const OutputFn& f) const;
  /// Runs `L` fully on the first `batch` sequences into `out` (reports, quantized propagation).
  void RunFresh(const CalibLayer& L, int64_t batch, LayerActs* out) const;
  /// ForEachOutput over fp32 rows into `out` [rows, H].
  void RunOutput(const CalibLayer& L, std::vector<float>* out) const;
  /// Scratch of this run's layer forwards (model/workspace.h), at least `count`: index 0 serves
  /// Run / RunFresh, index omp_get_thread_num() a thread of a parallel region over chunks (AWQ's
  /// search). Kept across layers: a layer runs thousands of times. Resize outside a region only.
  std::vector<Workspace>& Workspaces(size_t count) const;

 private:
  // Chunk [b0, b0 + nb)'s input rows: a pointer into the fp32 input, or widened into *scratch.
  const float* ChunkInput(int64_t b0, int64_t nb, std::vector<float>* scratch) const;
  const ModelConfig* c_;
  RopeTables rope_;
  int64_t batch_, t_;
  bool reuse_;
  const float* x_ = nullptr;
  const CarriedActivations* carried_ = nullptr;
  LayerActs acts_;
  CapturedRows captured_;
  bool attn_valid_ = false;
  std::vector<float> kept_residual_;  // a chunked runner's attention residual [rows, H] while valid
  mutable std::vector<Workspace> workspaces_;
};

/// Runs L (its calibration linears `lin`) on x (`batch` sequences of `t`) up to `stop`, capturing
/// into `a` (sized here); start = kMlp resumes from a's attention stages. In a 16-bit calibration
/// the captured linear inputs are rounded to it (what the linears multiplied).
void RunCaptured(const ModelConfig& c, const RopeTables& rope, const CalibLayer& L, const CalibLinears& lin,
                 const float* x, int64_t batch, int64_t t, LayerStop stop, LayerStart start, LayerActs* a,
                 Workspace* ws);

/// Relative output error of one linear on calibration inputs, for the report.
struct LinearErrorReport {
  std::string name;
  bool quantized = false;
  double rtn_error = 0;     // ||X·Wᵀ − X·RTN(W)ᵀ||² / ||X·Wᵀ||², original weights and inputs
  double method_error = 0;  // the same for the algorithm's final weights on their own inputs
};

struct LayerReport {
  int64_t layer = 0;
  std::vector<LinearErrorReport> linears;
  double seconds = 0;
};

/// The finished codes of a layer's quantized linears (nullopt: the pipeline applies RTN).
using LayerCodes = std::array<std::optional<Int4Matrix>, kNumLinears>;

/// A per-layer calibration algorithm (AWQ, GPTQ, ...). The defaults change nothing: a layer
/// that only runs them is plain RTN. `step` reports one unit of work done and returns the
/// pipeline's verdict: non-OK (kCancelled) means stop and return it.
class LayerAlgorithm {
 public:
  virtual ~LayerAlgorithm() = default;
  /// Progress steps the algorithm reports per layer through `step` in Transform and Finish.
  virtual int64_t StepsPerLayer() const { return 0; }
  /// Before the fp pass (algorithms keep their own per-layer report sections).
  virtual Status Transform(LayerRunner& runner, CalibLayer& layer, const std::function<Status()>& step) {
    return Status::Ok();
  }
  /// After the fp pass: `runner.acts()` holds the transformed layer's activations.
  virtual Status Finish(const LayerRunner& runner, CalibLayer& layer, LayerCodes& codes,
                        const std::function<Status()>& step) {
    return Status::Ok();
  }
  /// Notes collected over the run (each once), e.g. skipped mappings.
  virtual std::vector<std::string> Messages() const { return {}; }
  /// Whether FinishGrams reads the Gram matrices (a chunked fp pass accumulates them only then).
  virtual bool NeedsGrams() const { return false; }
  /// Whether Transform may change the weights (a chunked layer then measures the report's RTN
  /// error of the original weights before it, as it keeps no original copy).
  virtual bool Transforms() const { return false; }
  /// A chunked layer's Finish (PipelineOptions::chunked: its settings are Chunkable), from the
  /// layer's Gram matrices (it may free each one once used). There Transform reads the layer runs
  /// only through LayerRunner::Capture (a chunked runner has no acts()).
  virtual Status FinishGrams(LayerGrams& grams, const CalibLayer& layer, LayerCodes& codes,
                             const std::function<Status()>& step) {
    return MakeError("this algorithm needs the calibration activations, not only their Gram matrices");
  }
};

/// Algorithms run one after the other on each layer (AWQ then GPTQ): every Transform in order
/// before the fp pass, every Finish in order after it (a later one sees the weights and codes the
/// earlier ones left), their steps added and their messages concatenated.
class AlgorithmChain final : public LayerAlgorithm {
 public:
  explicit AlgorithmChain(std::vector<std::unique_ptr<LayerAlgorithm>> algos) : algos_(std::move(algos)) {}
  int64_t StepsPerLayer() const override;
  Status Transform(LayerRunner& runner, CalibLayer& layer, const std::function<Status()>& step) override;
  Status Finish(const LayerRunner& runner, CalibLayer& layer, LayerCodes& codes,
                const std::function<Status()>& step) override;
  std::vector<std::string> Messages() const override;
  /// Grams or weight changes where any algorithm needs or makes them.
  bool NeedsGrams() const override;
  bool Transforms() const override;
  /// Each algorithm's FinishGrams in order.
  Status FinishGrams(LayerGrams& grams, const CalibLayer& layer, LayerCodes& codes,
                     const std::function<Status()>& step) override;

 private:
  std::vector<std::unique_ptr<LayerAlgorithm>> algos_;
};

/// One finished tensor of a decoder layer: HF name, fp32 values row-major in the stored shape,
/// and for a quantized linear's weight the codes the exporter writes (computed from `values`).
struct LayerTensor {
  std::string name;
  std::vector<float> values;
  std::optional<Int4Matrix> codes;
};
/// Receives every weight (and bias) of a layer, norms first then q/k/v/o/gate/up/down, as soon as
/// the layer is done; a non-OK status stops the pipeline and is returned.
using LayerTensorSink = std::function<Status(LayerTensor)>;
/// The names the sink receives for decoder layer `layer` of `mc`, in that order (an exporter
/// knows up front which tensors the pipeline will hand over; the rest it copies from the input).
std::vector<std::string> LayerTensorNames(const ModelConfig& mc, int64_t layer);

struct PipelineOptions {
  Propagation propagation = Propagation::kFp;
  bool reuse_attention = true;  // LayerRunner's reuse (false recomputes, for tests)
  std::function<void(int64_t done, int64_t total)> progress;  // (layer, step) units
  /// As each stage of a layer starts: the layer (0-based) and "load", "calibrate" (the algorithms'
  /// Transform and the fp pass), "quantize" (Finish, the codes, the error report) or "write".
  std::function<void(int64_t layer, const char* stage)> on_stage;
  /// Checked before each layer, at each algorithm step (AWQ mapping, GPTQ Hessian), before each
  /// linear's RTN and error report and each tensor handed to the sink: cancelled, the pipeline
  /// returns kCancelled ("cancelled: quantize at model.layers.3.mlp.up_proj").
  const CancellationToken* cancel = nullptr;
  /// Resuming a run (quantize --resume, quantize/resume.h): the first layer to run, its input
  /// (the previous layer's output as saved at that boundary: bytes of dtype `start_input_dtype`,
  /// [batch · seq_len, H]) and the reports of the layers before it.
  int64_t start_layer = 0;
  std::vector<uint8_t> start_input;
  std::string start_input_dtype;
  std::vector<LayerReport> start_reports;
  /// Called once each layer's tensors went to the sink, before its progress step: the layer, the
  /// reports so far and the next layer's input (bytes and dtype). Non-OK stops the pipeline.
  std::function<Status(int64_t layer, const std::vector<LayerReport>& reports, std::span<const uint8_t> next_input,
                       const std::string& dtype)>
      on_boundary;
  /// The dtype of the calibration forward (calib_dtype.h); kAuto: the model's torch_dtype.
  CalibDType calib_dtype = CalibDType::kFp32;
  /// Each layer in chunks of sequences (ChunkedLayer; AlgorithmPlan::ChunkedLayers decides): needs
  /// a 16-bit calib_dtype and an algorithm whose FinishGrams serves (its settings Chunkable).
  bool chunked = false;
};

struct PipelineResult {
  std::vector<LayerReport> layers;
  double seconds = 0;
};

/// Runs `algo` over every decoder layer of the dense checkpoint `store` (config `mc`) with
/// calibration tokens [batch, seq_len] (each row an independent sequence from position 0); each
/// projection's spec comes from `plan` (float ones stay in float).
/// Errors: seq_len > max_position_embeddings, a projection whose K is not a multiple of its group
/// size, missing / mis-shaped tensors, an algorithm's error (with the layer named), a sink error,
/// kCancelled (PipelineOptions::cancel).
Result<PipelineResult> RunLayerPipeline(const ModelConfig& mc, const TensorStore& store, const LinearPlanSource& plan,
                                        const std::vector<int32_t>& tokens, int64_t batch, int64_t seq_len,
                                        LayerAlgorithm& algo, const PipelineOptions& options,
                                        const LayerTensorSink& sink);

/// Q(W) dequantized for `spec` (Quark RTN with scales in `dt`), or an error (scale overflow,
/// non-finite weight).
Result<std::vector<float>> RtnDequant(const std::vector<float>& w, int64_t n, int64_t k, const QuantSpec& spec,
                                      DType dt);

/// Σ (a − b)² / n over fixed blocks of 4096 (double partials summed in block order).
double Mse(const float* a, const float* b, int64_t n);

}  // namespace nibble
