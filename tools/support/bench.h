// nibble benchmark and kernel-introspection API (used by `nibble bench` and `nibble inspect
// --kernels`): DRAM read bandwidth, int4 GEMV/GEMM throughput against that bandwidth, the W4A32
// kernel dispatch decision, and a synthetic random-weight checkpoint writer for end-to-end
// tokens/s. Numbers are wall-clock on the calling machine with the threads set by SetNumThreads.
#pragma once

#include <cstdint>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include <nibble/error.h>

namespace nibble {

/// The kernel dispatch decision of this process (W4A32 kernels and vectorised row ops, chosen once
/// from CPUID + XCR0 and the NIBBLE_ISA environment variable).
struct KernelDispatchReport {
  struct Candidate {
    std::string isa;     // "avx512", "avx2", "scalar"
    bool compiled = false, supported = false, chosen = false;
    std::string reason;  // why chosen / why not
  };
  std::string chosen;              // ISA name of the kernels in use
  std::string cpu_vendor;          // CPUID vendor string
  int cpu_family = 0;              // CPUID display family (Zen 4: 0x19 = 25)
  std::string cpu_name;            // the CPU's model name (/proc/cpuinfo), "" where unknown
  std::string cpu_flags;           // relevant flags present, e.g. "avx avx2 fma f16c avx512f ... os:ymm os:zmm"
  std::string override_value;      // NIBBLE_ISA ("" when unset)
  std::string override_message;    // why the override was ignored ("" when accepted or unset)
  std::vector<Candidate> candidates;  // best first
  std::string int8_kernel;         // opt-in W4A8 GEMV (--int8_activations): "avx512_vnni" | "avx2" | "scalar"
  std::string int8_reason;         // why that one
  /// opt-in bf16-activation GEMM (--bf16_activations): "avx512_bf16" | "w4a32_rounded" (no bf16
  /// kernel: the W4A32 kernels on bf16-rounded inputs); bf16_act_reason names the AMX tile kernel
  /// where it runs the batches
  std::string bf16_act_kernel;
  std::string bf16_act_reason;     // why that one
  /// Rows from which bf16 activations go through the dequantize + oneDNN bf16 matmul path at
  /// g = 128 (Int4Linear::Bf16MatmulMinRows: 96 with the AMX tile kernel, else 16 where oneDNN
  /// has AMX, else 64).
  int64_t bf16_matmul_min_rows = 0;
  /// K from which the bf16 / int8 decode loops at g = 128 take weight rows eight at a time in
  /// chunks (W4DecodeChunkMinK of l1d_bytes, the L1 data cache per core).
  int64_t bf16_decode_chunk_min_k = 0, int8_decode_chunk_min_k = 0;
  int decode_chunk_rows = 0;         // weight rows per pass there
  int64_t decode_chunk_weights = 0;  // weights of a row per chunk
  int64_t l1d_bytes = 0;
  bool bf16_matmul_amx = false;    // whether oneDNN runs that matmul on AMX tiles
  /// Whether that prefill runs the fp32 sgemm on the bf16-rounded rows instead (W4Kernels::
  /// bf16_prefill_sgemm: Intel without AMX).
  bool bf16_prefill_sgemm = false;
  /// Dense linears stored as bf16: "avx512" (kept bf16, bf16 GEMV at M = 1) or "widened to fp32
  /// at load" where the chosen ISA has no bf16 GEMV.
  std::string bf16_dense;
  /// The vectorised row ops (attention and MLP softmax / SiLU exponentials, AWQ's squared error):
  /// "avx512" | "avx2" | "scalar", the same ISA decision as the int4 kernels (every one gives the
  /// same bits).
  std::string vec_ops;
  /// The decode loops' software prefetch: "nta" | "t0" (kernels/stream_prefetch.h), why that one,
  /// and why NIBBLE_PREFETCH was ignored ("" when accepted or unset).
  std::string row_prefetch;
  std::string row_prefetch_reason;
  std::string row_prefetch_message;
};

/// Reports the dispatch decision (no errors: detection cannot fail; non-x86 gives scalar).
KernelDispatchReport DescribeKernels();

/// Result of a streaming read over a buffer.
struct BandwidthResult {
  int64_t bytes = 0;       // buffer size read per pass
  int passes = 0;          // timed passes (best one reported)
  double seconds = 0;      // best pass, wall clock
  double gb_per_s = 0;     // bytes / seconds / 1e9
};

/// DRAM read bandwidth probe that keeps its buffer, so the roofline can be measured again next to
/// each benchmark case (on a shared or throttling machine it moves by tens of percent within a
/// minute; `nibble bench` prints each case's % against the probe run right before it).
class ReadBandwidthProbe {
 public:
  /// Allocates `bytes` (>= 1 GiB recommended so caches do not help; huge pages where granted, like
  /// the packed weights) and touches it. Errors: bytes < 1 MiB or allocation failure.
  static Result<ReadBandwidthProbe> Create(int64_t bytes);
  /// Reads the whole buffer `passes` times (at least 1) with all threads (static split), widest
  /// loads the CPU has; reports the best pass.
  BandwidthResult Measure(int passes) const;

