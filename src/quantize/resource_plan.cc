// The memory and disk plan of a quantize run (see resource_plan.h).
#include "quantize/resource_plan.h"

#include <sys/statvfs.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "base/memory.h"
#include "model/llama.h"
#include "quantize/calib_dtype.h"
#include "quantize/pipeline.h"

namespace nibble {

namespace fs = std::filesystem;

namespace {

// "23.1 GB" (decimal, as the summary's sizes).
std::string Gb(int64_t bytes) {
  char buf[32];
  if (bytes >= 1000000000) std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(bytes) / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

// Scale groups per row of a quantized linear (0 when kept in float).
int64_t GroupsOf(const PlannedLinear& l) {
  return l.spec ? l.k / l.spec->EffectiveGroupSize(l.k) : 0;
}

// Stored bytes of a quantized linear: packed codes, scales in their dtype, packed zero points
// (asymmetric schemes, or every scheme of formats with qzeros) and a g_idx under act-order.
int64_t PackedBytes(const PlannedLinear& l, DType weight_dtype, bool sym_zeros) {
  const int64_t groups = GroupsOf(l);
  const int64_t scale = static_cast<int64_t>(DTypeSize(l.spec->scale_dtype.value_or(weight_dtype)));
  int64_t b = l.n * l.k / 2 + l.n * groups * scale;
  if (!l.spec->symmetric || sym_zeros) b += (l.n * groups + 1) / 2;
  if (l.spec->act_order) b += l.k * 4;
  return b;
}

// RTN of the linears `ls` as the export runs it (OrderedExport::Drain, quantize/rtn_fast.h): each
// of `threads` workers quantizes a tensor row by row from the mapping into its codes (a byte a
// weight, fp32 scales and zero points), and the packed tensors of up to 2 x threads claims ahead
// of the writer and the one it appends wait: at most the codes of the `threads` largest linears
// and the packed tensors of the 2 x threads + 1 largest. A weight with inf / nan falls back to an
// fp32 copy that this plan does not count.
MemoryPhase RtnPhase(std::vector<const PlannedLinear*> ls, int threads) {
  const size_t t = static_cast<size_t>(std::max(1, threads));
  auto codes = [](const PlannedLinear* l) { return l->n * l->k + l->n * GroupsOf(*l) * 5; };
  auto packed = [](const PlannedLinear* l) { return l->n * l->k / 2 + l->n * GroupsOf(*l) * 3; };
  std::stable_sort(ls.begin(), ls.end(), [&](const PlannedLinear* a, const PlannedLinear* b) { return codes(a) > codes(b); });
  int64_t c = 0, p = 0;
  for (size_t i = 0; i < ls.size() && i < 2 * t + 1; ++i) {
    if (i < t) c += codes(ls[i]);
    p += packed(ls[i]);
  }
  const std::string& largest = ls.front()->module;
  return {"RTN of " + largest,
          {{"codes of the " + std::to_string(std::min(t, ls.size())) + " largest linears (" + largest + " " +
                Dims(ls.front()->n, ls.front()->k) + ")",
            c},
           {"packed tensors of the " + std::to_string(std::min(2 * t + 1, ls.size())) + " largest waiting for the writer", p}}};
}

// Decoder layer `layer` as the calibrated pipeline holds it.
LayerMemoryShape LayerShape(const QuantizePlan& plan, const ModelConfig& mc, int64_t layer, const ResourceInputs& in) {
  LayerMemoryShape s;
  s.name = "model.layers." + std::to_string(layer);
  s.batch = in.calib_batch;
  s.seq_len = in.calib_seq_len;
  s.rows = s.batch * s.seq_len;
  s.hidden = mc.hidden_size;
  s.q_dim = mc.num_attention_heads * mc.head_dim;
  s.kv_dim = mc.num_key_value_heads * mc.head_dim;
  s.intermediate = mc.intermediate_size;
  s.act_bytes = kCalibActBytes;
  s.threads = std::max(1, in.threads);
  s.chunked = plan.algorithms.ChunkedLayers(mc);
  s.grams = plan.algorithms.NeedsGrams();
  s.chunk_rows = std::min(s.rows, OutputChunkRows(s.seq_len));
  int64_t w = 0;
  for (int i = 0; i < kNumLinears; ++i) {
    s.linear[i] = s.name + "." + DecoderLinearNames()[i];
    const PlannedLinear* l = plan.Find(s.linear[i]);
    if (l == nullptr) continue;
    s.n[i] = l->n;
    s.k[i] = l->k;
    s.quantized[i] = l->spec.has_value();
    s.groups[i] = GroupsOf(*l);
    w += s.WeightBytes(i);
  }
  const CalibDType calib = ResolveCalibDType(plan.algorithms.calib_dtype, mc);
  s.bf16 = calib == CalibDType::kBf16;
  // bf16 calibration linears without a (faster) bf16 matmul widen per call, on every thread.
  int64_t widened = 0;
  for (int i = 0; i < kNumLinears && calib == CalibDType::kBf16; ++i)
    if (s.n[i] > 0) widened = std::max(widened, CalibLinearWidenedBytes(s.n[i], s.k[i]));
  const MemoryTerm widened_term{"bf16 GEMMs widened to fp32 (rows and a weight tile per thread)", widened * s.threads};
  if (s.chunked) {  // pipeline.cc ChunkedLayer: no original copy (RTN's report sums come first), no full-rows activations
    const int64_t carried = s.rows * s.hidden * CarriedActivationBytes(calib);
    s.base = {{"fp32 weights of " + s.name, w},
              {"layer input and the next layer's input (16-bit)", 2 * carried},
              {"the fp pass's first chunk of captures, kept for the error report", s.chunk_rows * s.ActsRowBytes()},
              {"calibration text", in.dataset_bytes}};
    if (widened > 0) s.base.push_back(widened_term);
    return s;
  }
  s.base = {{"fp32 weights of " + s.name, w},
            {"their original copy (error report)", w},
            {"calibration activations " + std::to_string(s.rows) + " rows x (4 x " + std::to_string(s.hidden) + " + " +
                 std::to_string(s.q_dim) + " + " + std::to_string(s.intermediate) + ") x " + std::to_string(s.act_bytes) +
                 " B",
             s.rows * s.ActsRowBytes()},
            {"layer input and output", 2 * s.rows * s.hidden * s.act_bytes},
            {"forward scratch", s.rows * s.ScratchRowBytes()},
            {"calibration text", in.dataset_bytes}};
  // A 16-bit calibration's linears hold the layer's weights rounded to it (MakeCalibLinear).
  if (calib != CalibDType::kFp32) s.base.push_back({"16-bit copy of its weights (calibration linears)", w / 2});
  if (widened > 0) s.base.push_back(widened_term);
  return s;
}

// A chunked layer's fp pass (pipeline.cc ChunkedFpPass): the 16-bit calibration linears, the Gram
// matrix of each input a quantized linear reads (where an algorithm needs them), one chunk's
// input, captures and scratch, and the attention residual an algorithm's Transform kept (`kept`),
// which the pass frees first where the attention's inputs go into Gram matrices.
MemoryPhase ChunkedFpPhase(const LayerMemoryShape& s, bool kept) {
  int64_t w = 0, widest_input = 0;
  std::array<int64_t, 4> gram{};
  for (int i = 0; i < kNumLinears; ++i) {
    w += s.WeightBytes(i);
    if (s.quantized[i] && s.grams) gram[static_cast<size_t>(InputOf(i))] = s.k[i] * s.k[i] * 4;
    if (s.quantized[i] && s.grams) widest_input = std::max(widest_input, s.k[i]);
  }
  int64_t grams = 0;
  for (int64_t g : gram) grams += g;
  // The chunk's captures, scratch and output, and one input transposed to bf16 for its XᵀX
  // (gram.h AccumulateGramLower, where the bf16 matmul runs it).
  const int64_t chunk =
      s.chunk_rows * (s.ActsRowBytes() + s.ScratchRowBytes() + s.hidden * 4) + s.chunk_rows * widest_input * 2;
  MemoryPhase p{"fp pass in chunks (" + s.name + ")",
                {{"16-bit copy of its weights (calibration linears)", w / 2},
                 {"Gram matrices of the quantized linears' inputs", grams},
                 {"one chunk of " + std::to_string(s.chunk_rows) + " rows: input, captures, forward scratch", chunk}}};
  if (kept && gram[static_cast<size_t>(LayerInput::kAttnIn)] == 0 && gram[static_cast<size_t>(LayerInput::kAttnConcat)] == 0)
    p.terms.push_back({"kept attention residual " + Dims(s.rows, s.hidden) + " fp32", s.rows * s.hidden * 4});
  return p;
}

// The pipeline's own phase after the algorithms' Finish: the dequantized copy and every code of
// the layer, then either the quantized propagation's full run or (later, not at once) the error
// report: the original layer's activations on its rows and one linear's RTN and GEMM outputs.
MemoryPhase FinishPhase(const LayerMemoryShape& s, bool quantized_propagation, bool chunked_propagation) {
  // ErrorReport's rows (pipeline.cc ReportRows): an eighth of the rows within [2048, 8192].
  const int64_t report_rows = std::min(s.rows, std::min<int64_t>(8192, std::max<int64_t>(2048, s.rows / 8)));
  int64_t w = 0, codes = 0, widest = 0;
  for (int i = 0; i < kNumLinears; ++i) {
    w += s.WeightBytes(i);
    codes += s.CodesBytes(i);
    widest = std::max(widest, s.WeightBytes(i) + s.CodesBytes(i) + report_rows * s.n[i] * 12);
  }
  MemoryPhase p{"quantize and report (" + s.name + ")",
                {{"dequantized copy of " + s.name, w}, {"codes of " + s.name, codes}}};
  if (s.chunked) {  // ChunkedOutput / ChunkedErrorReport: 16-bit linears and one chunk at a time
    const int64_t rows = std::min(report_rows, s.chunk_rows);
    int64_t widest_chunk = 0;
    for (int i = 0; i < kNumLinears; ++i)
      if (s.quantized[i]) {
        // fp32 outputs [rows, n] twice, or (pipeline.cc Bf16OutputErrorSums) the rows and a
        // weight tile (kReportTileRows) in bf16 and that tile's outputs.
        const int64_t tile = std::min(kReportTileRows, s.n[i]);
        const int64_t outs = std::max(rows * s.n[i] * 8, (rows + tile) * s.k[i] * 2 + rows * tile * 4);
        widest_chunk = std::max(widest_chunk, s.WeightBytes(i) + s.CodesBytes(i) + outs);
      }
    const int64_t report = rows * (s.ActsRowBytes() + s.ScratchRowBytes() + s.hidden * 4) + widest_chunk;
    // LayerRunner::ForEachOutput: the chunk's widened input, scratch and output.
    const int64_t propagate = quantized_propagation ? s.chunk_rows * (s.ScratchRowBytes() + s.hidden * 8) : 0;
    p.terms.push_back({"16-bit copy of its weights (calibration linears)", w / 2});
    if (propagate > report) p.terms.push_back({"quantized layer's output, one chunk", propagate});
    else p.terms.push_back({"error report: one chunk's activations, one linear's RTN and outputs", report});
    return p;
  }
  const int64_t report = report_rows * s.ActsRowBytes() + widest;
  // A 16-bit calibration propagates in chunks of sequences (LayerRunner::RunOutput), fp32 in one pass.
  const int64_t prop_rows = chunked_propagation ? std::min(s.rows, OutputChunkRows(s.seq_len)) : s.rows;
  const int64_t propagate = quantized_propagation ? prop_rows * s.ActsRowBytes() : 0;
  if (propagate > report) p.terms.push_back({"quantized layer's activations", propagate});
  else p.terms.push_back({"error report: original layer's activations and one linear's outputs", report});
  return p;
}

// Every decoder layer's phases (the base terms added to each), the largest kept.
MemoryPhase LargestLayerPhase(const QuantizePlan& plan, const ModelConfig& mc, const ResourceInputs& in) {
  MemoryPhase best;
  int64_t best_total = -1;
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    const LayerMemoryShape s = LayerShape(plan, mc, l, in);
    std::vector<MemoryPhase> phases;
    bool kept_attention = false;
    for (const PlannedAlgorithm& a : plan.algorithms.chain) {
      if (!a.settings) continue;
      std::vector<MemoryPhase> own = a.settings->MemoryPhases(s);
      phases.insert(phases.end(), own.begin(), own.end());
      kept_attention = kept_attention || a.settings->KeepsAttention(s);
    }
    if (s.chunked) phases.push_back(ChunkedFpPhase(s, kept_attention));
    phases.push_back(FinishPhase(s, plan.algorithms.propagation() == Propagation::kQuantized,
                                 ResolveCalibDType(plan.algorithms.calib_dtype, mc) != CalibDType::kFp32));
    for (MemoryPhase& p : phases) {
      p.terms.insert(p.terms.begin(), s.base.begin(), s.base.end());
      if (p.Total() > best_total) {
        best_total = p.Total();
        best = std::move(p);
      }
    }
  }
  return best;
}

// Free bytes at the nearest existing ancestor of `dir` (statvfs), -1 unknown; *where gets it.
// Free bytes at the nearest existing ancestor of `dir`'s parent (where the staging directory goes),
// and why nothing can be written there: a read-only filesystem, no write permission, or a
// filesystem without blocks (/proc, /sys), where statvfs's 0 free bytes would read as a full disk.
int64_t FreeDiskAt(const std::string& dir, std::string* where, std::string* unwritable) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec).parent_path();
  while (!p.empty() && !fs::exists(p, ec) && p != p.root_path()) p = p.parent_path();
  *where = p.string();
  struct statvfs st {};
  if (p.empty() || statvfs(p.c_str(), &st) != 0) return -1;
  if (st.f_flag & ST_RDONLY)
    *unwritable = "a read-only filesystem";
  else if (st.f_blocks == 0)
    *unwritable = "not on a disk filesystem (it has no blocks)";
  else if (access(p.c_str(), W_OK) != 0)
    *unwritable = std::string("not writable (") + std::strerror(errno) + ")";
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

}  // namespace

