// The layer runner of the sequential pipeline and its captures (see pipeline.h).
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "quantize/gram.h"
#include "quantize/pipeline.h"

namespace nibble {

namespace {

constexpr int64_t kAbsMeanBlockRows = 1024;  // CapturedRows::AbsMean's fixed reduction blocks
constexpr int64_t kAbsMeanCols = 256;        // columns per parallel task

// Per-channel Σ |x| of rows [r0, r0 + n) added into the partial sums part [blocks, cols] of the
// fixed 1024-row blocks; each (block, column) adds its rows in row order on one thread, so any
// split of the rows into calls gives the same sums.
void AddAbsSums(const float* x, int64_t r0, int64_t n, int64_t cols, double* part) {
  const int64_t b0 = r0 / kAbsMeanBlockRows, b1 = (r0 + n - 1) / kAbsMeanBlockRows + 1;
  const int64_t tiles = (cols + kAbsMeanCols - 1) / kAbsMeanCols;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t bl = b0; bl < b1; ++bl)
    for (int64_t ct = 0; ct < tiles; ++ct) {
      const int64_t c0 = ct * kAbsMeanCols, c1 = std::min(cols, c0 + kAbsMeanCols);
      const int64_t e = std::min(r0 + n, (bl + 1) * kAbsMeanBlockRows);
      double* p = part + bl * cols;
      for (int64_t r = std::max(r0, bl * kAbsMeanBlockRows); r < e; ++r)
        for (int64_t c = c0; c < c1; ++c) p[c] += std::fabs(x[(r - r0) * cols + c]);
    }
}

// Elements of AddAbsSums' partial sums for `rows` rows of `cols` columns.
size_t AbsSumsSize(int64_t rows, int64_t cols) {
  return static_cast<size_t>((rows + kAbsMeanBlockRows - 1) / kAbsMeanBlockRows * cols);
}

// The mean from AddAbsSums' partials: blocks added in order, divided by the rows, fp32.
std::vector<float> AbsMeanOf(const std::vector<double>& part, int64_t rows, int64_t cols) {
  const int64_t blocks = static_cast<int64_t>(part.size()) / cols;
  std::vector<float> m(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0;
    for (int64_t bl = 0; bl < blocks; ++bl) s += part[bl * cols + c];
    m[c] = static_cast<float>(s / static_cast<double>(rows));
  }
  return m;
}

size_t Idx(LayerInput in) { return static_cast<size_t>(in); }

}  // namespace

void RunCaptured(const ModelConfig& c, const RopeTables& rope, const CalibLayer& L, const CalibLinears& lin,
                 const float* x, int64_t batch, int64_t t, LayerStop stop, LayerStart start, LayerActs* a,
                 Workspace* ws) {
  const int64_t rows = batch * t, h = c.hidden_size;
  LayerRun run;
  run.workspace = ws;
  run.batch = batch;
  run.t = t;
  run.stop = stop;
  run.start = start;
  a->attn_in.resize(rows * h);
  run.capture.attn_in = a->attn_in.data();
  if (stop >= LayerStop::kAttnResidual) {
    a->attn_concat.resize(rows * c.num_attention_heads * c.head_dim);
    a->attn_residual.resize(rows * h);
    run.capture.attn_concat = a->attn_concat.data();
    run.capture.attn_residual = a->attn_residual.data();
  }
  if (stop >= LayerStop::kMlpIn) {
    a->mlp_in.resize(rows * h);
    run.capture.mlp_in = a->mlp_in.data();
  }
  if (stop == LayerStop::kFull) {
    a->mlp_act.resize(rows * c.intermediate_size);
    a->out.resize(rows * h);
    run.capture.mlp_act = a->mlp_act.data();
  }
  DecoderLayerForward(c, ViewOf(L, lin), rope, x, run, stop == LayerStop::kFull ? a->out.data() : nullptr);
  if (L.calib == CalibDType::kFp32) return;
  // The captured linear inputs as the linears saw them (rounded to the calibration dtype).
  if (start == LayerStart::kInput) RoundActivations(a->attn_in.data(), rows * h, L.calib);
  if (start == LayerStart::kInput && stop >= LayerStop::kAttnResidual)
    RoundActivations(a->attn_concat.data(), static_cast<int64_t>(a->attn_concat.size()), L.calib);
  if (stop >= LayerStop::kMlpIn) RoundActivations(a->mlp_in.data(), rows * h, L.calib);
  if (stop == LayerStop::kFull) RoundActivations(a->mlp_act.data(), static_cast<int64_t>(a->mlp_act.size()), L.calib);
}


LayerRunner::LayerRunner(const ModelConfig& c, int64_t batch, int64_t t, bool reuse_attention)
    : c_(&c), rope_(BuildRopeTables(c, t)), batch_(batch), t_(t), reuse_(reuse_attention) {}