  ReadBandwidthProbe(ReadBandwidthProbe&&) noexcept;
  ReadBandwidthProbe& operator=(ReadBandwidthProbe&&) noexcept;
  ~ReadBandwidthProbe();

 private:
  struct Impl;
  explicit ReadBandwidthProbe(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// DRAM read bandwidth once: ReadBandwidthProbe::Create(bytes) then Measure(passes).
/// Errors: bytes < 1 MiB or allocation failure.
Result<BandwidthResult> MeasureReadBandwidth(int64_t bytes, int passes);

/// The bf16 dot-product peak: every thread runs the `vdpbf16ps` loop at once for >= `seconds`;
/// total and per-thread GFLOP/s (best of 3). Error: no AVX-512 BF16 kernels on this CPU.
struct PeakResult {
  int threads = 0;
  double gflop_per_s = 0, per_thread_gflop_per_s = 0;
};
Result<PeakResult> MeasureBf16DotPeak(double seconds);

/// One W4A32 GEMV/GEMM benchmark case: y[M,N] = x[M,K] · W[N,K]ᵀ with W int4 (asym, group g).
struct GemmBenchCase {
  int64_t k = 4096, n = 4096, m = 1, group_size = 128;
  bool int8_activations = false;  // time the opt-in W4A8 path (Model::SetInt8Activations) instead
  bool bf16_activations = false;  // time the opt-in bf16-activation path (Model::SetBf16Activations) instead
};

struct GemmBenchResult {
  GemmBenchCase shape;
  std::string isa;            // kernels used
  std::string path;           // "fused" (W4A32 kernel), "dequant+sgemm" (M >= Int4Linear's threshold) or
                              // "w4a8:<kernel>" (int8 activations, e.g. w4a8:avx512_vnni) or
                              // "bf16:<kernel>" (bf16 activations: bf16:avx512_bf16, bf16:amx_bf16,
                              // bf16:dequant+matmul from Int4Linear::Bf16MatmulMinRows(g) rows, or
                              // bf16:rounded+fused / bf16:rounded+dequant+sgemm for the W4A32 path
                              // on bf16-rounded inputs)
  int64_t matrices = 0;       // distinct weight matrices cycled through
  int64_t weight_bytes = 0;   // packed bytes of one matrix
  int64_t calls = 0;          // timed calls
  double seconds_per_call = 0;       // best round (a round = one cycle over all matrices for M < 16)
  double mean_seconds_per_call = 0;  // over all timed calls
  double weight_gb_per_s = 0; // weight_bytes / seconds_per_call / 1e9 (best round)
  double gflop_per_s = 0;     // 2·M·N·K / seconds_per_call / 1e9
  // Time-stamp counter ticks of the best round per call (x86 rdtsc; 0 where there is none). The
  // TSC ticks at the CPU's nominal frequency, not the core clock: a core running above (turbo)
  // or below it does more or fewer cycles per tick.
  double tsc_per_call = 0;
  double tsc_ghz = 0;            // TSC ticks per ns over all timed rounds
  int threads = 1;               // worker threads of the calls (NumThreads())
  double TscCyclesPerWeight() const {  // per weight of W and thread: ticks · threads / (N·K)
    return tsc_per_call * threads / (static_cast<double>(shape.n) * static_cast<double>(shape.k));
  }
};

/// Why an opt-in activation path cannot serve group size g, or "" when it can (or neither is
/// asked for): "--int8_activations: group_size G is not 32, 64 or a multiple of 128",
/// "--bf16_activations: group_size G is not a multiple of 32". The kernels' own rule
/// (kernels/int4_packed.h W4Int8ServesGroupSize / W4Bf16ServesGroupSize).
std::string OptInGroupSizeRefusal(bool int8_activations, bool bf16_activations, int64_t group_size);

/// Times Int4Linear::Forward (the model's code path) on `shape`, cycling over enough distinct
/// weight matrices that together hold >= `min_total_bytes` (so L3 cannot keep them), for at least
/// `min_seconds` and at least 3 rounds (a round = one cycle over all matrices when M < 16, else
/// one call); the best round is reported, plus the mean. Errors: non-positive sizes, K % g != 0,
/// int8_activations with a group size the W4A8 kernels do not serve, bf16_activations with a
/// group size that is not a multiple of 32, both switched on.
Result<GemmBenchResult> BenchW4Gemm(const GemmBenchCase& shape, int64_t min_total_bytes, double min_seconds);

}  // namespace nibble

namespace nibble {

/// `nibble synth` request: a random-weight checkpoint with the shapes of an HF config.json.
struct SynthRequest {
  std::string config_path;      // HF config.json (Llama / Mistral / Qwen2 / Qwen3, as model/config.h reads it)
  std::string out_dir;          // created; must not exist unless overwrite
  std::string format = "quark"; // "dense" (bf16 safetensors) | "quark" (dense, then Quantize() RTN uint4 asym)
  int64_t group_size = 128;     // quark only
  std::string tokenizer_dir;    // tokenizer files copied from here, whichever exist: tokenizer.model,
                                // tokenizer.json, tokenizer_config.json, special_tokens_map.json ("" = none)
  uint64_t seed = 0;
  int64_t max_shard_bytes = int64_t{2} << 30;
  bool overwrite = false;
  /// Progress of each phase: ("synth", tensors written, tensors), then for "quark" the
  /// quantizer's own ("quantize", linears done, linears).
  std::function<void(const std::string& phase, int64_t done, int64_t total)> progress;
};

/// Writes the checkpoint: config.json (torch_dtype bfloat16), the tensors the config implies
/// (biases, Qwen3's q/k norms, lm_head unless tied): bf16 weights and biases ~ U(-0.035, 0.035)
/// (std ≈ 0.02), RMSNorm weights 1, sharded with model.safetensors.index.json when larger than
/// max_shard_bytes. The output appears atomically: "dense" is written to a staging directory beside
/// it and renamed onto it; for "quark" the dense checkpoint is staged beside the output, quantized
/// by the regular pipeline (lm_head excluded, as `nibble quantize`, which commits its own output
/// the same way), then removed. A failure leaves no partial output. Decode speed does not depend on
/// the weight values. Errors: unreadable config, any config model/config.h refuses, a tokenizer
/// dir with neither tokenizer.model nor tokenizer.json, unknown format, existing output
/// without overwrite, an existing output that is a file or a non-empty directory without
/// config.json (never replaced, even with overwrite), write failures (with the file named).
Status WriteSyntheticCheckpoint(const SynthRequest& request);

}  // namespace nibble