ResourcePlan PlanResources(const QuantizePlan& plan, const ModelConfig& mc, const TensorStore& store,
                           const ResourceInputs& in) {
  std::vector<MemoryPhase> phases;
  // The output: every input tensor as written (a quantized linear packed), the side files.
  int64_t out = in.side_file_bytes, largest_layer_out = 0;
  std::map<std::string, int64_t> layer_out;
  for (const std::string& name : store.Names()) {
    const TensorView* t = store.Find(name);
    const std::string module = name.size() > 7 && name.ends_with(".weight") ? name.substr(0, name.size() - 7) : "";
    const PlannedLinear* l = module.empty() ? nullptr : plan.Find(module);
    int64_t b = static_cast<int64_t>(t->nbytes);
    if (plan.head_from_embedding && name.starts_with("lm_head.")) b = 0;  // replaced by the quantized head
    if (l != nullptr && l->written && l->spec) b = PackedBytes(*l, t->dtype, in.stores_symmetric_zeros);
    out += b;
    if (const std::string layer = LayerPrefix(name); !layer.empty()) layer_out[layer] += b;
  }
  for (const auto& [layer, b] : layer_out) largest_layer_out = std::max(largest_layer_out, b);
  std::vector<const PlannedLinear*> rtn;
  for (const PlannedLinear& l : plan.linears) {
    if (!l.written || !l.spec) continue;
    if (l.module == "lm_head" && plan.head_from_embedding)
      out += PackedBytes(l, store.Find(l.weight)->dtype, in.stores_symmetric_zeros);
    // RTN runs every quantized linear outside the pipeline; a calibrated chain only the head.
    if (!plan.algorithms.Calibrated() || l.module == "lm_head") rtn.push_back(&l);
  }
  if (!rtn.empty()) phases.push_back(RtnPhase(rtn, in.threads));
  if (plan.algorithms.Calibrated()) {
    phases.push_back({"tokenizing the calibration text",
                      {{"calibration text and its tokenization", in.dataset_bytes * (1 + kTokenizeBytesPerTextByte)}}});
    phases.push_back(LargestLayerPhase(plan, mc, in));
  }
  ResourcePlan p;
  const MemoryPhase* peak = nullptr;
  for (const MemoryPhase& ph : phases)
    if (peak == nullptr || ph.Total() > peak->Total()) peak = &ph;
  if (peak != nullptr) {
    p.peak_phase = peak->name;
    p.terms = peak->terms;
  }
  p.terms.push_back({"process before the run", in.baseline_anon});
  const bool calibrated = plan.algorithms.Calibrated();
  p.terms.push_back({calibrated ? "runtime (GEMM buffers, tokenizer heap)" : "runtime (threads, allocator)",
                     calibrated ? kCalibratedRuntimeBytes : kRtnRuntimeBytes});
  if (peak != nullptr)
    p.terms.push_back({"allocator slack", static_cast<int64_t>(kAllocatorSlack * static_cast<double>(peak->Total()))});
  p.terms.erase(std::remove_if(p.terms.begin(), p.terms.end(), [](const MemoryTerm& t) { return t.bytes <= 0; }),
                p.terms.end());
  std::stable_sort(p.terms.begin(), p.terms.end(), [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes > b.bytes; });
  for (const MemoryTerm& t : p.terms) p.peak_bytes += t.bytes;
  p.output_bytes = out;
  // The spool holds the shard being filled (its owned tensors) and the tensors of a layer that
  // finished before their turn in the output order; a resumable calibrated run's next layer input
  // (resume.h activations-<layer>.bin), twice while the new one is written beside the last.
  const int64_t activations =
      calibrated && in.resumable
          ? 2 * in.calib_batch * in.calib_seq_len * mc.hidden_size *
                CarriedActivationBytes(ResolveCalibDType(plan.algorithms.calib_dtype, mc))
          : 0;
  p.disk_bytes =
      std::max<int64_t>(0, out + std::min(out, in.max_shard_size) + largest_layer_out + activations - in.staged_bytes);
  p.free_disk_bytes = FreeDiskAt(in.output_dir, &p.disk_dir, &p.disk_unwritable);
  return p;
}