void LayerRunner::SetInput(const float* x) {
  x_ = x;
  carried_ = nullptr;
  InvalidateAttention();
}

void LayerRunner::SetCarried(const CarriedActivations* in) {
  x_ = nullptr;
  carried_ = in;
  InvalidateAttention();
}

void LayerRunner::InvalidateAttention() {
  attn_valid_ = false;
  std::vector<float>().swap(kept_residual_);
}

const LayerActs& LayerRunner::Run(const CalibLayer& L, LayerStop stop) { return Run(L, MakeLinears(L), stop); }

const LayerActs& LayerRunner::Run(const CalibLayer& L, const CalibLinears& lin, LayerStop stop) {
  const bool resume = attn_valid_ && stop >= LayerStop::kMlpIn;
  RunCaptured(*c_, rope_, L, lin, x_, batch_, t_, stop, resume ? LayerStart::kMlp : LayerStart::kInput, &acts_,
              &Workspaces(1)[0]);
  if (stop >= LayerStop::kAttnResidual) attn_valid_ = reuse_;
  return acts_;
}

void LayerRunner::RunFresh(const CalibLayer& L, int64_t batch, LayerActs* out) const {
  RunCaptured(*c_, rope_, L, MakeLinears(L), x_, batch, t_, LayerStop::kFull, LayerStart::kInput, out,
              &Workspaces(1)[0]);
}

const float* LayerRunner::ChunkInput(int64_t b0, int64_t nb, std::vector<float>* scratch) const {
  const int64_t h = c_->hidden_size, off = b0 * t_ * h, n = nb * t_ * h;
  if (carried_ == nullptr) return x_ + off;
  scratch->resize(static_cast<size_t>(n));
  carried_->Widen(off, n, scratch->data());
  return scratch->data();
}

Status LayerRunner::ForEachOutput(const CalibLayer& L, const OutputFn& f) const {
  const int64_t seqs = OutputChunkRows(t_) / t_;
  const CalibLinears lin = MakeLinears(L);
  std::vector<float> x, out;
  for (int64_t b0 = 0; b0 < batch_; b0 += seqs) {
    LayerRun run;
    run.workspace = &Workspaces(1)[0];
    run.batch = std::min(seqs, batch_ - b0);
    run.t = t_;
    out.resize(static_cast<size_t>(run.rows() * c_->hidden_size));
    DecoderLayerForward(*c_, ViewOf(L, lin), rope_, ChunkInput(b0, run.batch, &x), run, out.data());
    NIBBLE_RETURN_IF_ERROR(f(b0, run.batch, out.data()));
  }
  return Status::Ok();
}

void LayerRunner::RunOutput(const CalibLayer& L, std::vector<float>* out) const {
  const int64_t h = c_->hidden_size;
  out->resize(static_cast<size_t>(rows() * h));
  NIBBLE_CHECK(ForEachOutput(L, [&](int64_t b0, int64_t nb, const float* y) -> Status {
                 std::copy(y, y + nb * t_ * h, out->data() + b0 * t_ * h);
                 return Status::Ok();
               }).ok());
}

// A chunk starts from the kept residual when the attention stages are valid and the caller reads
// none of their captures; a pass over every row that computes the attention keeps it if asked.
Status LayerRunner::ForEachChunk(const CalibLayer& L, const CalibLinears& lin, const ChunkPass& pass,
                                 const ChunkFn& f) {
  NIBBLE_CHECK(carried_ != nullptr);
  const int64_t h = c_->hidden_size, seqs = OutputChunkRows(t_) / t_, end = pass.end < 0 ? batch_ : pass.end;
  const bool from_kept = attn_valid_ && pass.stop >= LayerStop::kMlpIn && !pass.attention_captures;
  const bool keep = pass.keep_attention && reuse_ && !from_kept && pass.stop >= LayerStop::kAttnResidual &&
                    pass.begin == 0 && end == batch_;
  if (keep) kept_residual_.resize(static_cast<size_t>(rows() * h));
  LayerActs a;
  std::vector<float> x;
  for (int64_t b0 = pass.begin; b0 < end; b0 += seqs) {
    const int64_t nb = std::min(seqs, end - b0), off = b0 * t_ * h, n = nb * t_ * h;
    if (from_kept) a.attn_residual.assign(kept_residual_.begin() + off, kept_residual_.begin() + off + n);
    RunCaptured(*c_, rope_, L, lin, from_kept ? nullptr : ChunkInput(b0, nb, &x), nb, t_, pass.stop,
                from_kept ? LayerStart::kMlp : LayerStart::kInput, &a, &Workspaces(1)[0]);
    if (keep) std::copy(a.attn_residual.begin(), a.attn_residual.begin() + n, kept_residual_.begin() + off);
    NIBBLE_RETURN_IF_ERROR(f(b0, nb, a));
  }
  if (keep) attn_valid_ = true;
  return Status::Ok();
}

