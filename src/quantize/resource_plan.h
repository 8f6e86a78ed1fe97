// What a quantize run will need, computed from the resolved QuantizePlan and the model config
// before the first layer is read: the expected peak of anonymous memory (the largest phase of the
// run: RTN of one linear, or a decoder layer of the calibrated pipeline with the algorithms'
// buffers, quantize/memory_model.h), the output's size and the disk it needs while staged, and
// the free disk where it is staged. `nibble quantize` prints it as its `plan:` line and refuses a
// run above --max_memory or the free disk (CheckResources) before any layer is read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quantize/memory_model.h"
#include "quantize/plan.h"

namespace nibble {

/// Anonymous memory no term counts, measured (docs/PERFORMANCE.md "Memory plan"): the runtime of
/// an RTN export (threads, allocator), and that of a calibrated run (oneDNN's GEMM buffers, the
/// heap the tokenizer leaves), plus a share of the largest phase for the allocator's slack.
inline constexpr int64_t kRtnRuntimeBytes = int64_t{2} << 20;
inline constexpr int64_t kCalibratedRuntimeBytes = int64_t{48} << 20;
inline constexpr double kAllocatorSlack = 0.10;

/// Bytes of transient memory per byte of calibration text while it is tokenized (measured for the
/// SentencePiece and byte-level BPE tokenizers: docs/PERFORMANCE.md "Memory plan").
inline constexpr int64_t kTokenizeBytesPerTextByte = 100;

/// What the plan needs besides the QuantizePlan and the model.
struct ResourceInputs {
  int64_t calib_batch = 0, calib_seq_len = 0;  // a calibrated chain: chunks and tokens each, as asked
  int64_t dataset_bytes = 0;                   // the calibration file's size
  int threads = 1;
  std::string output_dir;
  int64_t max_shard_size = 5000000000;
  /// The format stores zero points of symmetric schemes too (AutoGPTQ's / AutoAWQ's qzeros).
  bool stores_symmetric_zeros = false;
  int64_t side_file_bytes = 0;  // files copied from the input (tokenizer, ...)
  int64_t baseline_anon = 0;    // RssAnon when the plan is made (what the process already holds)
  int64_t staged_bytes = 0;     // --resume: the files the stopped run left in its staging directory
  bool resumable = false;       // a calibrated run then stages its activations at each layer boundary
};

struct ResourcePlan {
  int64_t peak_bytes = 0;      // expected peak RssAnon: the baseline, the runtime and the largest phase
  std::string peak_phase;      // that phase: "GPTQ of model.layers.0.mlp.down_proj"
  std::vector<MemoryTerm> terms;  // its terms, largest first (baseline and runtime included)
  int64_t output_bytes = 0;    // the output's files
  int64_t disk_bytes = 0;      // the staging directory at its largest (output and spool), less what
                               // a resumed run finds staged
  int64_t free_disk_bytes = -1;  // at the output's parent (statvfs), -1 unknown
  std::string disk_dir;        // where that was measured
  std::string disk_unwritable;  // why the output cannot be written there ("" when it can)
};

/// The plan for `plan` on the dense checkpoint (mc, store). Reads only the tensors' headers and
/// the free disk.
ResourcePlan PlanResources(const QuantizePlan& plan, const ModelConfig& mc, const TensorStore& store,
                           const ResourceInputs& in);

/// "plan: expected peak 3.2 GB anonymous (GPTQ of model.layers.0.mlp.down_proj: ...), output
/// 4.1 GB, disk 5.2 GB of 40.3 GB free at /out/parent".
std::string ResourcePlanLine(const ResourcePlan& p);
nlohmann::ordered_json ResourcePlanJson(const ResourcePlan& p);

/// Refuses (kResourceExhausted) a plan whose peak exceeds `max_memory` (bytes; 0 = 90 % of
/// MemAvailable, as --max_memory defaults everywhere; < 0 = no limit), naming the peak, the
/// limit and the largest terms, or whose staging needs more disk than is free.
Status CheckResources(const ResourcePlan& p, int64_t max_memory);

}  // namespace nibble