std::string ResourcePlanLine(const ResourcePlan& p) {
  std::string terms;
  for (size_t i = 0; i < p.terms.size() && i < 3; ++i) terms += (i ? ", " : "") + p.terms[i].what + " " + Gb(p.terms[i].bytes);
  std::string line = "plan: expected peak " + Gb(p.peak_bytes) + " anonymous memory at " + p.peak_phase + " (" + terms +
                     "); output " + Gb(p.output_bytes) + ", disk up to " + Gb(p.disk_bytes);
  if (p.free_disk_bytes >= 0) line += " of " + Gb(p.free_disk_bytes) + " free at " + p.disk_dir;
  return line;
}

nlohmann::ordered_json ResourcePlanJson(const ResourcePlan& p) {
  nlohmann::ordered_json terms = nlohmann::ordered_json::array();
  for (const MemoryTerm& t : p.terms) terms.push_back({{"what", t.what}, {"bytes", t.bytes}});
  return {{"peak_anon_bytes", p.peak_bytes}, {"peak_phase", p.peak_phase}, {"terms", terms},
          {"output_bytes", p.output_bytes}, {"disk_bytes", p.disk_bytes}, {"free_disk_bytes", p.free_disk_bytes},
          {"disk_dir", p.disk_dir}};
}

Status CheckResources(const ResourcePlan& p, int64_t max_memory) {
  const bool fallback = max_memory == 0;
  const int64_t limit = fallback ? DefaultMemoryLimit() : max_memory;
  if (limit > 0 && p.peak_bytes > limit) {
    std::string terms;
    for (size_t i = 0; i < p.terms.size() && i < 3; ++i)
      terms += (i ? "; " : "") + p.terms[i].what + " " + Gb(p.terms[i].bytes);
    return MakeErrorCode(ErrorCode::kResourceExhausted, "expected peak ", Gb(p.peak_bytes), " > ",
                         fallback ? "the default --max_memory (90 % of MemAvailable) " : "--max_memory ", Gb(limit),
                         " at ", p.peak_phase, ": largest terms: ", terms,
                         "; raise --max_memory, use fewer calibration tokens (--num_calib_data, --seq_len) or another "
                         "--quant_algo");
  }
  if (!p.disk_unwritable.empty())
    return MakeErrorCode(ErrorCode::kIo, "cannot write the output under ", p.disk_dir, ": ", p.disk_unwritable);
  if (p.free_disk_bytes >= 0 && p.disk_bytes > p.free_disk_bytes)
    return MakeErrorCode(ErrorCode::kResourceExhausted, "the output needs up to ", Gb(p.disk_bytes), " of disk while it is ",
                         "written (", Gb(p.output_bytes), " of files and the spool of unwritten tensors), more than the ",
                         Gb(p.free_disk_bytes), " free at ", p.disk_dir);
  return Status::Ok();
}

}  // namespace nibble