std::vector<Workspace>& LayerRunner::Workspaces(size_t count) const {
  if (workspaces_.size() < count) workspaces_.resize(count);
  return workspaces_;
}

void CapturedRows::Clear() {
  whole_ = nullptr;
  for (auto& s : stored_) s.reset();
  for (auto& v : abs_mean_) std::vector<float>().swap(v);
  for (auto& v : gram_) std::vector<float>().swap(v);
}

const float* CapturedRows::Rows(LayerInput in, int64_t r0, int64_t n, std::vector<float>* scratch) const {
  const int64_t w = width_[Slot(in)];
  if (whole_ != nullptr) return whole_->Of(in) + r0 * w;
  scratch->resize(static_cast<size_t>(n * w));
  stored_[Slot(in)]->Widen(r0 * w, n * w, scratch->data());
  return scratch->data();
}

const CapturedRows& LayerRunner::Capture(const CalibLayer& L, const CalibLinears& lin, LayerStop stop,
                                         const CaptureRequest& req) {
  captured_.Clear();
  if (carried_ == nullptr) {
    const LayerActs& a = Run(L, lin, stop);
    captured_.whole_ = &a;
    for (LayerInput in : req.abs_mean) {
      const int64_t w = a.Width(in, rows());
      std::vector<double> part(AbsSumsSize(rows(), w), 0.0);
      AddAbsSums(a.Of(in), 0, rows(), w, part.data());
      captured_.abs_mean_[Idx(in)] = AbsMeanOf(part, rows(), w);
    }
    for (LayerInput in : req.gram) captured_.gram_[Idx(in)] = GramMatrix(a.Of(in), rows(), a.Width(in, rows()));
    for (LayerInput in : {LayerInput::kAttnIn, LayerInput::kAttnConcat, LayerInput::kMlpIn, LayerInput::kMlpAct})
      captured_.width_[Idx(in)] = a.Width(in, rows());
    return captured_;
  }
  // Chunked: mean |x| and XᵀX accumulate chunk by chunk, requested rows are stored in the
  // calibration dtype; widths come from the first chunk's captures.
  std::array<int64_t, 4>& width = captured_.width_;
  std::array<std::vector<double>, 4> part;
  auto reads = [&](LayerInput in) {
    for (const auto* v : {&req.abs_mean, &req.gram, &req.rows})
      if (std::find(v->begin(), v->end(), in) != v->end()) return true;
    return false;
  };
  ChunkPass pass;
  pass.stop = stop;
  pass.attention_captures = reads(LayerInput::kAttnIn) || reads(LayerInput::kAttnConcat);
  pass.keep_attention = req.keep_attention;
  const Status done = ForEachChunk(L, lin, pass, [&](int64_t b0, int64_t nb, const LayerActs& a) {
    const int64_t r0 = b0 * t_, n = nb * t_;
    if (b0 == 0) {
      for (LayerInput in : {LayerInput::kAttnIn, LayerInput::kAttnConcat, LayerInput::kMlpIn, LayerInput::kMlpAct})
        width[Idx(in)] = a.Width(in, n);
      for (LayerInput in : req.abs_mean) part[Idx(in)].assign(AbsSumsSize(rows(), width[Idx(in)]), 0.0);
      for (LayerInput in : req.gram) captured_.gram_[Idx(in)].assign(static_cast<size_t>(width[Idx(in)] * width[Idx(in)]), 0.0f);
      for (LayerInput in : req.rows) {
        captured_.stored_[Idx(in)] = std::make_unique<CarriedActivations>(L.calib);
        captured_.stored_[Idx(in)]->Resize(rows() * width[Idx(in)]);
      }
    }
    for (LayerInput in : req.abs_mean) AddAbsSums(a.Of(in), r0, n, width[Idx(in)], part[Idx(in)].data());
    for (LayerInput in : req.gram) AccumulateGramLower(a.Of(in), n, width[Idx(in)], captured_.gram_[Idx(in)].data());
    for (LayerInput in : req.rows) captured_.stored_[Idx(in)]->Put(r0 * width[Idx(in)], a.Of(in), n * width[Idx(in)]);
    return Status::Ok();
  });
  NIBBLE_CHECK(done.ok());  // (its function never fails)
  for (LayerInput in : req.abs_mean) captured_.abs_mean_[Idx(in)] = AbsMeanOf(part[Idx(in)], rows(), width[Idx(in)]);
  for (LayerInput in : req.gram) MirrorLower(captured_.gram_[Idx(in)].data(), width[Idx(in)]);
  return captured_;
}

}  // namespace nibble
