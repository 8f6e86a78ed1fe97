#include "quantize/quantize.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <omp.h>

#include "base/parallel.h"
#include "base/sha256.h"
#include "base/version.h"
#include "formats/checkpoint_format.h"
#include "formats/float_dtype.h"
#include "formats/int4_matrix.h"
#include "formats/quark_engines.h"
#include "formats/quark_format.h"
#include "formats/engines.h"
#include "formats/rtn.h"
#include "io/checkpoint_writer.h"
#include "io/file.h"
#include "io/json.h"
#include "io/model_card.h"
#include "io/safetensors.h"
#include "io/staging_dir.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/model_loader.h"
#include "model/weights.h"
#include "quantize/calibrated.h"
#include "quantize/calibration.h"
#include "quantize/resume.h"
#include "quantize/rtn_fast.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

namespace fs = std::filesystem;

namespace {


// What one input tensor becomes in the output: the tensors to write (one, or the format's
// tensors of a quantized linear) and, for a linear's weight, its report line.
struct Produced {
  std::vector<TensorToWrite> tensors;
  std::optional<QuantizedLayerReport> layer;
};

// A float tensor written in its own dtype: borrowed unchanged, or an algorithm's new fp32 values
// (same shape) converted. Values that do not fit are an error, never inf (the AWQ search rejects
// such candidates, so this is a safety net).
Result<TensorToWrite> FloatTensor(const TensorView& t, const std::vector<float>* new_values) {
  if (new_values == nullptr) return BorrowTensor(t);
  TensorToWrite w;
  w.name = t.name;
  w.dtype = t.dtype;
  w.shape = t.shape;
  const size_t es = DTypeSize(t.dtype);
  w.bytes.resize(new_values->size() * es);
  for (size_t i = 0; i < new_values->size(); ++i) {
    const float v = (*new_values)[i];
    if (!std::isfinite(RoundToDType(v, t.dtype)))
      return MakeError("tensor ", t.name, "[", i, "] = ", v, " after AWQ smoothing does not fit ", DTypeName(t.dtype));
    StoreFloatAs(v, t.dtype, w.bytes.data() + i * es);
  }
  return w;
}

// How the export turns tensors into output tensors: the plan and the format writer.
struct ExportContext {
  const QuantizePlan* plan;
  const FormatWriter* writer;
  const TensorStore* store;  // the input: a weight read to be quantized is evicted once done
  std::map<std::string, const PlannedLinear*> linear_of_weight;  // "<module>.weight" -> its plan
  // A tied model whose lm_head is quantized: the input tensor the head is quantized from (the
  // embedding, FindOutputProjection), written after it; "" otherwise. Stored lm_head tensors are
  // then dropped (every engine ignores them while the model is tied).
  std::string head_source;
};

// One input tensor → what is written for it. `new_values` (an algorithm's fp32 result, same
// shape) replace the stored values when given, and `codes` (computed from them) the RTN of a
// quantized weight. A linear's weight is quantized per the request and written by the format, or
// kept in float when its module is excluded; anything else is kept in float. `scratch`, when
// given, holds the RTN codes (its buffers reused from one tensor to the next).
Result<Produced> ProduceLinear(const TensorView& t, const PlannedLinear& plan, const std::vector<float>* new_values,
                               const Int4Matrix* codes, const ExportContext& ex, Int4Matrix* scratch = nullptr);

Result<Produced> ProduceTensor(const TensorView& t, const std::vector<float>* new_values, const Int4Matrix* codes,
                               const ExportContext& ex, Int4Matrix* scratch = nullptr) {
  auto lin = ex.linear_of_weight.find(t.name);
  if (lin != ex.linear_of_weight.end()) return ProduceLinear(t, *lin->second, new_values, codes, ex, scratch);
  Produced res;
  NIBBLE_ASSIGN_OR_RETURN(TensorToWrite w, FloatTensor(t, new_values));
  res.tensors.push_back(std::move(w));
  return res;
}

// The weight `t` of a linear module: its tensors as the plan decides the module, and the report
// line.
Result<Produced> ProduceLinear(const TensorView& t, const PlannedLinear& r, const std::vector<float>* new_values,
                               const Int4Matrix* codes, const ExportContext& ex, Int4Matrix* scratch) {
  Produced res;
  const std::string& name = r.module;
  QuantizedLayerReport lr;
  lr.name = name;
  lr.rule = r.rule;
  lr.n = t.shape[0];
  lr.k = t.shape[1];
  lr.bytes_in = static_cast<int64_t>(t.nbytes);
  if (!r.spec) {
    NIBBLE_ASSIGN_OR_RETURN(TensorToWrite w, FloatTensor(t, new_values));
    res.tensors.push_back(std::move(w));
    lr.bytes_out = lr.bytes_in;
    res.layer = std::move(lr);
    return res;
  }
  const DType scale_dtype = r.spec->scale_dtype.value_or(t.dtype);
  Int4Matrix local;
  Int4Matrix& rtn = scratch != nullptr ? *scratch : local;
  // RTN of the stored weight: the fast path (quantize/rtn_fast.h), else (algorithms' values, or
  // what the fast path leaves to the reference to refuse) the reference on an fp32 copy.
  const bool fast = codes == nullptr && new_values == nullptr && QuantizeRtnFast(t, *r.spec, scale_dtype, &rtn, &lr.rel_error);
  std::vector<float> owned;
  const std::vector<float>* w = new_values;
  if (!fast && w == nullptr) {
    NIBBLE_ASSIGN_OR_RETURN(owned, TensorToF32(t));
    w = &owned;
  }
  if (!fast && codes == nullptr) {
    Result<Int4Matrix> q = QuantizeRtnRef(w->data(), lr.n, lr.k, *r.spec, scale_dtype);
    if (!q.ok()) return q.error().WithContext("layer " + name);
    rtn = std::move(q).value();
  }
  const Int4Matrix& q = codes != nullptr ? *codes : rtn;
  auto packed = ex.writer->WriteLinear(name, q, *r.spec, scale_dtype);
  if (!packed.ok()) return packed.error().WithContext("layer " + name);
  if (!fast) lr.rel_error = RelWeightError(*w, q);
  if (fast || w == &owned) ex.store->Evict(t);  // read once (a pending borrowed copy of it re-reads the file)
  lr.quantized = true;
  lr.scheme = DescribeSpec(*r.spec);
  for (auto& pt : *packed) {
    lr.bytes_out += static_cast<int64_t>(pt.bytes.size());
    res.tensors.push_back(std::move(pt));
  }
  res.layer = std::move(lr);
  return res;
}

// The output in input order (sorted names, so "model.layers.10." before "model.layers.2."), fed
// by the calibrated pipeline as it finishes decoder layers in numeric order: a tensor whose turn
// has come goes to the writer at once, one finished early is spooled to disk (CheckpointWriter::
// Spool) until its turn, and the tensors the pipeline does not hand over are copied from the
// input as their turn comes. So memory holds no finished tensor past its layer, whatever the
// order. An RTN export awaits nothing: every tensor is produced in turn, and its output is laid
// out before the first (Layout, CheckpointWriter::LayOut), so each tensor is written once.
class OrderedExport {
 public:
  OrderedExport(const QuantizeOptions& o, const TensorStore& store, const ExportContext& ex, size_t n_modules,
                int64_t layers, CheckpointWriter& out, QuantizeReport& report)
      : o_(o), store_(store), ex_(ex), n_modules_(n_modules), layers_(layers), out_(out), report_(report) {
    for (const std::string& name : store.Names())
      if (ex.head_source.empty() || !name.starts_with("lm_head.")) order_.push_back(name);  // see head_source
  }
  /// The tensors a calibrated pipeline will hand over (LayerTensorNames of every layer).
  void Await(const std::vector<std::string>& names) { awaited_.insert(names.begin(), names.end()); }
  /// Every tensor whose turn has come, until one that is awaited.
  Status Drain();
  /// A tensor the pipeline handed over. Errors: one not awaited (kInternal), the writer's.
  Status Deliver(const std::string& name, Produced p);
  /// After the pipeline: the rest. Errors: an awaited tensor never handed over (kInternal).
  Status Finish();
  /// An RTN run's layer boundaries (quantize/resume.h): `f` is called with the count of decoder
  /// layers written each time the output order leaves a layer's tensors.
  void OnLayerWritten(std::function<Status(int64_t)> f) { layer_written_ = std::move(f); }
  /// Every tensor the export will write, in order, when known before the first is produced: an
  /// RTN run whose format lays out each quantized linear (FormatWriter::LinearLayout); else
  /// nullopt (the writer streams).
  std::optional<std::vector<TensorSlot>> Layout() const;
  /// Its position, the tensors spooled before their turn and the report lines so far; and back.
  nlohmann::ordered_json SaveState() const;
  Status LoadState(const nlohmann::ordered_json& j);

 private:
  struct Early {  // a tensor finished before its turn: its bytes in the spool
    std::vector<CheckpointWriter::Spooled> tensors;
    std::optional<QuantizedLayerReport> layer;
  };
  template <typename T>
  Status Append(std::vector<T>& tensors, std::optional<QuantizedLayerReport>& layer);
  /// Calls layer_written_ when the output order at next_ leaves a decoder layer's tensors.
  Status AtLayerBoundary();

  const QuantizeOptions& o_;
  const TensorStore& store_;
  const ExportContext& ex_;
  size_t n_modules_;
  int64_t layers_;
  std::set<std::string> layers_seen_;  // decoder layers with a linear produced (RTN's stages)
  CheckpointWriter& out_;
  QuantizeReport& report_;
  std::vector<std::string> order_;
  size_t next_ = 0;
  int64_t done_ = 0;
  std::set<std::string> awaited_;
  std::map<std::string, Early> early_;
  std::function<Status(int64_t)> layer_written_;
  int64_t layers_written_ = 0;
  size_t boundary_at_ = 0;  // next_ of the last boundary (a resumed run starts there)
};

// The tensors ProduceLinear writes for `t` under `r`, or nullopt when the format cannot say.
std::optional<std::vector<TensorSlot>> LinearSlots(const TensorView& t, const PlannedLinear& r, const FormatWriter& w) {
  if (!r.spec) return std::vector<TensorSlot>{{t.name, t.dtype, t.shape}};
  if (t.shape.size() != 2) return std::nullopt;
  return w.LinearLayout(r.module, t.shape[0], t.shape[1], *r.spec, r.spec->scale_dtype.value_or(t.dtype));
}

std::optional<std::vector<TensorSlot>> OrderedExport::Layout() const {
  if (ex_.plan->algorithms.Calibrated()) return std::nullopt;
  std::vector<TensorSlot> out;
  auto add = [&out](std::optional<std::vector<TensorSlot>> s) {
    if (s) out.insert(out.end(), s->begin(), s->end());
    return s.has_value();
  };
  for (const std::string& name : order_) {
    const TensorView& t = *store_.Find(name);
    auto lin = ex_.linear_of_weight.find(name);
    if (lin == ex_.linear_of_weight.end()) out.push_back({t.name, t.dtype, t.shape});
    else if (!add(LinearSlots(t, *lin->second, *ex_.writer))) return std::nullopt;
    if (name == ex_.head_source && !add(LinearSlots(t, *ex_.plan->Find("lm_head"), *ex_.writer))) return std::nullopt;
  }
  return out;
}

nlohmann::ordered_json LayerReportJson(const QuantizedLayerReport& l) {
  return {{"name", l.name},   {"rule", l.rule},         {"quantized", l.quantized},  {"scheme", l.scheme},
          {"n", l.n},         {"k", l.k},               {"bytes_in", l.bytes_in},    {"bytes_out", l.bytes_out},
          {"rel_error", DoubleJson(l.rel_error)}};
}

QuantizedLayerReport LayerReportFromJson(const nlohmann::ordered_json& j) {
  QuantizedLayerReport l;
  l.name = j.at("name").get<std::string>();
  l.rule = j.at("rule").get<std::string>();
  l.quantized = j.at("quantized").get<bool>();
  l.scheme = j.at("scheme").get<std::string>();
  l.n = j.at("n").get<int64_t>();
  l.k = j.at("k").get<int64_t>();
  l.bytes_in = j.at("bytes_in").get<int64_t>();
  l.bytes_out = j.at("bytes_out").get<int64_t>();
  l.rel_error = DoubleFromJson(j.at("rel_error"));
  return l;
}

nlohmann::ordered_json OrderedExport::SaveState() const {
  nlohmann::ordered_json early = nlohmann::ordered_json::array();
  for (const auto& [name, e] : early_) {
    nlohmann::ordered_json t = nlohmann::ordered_json::array();
    for (const CheckpointWriter::Spooled& sp : e.tensors) t.push_back(CheckpointWriter::SpooledJson(sp));
    early.push_back({{"name", name}, {"tensors", t}, {"layer", e.layer ? LayerReportJson(*e.layer) : nlohmann::ordered_json()}});
  }
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const QuantizedLayerReport& l : report_.layers) layers.push_back(LayerReportJson(l));
  return {{"next", next_}, {"next_name", next_ < order_.size() ? order_[next_] : ""}, {"done", done_},
          {"layers_written", layers_written_}, {"early", early}, {"layers", layers},
          {"format", ex_.writer->SaveState()}};
}

Status OrderedExport::LoadState(const nlohmann::ordered_json& j) {
  try {
    next_ = j.at("next").get<size_t>();
    if (next_ > order_.size() || (next_ < order_.size() && order_[next_] != j.at("next_name").get<std::string>()))
      return MakeErrorCode(ErrorCode::kCorruptInput, "the manifest's export position ", next_, " does not match the input's tensors");
    boundary_at_ = next_;
    if (!j.at("format").is_null()) NIBBLE_RETURN_IF_ERROR(ex_.writer->LoadState(j.at("format")));
    done_ = j.at("done").get<int64_t>();
    layers_written_ = j.at("layers_written").get<int64_t>();
    for (const auto& e : j.at("early")) {
      Early x;
      for (const auto& t : e.at("tensors")) {
        NIBBLE_ASSIGN_OR_RETURN(CheckpointWriter::Spooled sp, CheckpointWriter::SpooledFromJson(t));
        NIBBLE_RETURN_IF_ERROR(out_.VerifySpooled(sp));
        x.tensors.push_back(std::move(sp));
      }
      if (!e.at("layer").is_null()) x.layer = LayerReportFromJson(e.at("layer"));
      early_[e.at("name").get<std::string>()] = std::move(x);
    }
    report_.layers.clear();
    for (const auto& l : j.at("layers")) {
      report_.layers.push_back(LayerReportFromJson(l));
      const std::string& name = report_.layers.back().name;  // RTN's stage count goes on from here
      if (const std::string prefix = LayerPrefix(name); !prefix.empty()) layers_seen_.insert(prefix);
    }
  } catch (const std::exception& e) {
    return MakeErrorCode(ErrorCode::kCorruptInput, "the manifest's export state: ", e.what());
  }
  return Status::Ok();
}

template <typename T>
Status OrderedExport::Append(std::vector<T>& tensors, std::optional<QuantizedLayerReport>& layer) {
  for (auto& t : tensors) {
    ExportForTest();
    NIBBLE_RETURN_IF_ERROR(out_.Add(std::move(t)));
  }
  tensors.clear();
  if (!layer) return Status::Ok();
  // RTN: a decoder layer's stage starts with its first linear (in the output's order).
  if (o_.on_stage && !ex_.plan->algorithms.Calibrated() && !LayerPrefix(layer->name).empty() &&
      layers_seen_.insert(LayerPrefix(layer->name)).second) {
    const int64_t started = static_cast<int64_t>(layers_seen_.size());
    o_.on_stage(started, layers_, started - 1, "quantize");
  }
  report_.layers.push_back(std::move(*layer));
  if (o_.progress && !ex_.plan->algorithms.Calibrated()) o_.progress(++done_, static_cast<int64_t>(n_modules_));
  return Status::Ok();
}

// A resumable run's boundary: the output order at next_ leaves a decoder layer's tensors.
Status OrderedExport::AtLayerBoundary() {
  if (!layer_written_ || next_ <= boundary_at_ || next_ >= order_.size()) return Status::Ok();
  const std::string prev = LayerPrefix(order_[next_ - 1]);
  if (prev.empty() || prev == LayerPrefix(order_[next_])) return Status::Ok();
  boundary_at_ = next_;
  return layer_written_(++layers_written_);
}

// The run of tensors up to the first awaited one is produced on --threads threads, claimed in
// order a few tensors ahead, and appended here in order (OrderedParallelFor): the output, its
// report and the progress callbacks are those of one thread. The weight a claim will read next
// is asked of the page cache ahead of its turn (TensorStore::WillNeed).
Status OrderedExport::Drain() {
  const size_t base = next_;
  size_t end = base;
  while (end < order_.size() && !awaited_.contains(order_[end])) ++end;
  struct Slot {
    Status status = Status::Ok();
    std::optional<Produced> tensor, head;
  };
  const int threads = std::max(1, omp_get_max_threads());
  std::vector<Slot> slots(end - base);
  std::vector<char> early(slots.size());  // read here: consume erases from early_ meanwhile
  for (size_t i = 0; i < slots.size(); ++i) early[i] = early_.contains(order_[base + i]) ? 1 : 0;
  std::vector<Int4Matrix> scratch(static_cast<size_t>(threads));
  auto quantized_input = [&](size_t j) { return j < end && ex_.linear_of_weight.contains(order_[j]); };
  auto produce = [&](int64_t i, int worker) {
    const size_t j = base + static_cast<size_t>(i);
    if (quantized_input(j + threads)) store_.WillNeed(*store_.Find(order_[j + threads]));
    const std::string& tname = order_[j];
    Slot& slot = slots[static_cast<size_t>(i)];
    if (early[static_cast<size_t>(i)]) return;
    Result<Produced> p = ProduceTensor(*store_.Find(tname), nullptr, nullptr, ex_, &scratch[static_cast<size_t>(worker)]);
    if (!p.ok()) {
      slot.status = p.error();
      return;
    }
    slot.tensor = std::move(p).value();
    if (tname != ex_.head_source) return;
    Result<Produced> head = ProduceLinear(*store_.Find(tname), *ex_.plan->Find("lm_head"), nullptr, nullptr, ex_,
                                          &scratch[static_cast<size_t>(worker)]);
    if (!head.ok()) slot.status = head.error();
    else slot.head = std::move(head).value();
  };
  Status status = Status::Ok();
  auto consume = [&](int64_t i) {
    next_ = base + static_cast<size_t>(i);  // the position a boundary saves
    const std::string& tname = order_[next_];
    Slot& slot = slots[static_cast<size_t>(i)];
    status = AtLayerBoundary();
    if (status.ok()) status = CheckCancelled(o_.cancel, "quantize at " + tname);
    if (status.ok()) {
      if (auto it = early_.find(tname); it != early_.end()) {
        status = Append(it->second.tensors, it->second.layer);
        early_.erase(it);
      } else {
        status = slot.status;
        if (status.ok()) status = Append(slot.tensor->tensors, slot.tensor->layer);
        if (status.ok() && slot.head) status = Append(slot.head->tensors, slot.head->layer);
      }
    }
    slot = Slot{};
    return status.ok();
  };
  if (quantized_input(base)) store_.WillNeed(*store_.Find(order_[base]));
  for (size_t j = base + 1; j < base + static_cast<size_t>(threads); ++j)
    if (quantized_input(j)) store_.WillNeed(*store_.Find(order_[j]));
  const bool ok = OrderedParallelFor(static_cast<int64_t>(slots.size()), threads, 2 * threads, produce, consume);
  if (!ok) return status;
  next_ = end;
  if (next_ < order_.size()) {
    NIBBLE_RETURN_IF_ERROR(AtLayerBoundary());
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(o_.cancel, "quantize at " + order_[next_]));
  }
  return Status::Ok();
}

Status OrderedExport::Deliver(const std::string& name, Produced p) {
  if (!awaited_.contains(name))
    return MakeErrorCode(ErrorCode::kInternal, "the quantize pipeline handed over ", name, ", which the export does not await");
  NIBBLE_RETURN_IF_ERROR(Drain());  // what precedes it and is not awaited (lm_head, embed_tokens before layer 0)
  awaited_.erase(name);
  if (next_ < order_.size() && order_[next_] == name) {
    NIBBLE_RETURN_IF_ERROR(Append(p.tensors, p.layer));
    ++next_;
    return Drain();
  }
  Early e{{}, std::move(p.layer)};
  for (TensorToWrite& t : p.tensors) {
    NIBBLE_ASSIGN_OR_RETURN(CheckpointWriter::Spooled s, out_.Spool(t));
    t = TensorToWrite{};
    e.tensors.push_back(std::move(s));
  }
  early_[name] = std::move(e);
  return Status::Ok();
}

Status OrderedExport::Finish() {
  if (!awaited_.empty())
    return MakeErrorCode(ErrorCode::kInternal, "the quantize pipeline did not hand over ", *awaited_.begin());
  NIBBLE_RETURN_IF_ERROR(Drain());
  if (!early_.empty())
    return MakeErrorCode(ErrorCode::kInternal, "tensor ", early_.begin()->first, " is not in the input's order");
  return Status::Ok();
}

// The plan's calibrated chain (AWQ, GPTQ, AWQ+GPTQ) on the sequential pipeline: calibration data,
// then each layer's tensors produced and handed to `exp` as soon as the layer is done, so memory
// never holds the model in fp32 nor its finished tensors. Records the run in `report` and the
// algo_config in `cfg`.
Status RunCalibratedExport(const QuantizeOptions& o, const ModelConfig& mc, const TensorStore& store,
                           const ExportContext& ex, OrderedExport& exp, QuarkQuantConfig& cfg, QuantizeReport& report,
                           const std::function<void(const std::string&)>& note, CalibCheckpoint* checkpoint) {
  const AlgorithmPlan& algos = ex.plan->algorithms;
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(o.model_dir));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<std::string> texts, ReadCalibrationTexts(o.dataset));
  auto calib = BuildCalibrationData(*tok, texts, o.num_calib_data, o.calib_seq_len, o.seed);
  // (The flags were checked up front: what is left is the file's content, exit 1 in the CLI.)
  if (!calib.ok()) return calib.error().WithContext("--dataset " + o.dataset).WithCode(ErrorCode::kCorruptInput);
  for (const auto& w : calib->warnings) note("warning: --dataset " + o.dataset + ": " + w);
  report.calib_chunks = calib->num_chunks;
  report.calib_seq_len = calib->seq_len;
  report.calib_available_chunks = calib->available_chunks;
  report.calib_total_tokens = calib->total_tokens;
  // Every layer ends on a multiple of its step count: that is where on_layer fires.
  auto progress = [&o, layers = mc.num_hidden_layers](int64_t done, int64_t total) {
    if (o.progress) o.progress(done, total);
    if (o.on_layer && total % layers == 0 && done % (total / layers) == 0) o.on_layer(done / (total / layers), layers);
  };
  for (int64_t l = checkpoint ? checkpoint->start_layer : 0; l < mc.num_hidden_layers; ++l) exp.Await(LayerTensorNames(mc, l));
  auto sink = [&](LayerTensor lt) -> Status {
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(o.cancel, "quantize at " + lt.name));
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, store.Get(lt.name));
    NIBBLE_ASSIGN_OR_RETURN(Produced p, ProduceTensor(*t, &lt.values, lt.codes ? &*lt.codes : nullptr, ex));
    lt = LayerTensor{};
    return exp.Deliver(t->name, std::move(p));
  };
  const Propagation prop = algos.propagation();
  NIBBLE_ASSIGN_OR_RETURN(cfg.calibration,
                          CalibrationRecord(o.dataset, *calib, o.seed, prop == Propagation::kFp ? "fp" : "quantized"));
  report.propagation = prop;
  auto stage = [&o, layers = mc.num_hidden_layers](int64_t l, const char* what) {
    if (o.on_stage) o.on_stage(l + 1, layers, l, what);
  };
  auto r = RunCalibrated(mc, store, *ex.plan, algos, calib->tokens, calib->num_chunks, calib->seq_len, sink, progress,
                         o.cancel, stage, checkpoint);
  if (!r.ok()) return r.error().code == ErrorCode::kCancelled ? r.error() : r.error().WithContext(algos.Label());
  for (const auto& m : r->messages) note(m);
  cfg.algo_config = algos.AlgoConfig(*r, mc);
  report.calib = std::move(r).value();
  return Status::Ok();
}

// The note at the top of the output's README.md (io/model_card.h): what was quantized how, as
// Quark and llm-compressor state it in theirs.
ModelCardNote QuantizeCardNote(const QuantizeOptions& o, const FormatEntry& format, const QuantizeReport& report) {
  ModelCardNote n;
  n.heading = std::string("Quantized with nibble ") + NibbleVersion();
  n.summary = "`nibble quantize` wrote this checkpoint from the model below: int4 weight-only quantization of its "
              "linear layers; every other tensor is unchanged.";
  n.items.push_back({"algorithm", report.algorithms.CardLine()});
  std::map<std::string, int64_t> schemes;
  std::vector<std::string> kept;
  for (const QuantizedLayerReport& l : report.layers) {
    if (l.quantized) ++schemes[l.scheme];
    else kept.push_back(l.name);
  }
  n.items.push_back({"scheme", SchemeCounts(schemes) + " (uint4: asymmetric with zero points, int4: symmetric; g: group_size)"});
  if (report.algorithms.Calibrated())
    n.items.push_back({"calibration", fs::path(o.dataset).filename().string() + ", " + std::to_string(report.calib_chunks) +
                                          " samples x " + std::to_string(report.calib_seq_len) + " tokens" +
                                          (o.seed == 0 ? " (the first in order)" : " (seed " + std::to_string(o.seed) + ")")});
  std::string excluded;
  const size_t shown = std::min<size_t>(kept.size(), 8);
  for (size_t i = 0; i < shown; ++i) excluded += (i ? ", " : "") + kept[i];
  if (kept.size() > shown) excluded += " and " + std::to_string(kept.size() - shown) + " more";
  n.items.push_back({"excluded layers (kept in float)", kept.empty() ? "none" : excluded});
  n.items.push_back({"export format", std::string(format.export_name) + " (" + format.description +
                                          "), quant_method " + format.quant_method + " in config.json"});
  return n;
}

// Checks the flags before the model directory is read (a typo is named at once, whatever the
// size) and resolves the algorithm chain with its settings once (an algo_config entry over the
// flags).
Result<AlgorithmPlan> CheckRequest(const QuantizeOptions& o) {
  auto chain = ParseAlgorithmChain(o.quant_algo);
  if (!chain.ok()) return chain.error().WithContext("--quant_algo \"" + o.quant_algo + "\"");
  NIBBLE_ASSIGN_OR_RETURN(AlgorithmPlan algos, ResolveAlgorithms(*chain, o.algorithms, o.config.algo_config));
  // (range checks whatever the algorithm: a value RTN does not read is still a wrong flag)
  if (o.num_calib_data < 1) return MakeError("--num_calib_data ", o.num_calib_data, " must be at least 1");
  if (o.calib_seq_len < 1) return MakeError("--seq_len ", o.calib_seq_len, " must be at least 1");
  if (algos.Calibrated() && o.dataset.empty())
    return MakeError("--quant_algo ", algos.Name(), " needs calibration data: --dataset FILE");
  NIBBLE_ASSIGN_OR_RETURN(const FormatEntry* format, FindExportFormat(o.model_export));
  NIBBLE_RETURN_IF_ERROR(algos.CheckExport(*format, o.model_export));
  if (o.tp < 0) return MakeError("--tp ", o.tp, " must be >= 1 (or 0: no tensor-parallel check)");
  if (algos.Calibrated() && !fs::exists(o.dataset))
    return MakeErrorCode(ErrorCode::kNotFound, "--dataset ", o.dataset, ": no such file");
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> fmt, OpenCheckpointFormat(o.model_dir));
  if (fmt != nullptr) return MakeError(o.model_dir, ": the checkpoint is already quantized; quantize a float checkpoint");
  NIBBLE_RETURN_IF_ERROR(CheckOutputReplaceable(o.output_dir, o.overwrite));
  if (fs::exists(o.output_dir) && fs::equivalent(o.output_dir, o.model_dir))
    return MakeError("output directory ", o.output_dir, " is the input model directory");
  return algos;
}

// What the resource plan needs besides the plan and the model: the calibration asked, the
// format, the side files and what the process holds now.
ResourceInputs PlanInputs(const QuantizeOptions& o, const FormatEntry& format) {
  ResourceInputs in;
  std::error_code ec;
  if (!o.dataset.empty()) {
    const auto size = fs::file_size(o.dataset, ec);
    in.dataset_bytes = ec ? 0 : static_cast<int64_t>(size);
  }
  in.calib_batch = o.num_calib_data;
  in.calib_seq_len = o.calib_seq_len;
  in.threads = omp_get_max_threads();
  in.output_dir = o.output_dir;
  in.max_shard_size = o.max_shard_size;
  const std::string name = format.export_name;
  in.stores_symmetric_zeros = name == "gptq" || name == "awq";
  for (const std::string& f : CheckpointSideFiles(o.model_dir)) {
    const auto size = fs::file_size(fs::path(o.model_dir) / f, ec);
    if (!ec) in.side_file_bytes += static_cast<int64_t>(size);
  }
  in.baseline_anon = std::max<int64_t>(0, ReadProcessMemory().anon);
  in.resumable = o.resumable || o.resume;
  if (o.resume) {  // what the stopped run staged is already on the disk
    const std::string staged = StagingDir::FindInterrupted(o.output_dir, "tmp", kResumeManifest);
    for (const auto& e : fs::directory_iterator(staged.empty() ? fs::path() : fs::path(staged), ec))
      if (e.is_regular_file(ec)) in.staged_bytes += static_cast<int64_t>(e.file_size(ec));
  }
  return in;
}

// The plan's spec of a module, for the tensor-parallel check.
SpecResolver PlanResolver(const QuantizePlan& plan) {
  return [&plan](const std::string& module) -> Result<std::optional<QuantSpec>> {
    const PlannedLinear* l = plan.Find(module);
    if (l == nullptr) return MakeError("the quantize plan has no linear ", module);
    return l->spec;
  };
}

// Warnings that only the model and the written config reveal: the input's tied lm_head as a load
// of it would warn, an explicit --exclude_layers that replaced
// the default lm_head exclusion, and what the written config makes other engines read
// (QuantizedFormat::Engines): `config_text` as staged in `staging_dir` beside the format's side
// files, and the output's tie_word_embeddings `tied`.
Result<std::vector<std::string>> OutputWarnings(const QuantizeOptions& o, const FormatEntry& format, const ModelConfig& mc,
                                                const TensorStore& store, bool tied, const std::string& config_text,
                                                const std::string& staging_dir, const QuantizeReport& report) {
  std::vector<LinearShapeInfo> shapes;
  bool lm_head_quantized = false;
  for (const QuantizedLayerReport& l : report.layers) {
    shapes.push_back({l.name, l.n, l.k});
    lm_head_quantized = lm_head_quantized || (l.name == "lm_head" && l.quantized);
  }
  std::vector<std::string> lines;
  std::vector<std::string> tied_input;
  NIBBLE_RETURN_IF_ERROR(CheckTiedLmHead(mc, store, nullptr, &tied_input));
  for (const std::string& t : tied_input) lines.push_back("warning: " + o.model_dir + ": " + t);
  if (o.note_replaced_head_exclusion && lm_head_quantized)
    lines.push_back("note: --exclude_layers replaces the default lm_head exclusion: lm_head is quantized "
                    "(add lm_head to the list to keep it in float)");
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> written,
                          format.open(config_text, JoinPath(staging_dir, "config.json")));
  NIBBLE_ASSIGN_OR_RETURN(EnginesReport engines, written->Engines(shapes, tied));
  for (const std::string& d : EngineNotReadingLines(engines)) lines.push_back("note: " + d);
  for (const std::string& d : EngineDisagreementLines(engines)) lines.push_back("warning: " + d);
  return lines;
}

// A resumable run's side of QuantizeCheckpoint (quantize/resume.h).
struct Resumable {
  nlohmann::ordered_json identity;  // nibble_version, settings, input, dataset_sha256
  nlohmann::ordered_json manifest;  // the boundary a resumed run starts from
  int64_t layers_done = -1;         // the last boundary written or resumed from (checked); -1: none
  int64_t num_layers = 0;
  std::string staging;              // the staging directory kept for --resume
  std::string model_dir;            // the input, checked against identity["input"] at each boundary
};

Result<nlohmann::ordered_json> RunIdentity(const QuantizeOptions& o, bool calibrated) {
  nlohmann::ordered_json j;
  j["nibble_version"] = NibbleVersion();
  j["settings"] = o.resume_settings;
  NIBBLE_ASSIGN_OR_RETURN(j["input"], InputFingerprint(o.model_dir));
  if (calibrated) {
    NIBBLE_ASSIGN_OR_RETURN(std::string data, ReadFileToString(o.dataset));
    j["dataset_sha256"] = Sha256Hex(data);
  }
  return j;
}

// One boundary: `layers_done` decoder layers are in the writer; `calibrated` and the activations
// `x` (the next layer's input) for a calibrated run. Files first, the manifest last.
Status WriteBoundary(Resumable& rs, CheckpointWriter& out, const OrderedExport& exp, int64_t layers_done,
                     const nlohmann::ordered_json& calibrated, std::span<const uint8_t> x, const std::string& dtype,
                     int64_t hidden) {
  // The input is mapped, not copied: a shard changed under the run would mix two inputs.
  NIBBLE_ASSIGN_OR_RETURN(const nlohmann::ordered_json input, InputFingerprint(rs.model_dir));
  if (const std::vector<std::string> diffs = InputDifferences(rs.identity.at("input"), input); !diffs.empty()) {
    std::string list;
    for (const std::string& d : diffs) list += "\n  " + d;
    rs.layers_done = -1;  // (no resume hint: a resume would be refused for the same differences)
    return MakeErrorCode(ErrorCode::kCorruptInput, "the input ", rs.model_dir, " changed during the run:", list,
                         "\nnothing was written to the output; start over once the input is final");
  }
  nlohmann::ordered_json m = rs.identity;
  m["layers_done"] = layers_done;
  m["num_layers"] = rs.num_layers;
  NIBBLE_ASSIGN_OR_RETURN(m["writer"], out.SaveState());
  m["export"] = exp.SaveState();
  m["calibrated"] = calibrated;
  m["activations"] = nullptr;
  if (!dtype.empty()) {
    NIBBLE_ASSIGN_OR_RETURN(DType dt, ParseDType(dtype));
    const int64_t rows = static_cast<int64_t>(x.size() / (DTypeSize(dt) * static_cast<size_t>(hidden)));
    NIBBLE_ASSIGN_OR_RETURN(m["activations"], SaveActivations(out.path(), layers_done, x, dtype, {rows, hidden}));
  }
  NIBBLE_RETURN_IF_ERROR(WriteManifest(out.path(), m));
  out.AfterBoundary();
  RemoveOlderActivations(out.path(), m["activations"]);
  rs.layers_done = layers_done;
  rs.staging = out.path();
  out.KeepStaging();
  BoundaryForTest(layers_done);
  return Status::Ok();
}

// A fresh run's writer; a resumable one says when it replaces an interrupted run's staging.
Result<CheckpointWriter> NewWriter(const QuantizeOptions& o, bool resumable, const std::function<void(const std::string&)>& note) {
  if (resumable) {
    const std::string old = StagingDir::FindInterrupted(o.output_dir, "tmp", kResumeManifest);
    if (!old.empty()) {
      auto m = ReadManifest(old);
      const std::string done = m.ok() ? " (" + std::to_string(m->value("layers_done", int64_t{0})) + " of " +
                                            std::to_string(m->value("num_layers", int64_t{0})) + " layers done)"
                                      : "";
      note("note: starting over: removing " + old + ", the staging directory of an interrupted run" + done +
           "; --resume continues such a run instead");
    }
  }
  NIBBLE_ASSIGN_OR_RETURN(CheckpointWriter out, CheckpointWriter::Create(o.output_dir, o.max_shard_size));
  if (resumable) out.SetResumable();
  return out;
}

// A resumed run's writer: the interrupted run's staging directory, checked against this run.
Result<CheckpointWriter> ResumeWriter(const QuantizeOptions& o, const TensorStore& store, Resumable& rs,
                                      const std::function<void(const std::string&)>& note) {
  const std::string dir = StagingDir::FindInterrupted(o.output_dir, "tmp", kResumeManifest);
  if (dir.empty())
    return MakeErrorCode(ErrorCode::kNotFound, "--resume: no interrupted run of ", o.output_dir,
                         " to continue (no staging directory .", fs::path(o.output_dir).filename().string(),
                         ".nibble-tmp-<pid> holding ", kResumeManifest,
                         " beside it); run the same command without --resume to start one");
  NIBBLE_ASSIGN_OR_RETURN(rs.manifest, ReadManifest(dir));
  std::vector<std::string> diffs = IdentityDifferences(rs.manifest, rs.identity);
  if (rs.manifest.value("num_layers", int64_t{-1}) != rs.num_layers)
    diffs.push_back("decoder layers: run had " + std::to_string(rs.manifest.value("num_layers", int64_t{-1})) + ", now " +
                    std::to_string(rs.num_layers));
  if (!diffs.empty()) {
    std::string list;
    for (const std::string& d : diffs) list += "\n  " + d;
    return MakeError("--resume: the run staged in ", dir, " differs from this one:", list,
                     "\nrun the command it was started with, or start over without --resume (which removes it)");
  }
  NIBBLE_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Adopt(o.output_dir, "tmp", dir));
  staging.Keep();  // a check below that fails leaves it as it was found
  auto borrow = [&store](const std::string& name) -> Result<TensorToWrite> {
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, store.Get(name));
    return BorrowTensor(*t);
  };
  const std::string path = staging.path();
  auto out = CheckpointWriter::Resume(std::move(staging), o.max_shard_size, rs.manifest.at("writer"), borrow);
  if (!out.ok()) return out.error().WithContext("--resume: " + path);
  rs.staging = path;
  note("note: resuming the run staged in " + path + " after layer " +
       std::to_string(rs.manifest.value("layers_done", int64_t{0})) + " of " +
       std::to_string(rs.num_layers));
  return out;
}

Result<QuantizeReport> RunQuantize(const QuantizeOptions& o, Resumable& rs);

}  // namespace

Result<QuantizeReport> QuantizeCheckpoint(const QuantizeOptions& o) {
  Resumable rs;
  Result<QuantizeReport> r = RunQuantize(o, rs);
  if (r.ok() || rs.layers_done < 0 || !PathExists(JoinPath(rs.staging, kResumeManifest))) return r;
  Error e = r.error();
  e.message += "; the run's progress (" + std::to_string(rs.layers_done) + " of " + std::to_string(rs.num_layers) +
               " layers) is kept in " + rs.staging + ": run the same command with --resume to continue";
  return e;
}

namespace {

// A resumable run's boundaries: written by the RTN export or the calibrated pipeline; a resumed
// calibrated run starts from the saved layer with its activations (checked against the manifest).
Status SetUpBoundaries(const QuantizeOptions& o, bool calibrated, int64_t hidden, Resumable& rs, CheckpointWriter& out,
                       OrderedExport& exp, CalibCheckpoint& ck) {
  // An RTN run's boundary is where the output order leaves a layer's tensors; a calibrated run's
  // where the pipeline handed a layer over (its state and activations belong to that one only).
  if (!calibrated)
    exp.OnLayerWritten([&rs, &out, &exp, hidden](int64_t n) { return WriteBoundary(rs, out, exp, n, nullptr, {}, "", hidden); });
  else
    ck.on_boundary = [&rs, &out, &exp, hidden](int64_t layer, const nlohmann::ordered_json& st, std::span<const uint8_t> x,
                                               const std::string& dtype) {
      return WriteBoundary(rs, out, exp, layer + 1, st, x, dtype, hidden);
    };
  if (o.resume && calibrated) {
    ck.start_layer = rs.manifest.at("layers_done").get<int64_t>();
    ck.state = rs.manifest.at("calibrated");
    const nlohmann::ordered_json& acts = rs.manifest.at("activations");
    if (!ck.state.is_object() || !acts.is_object())
      return MakeErrorCode(ErrorCode::kCorruptInput, "--resume: ", rs.staging, "/", kResumeManifest,
                           " has no calibrated state or activations for the calibrated chain");
    auto x = LoadActivations(rs.staging, acts);
    if (!x.ok()) return x.error().WithContext("--resume: " + rs.staging);
    ck.input = std::move(x).value();
    ck.input_dtype = acts.value("dtype", "");
  }
  // Every staged byte it reuses checked: from here a stop keeps it resumable as found.
  if (o.resume) rs.layers_done = rs.manifest.at("layers_done").get<int64_t>();
  return Status::Ok();
}

Result<QuantizeReport> RunQuantize(const QuantizeOptions& o, Resumable& rs) {
  const auto t0 = std::chrono::steady_clock::now();
  PeakMemorySampler memory;
  QuantizeReport report;
  NIBBLE_ASSIGN_OR_RETURN(AlgorithmPlan algorithms, CheckRequest(o));
  NIBBLE_ASSIGN_OR_RETURN(const FormatEntry* format, FindExportFormat(o.model_export));
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(o.model_dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(o.model_dir));
  NIBBLE_ASSIGN_OR_RETURN(nlohmann::ordered_json config_json, ReadConfigJsonOrdered(o.model_dir));

  NIBBLE_RETURN_IF_ERROR(CheckCheckpointShapes(mc, store, nullptr));
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(mc, store));
  NIBBLE_ASSIGN_OR_RETURN(QuantizePlan plan,
                          MakeQuantizePlan(o.config, std::move(algorithms), o.misaligned, mc, store, proj));
  report.algorithms = plan.algorithms;
  if (o.tp > 0) NIBBLE_RETURN_IF_ERROR(CheckTensorParallel(PlanResolver(plan), plan.WrittenShapes(), o.tp));
  ExportRequest request;
  request.config = plan.config;
  request.modules = plan.WrittenModules();
  request.plans = plan.WrittenPlans();
  if (!plan.linears.back().written) request.absent_modules = {"lm_head"};
  request.gptq_format = o.gptq_format;
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<FormatWriter> writer, format->writer(request));
  if (std::optional<DType> dt = writer->ScaleDType()) {
    plan.SetScaleDType(*dt);
    SetScaleDType(request, *dt);
  }
  ExportContext ex{&plan, writer.get(), &store, {}, ""};
  for (const PlannedLinear& l : plan.linears)
    if (l.written && l.weight == l.module + ".weight") ex.linear_of_weight[l.weight] = &l;
  if (plan.head_from_embedding) ex.head_source = kEmbedTokensWeight;
  auto note = [&](const std::string& m) {
    report.messages.push_back(m);
    if (o.message) o.message(m);
  };
  if (plan.head_from_embedding) {
    note(std::string("note: ") + kTiedHeadQuantizedNote);
    if (proj.head_stored)
      note("note: the stored lm_head tensors (which Transformers and vLLM ignore in a tied model) are not written: "
           "the quantized lm_head replaces them");
  }
  if (!plan.algorithms.Calibrated() && !o.dataset.empty())
    note("warning: --dataset " + o.dataset + " is not used by --quant_algo " + plan.algorithms.Name());
  if (o.model_export != "gptq" && o.gptq_format != "v1")
    note("warning: --gptq_format " + o.gptq_format + " is used only by --model_export gptq");
  // Config entries that decide no layer (a mistyped exclude or override), before the first layer
  // is read. The plan lists lm_head also when a tied head kept in float writes none.
  std::vector<std::string> modules;
  for (const PlannedLinear& l : plan.linears) modules.push_back(l.module);
  NIBBLE_ASSIGN_OR_RETURN(std::vector<std::string> unused, UnusedConfigEntries(o.config, modules));
  for (const std::string& u : unused) note("warning: " + u);
  if (o.output_dir.empty()) return MakeError("--output_dir is empty");
  report.plan = PlanResources(plan, mc, store, PlanInputs(o, *format));
  if (o.on_plan) o.on_plan(report.plan);
  NIBBLE_RETURN_IF_ERROR(CheckResources(report.plan, o.max_memory));
  const bool resumable = o.resumable || o.resume;
  if (resumable) {
    NIBBLE_ASSIGN_OR_RETURN(rs.identity, RunIdentity(o, plan.algorithms.Calibrated()));
    rs.model_dir = o.model_dir;
    rs.num_layers = mc.num_hidden_layers;
  }
  NIBBLE_ASSIGN_OR_RETURN(CheckpointWriter out, o.resume ? ResumeWriter(o, store, rs, note) : NewWriter(o, resumable, note));
  // Input tensors written unchanged are read once: their pages go once their shard is written.
  out.SetAfterBorrowedWritten([&store](const uint8_t* p, size_t n) { store.Evict(p, n); });
  OrderedExport exp(o, store, ex, request.modules.size(), mc.num_hidden_layers, out, report);
  // RTN knows every output tensor up front: each is written once, at its place (no spool).
  if (std::optional<std::vector<TensorSlot>> layout = exp.Layout()) {
    const Status st = out.LayOut(std::move(*layout));
    if (!st.ok()) return o.resume ? st.error().WithContext("--resume: " + rs.staging) : st.error();
  }
  if (o.resume) {
    const Status st = exp.LoadState(rs.manifest.at("export"));
    if (!st.ok()) return st.error().WithContext("--resume: " + rs.staging);
  }
  CalibCheckpoint ck;
  if (resumable) NIBBLE_RETURN_IF_ERROR(SetUpBoundaries(o, plan.algorithms.Calibrated(), mc.hidden_size, rs, out, exp, ck));
  if (plan.algorithms.Calibrated())
    NIBBLE_RETURN_IF_ERROR(
        RunCalibratedExport(o, mc, store, ex, exp, request.config, report, note, resumable ? &ck : nullptr));
  NIBBLE_RETURN_IF_ERROR(exp.Finish());
  if (resumable) {  // past the last boundary: the rest is written whole or not at all
    RemoveResumeFiles(out.path());
    rs.layers_done = -1;
    out.KeepStaging(false);
  }
  NIBBLE_RETURN_IF_ERROR(out.Finish());
  report.shards = out.shards();
  report.total_bytes = out.total_bytes();
  report.quantization_config = writer->QuantizationConfig(request);
  config_json["quantization_config"] = report.quantization_config;
  // A quantized lm_head cannot stay tied to the float embedding (Transformers and vLLM would run
  // the embedding instead): the output is untied.
  if (plan.head_from_embedding) config_json["tie_word_embeddings"] = false;
  const std::string config_text = config_json.dump(2) + "\n";
  NIBBLE_RETURN_IF_ERROR(out.WriteFile("config.json", config_text));
  for (const auto& [file, text] : writer->ExtraFiles(request)) NIBBLE_RETURN_IF_ERROR(out.WriteFile(file, text));
  NIBBLE_ASSIGN_OR_RETURN(report.copied_files, out.CopyFiles(o.model_dir, CheckpointSideFiles(o.model_dir)));
  NIBBLE_RETURN_IF_ERROR(out.WriteModelCard(o.model_dir, QuantizeCardNote(o, *format, report)));
  NIBBLE_ASSIGN_OR_RETURN(std::vector<std::string> warnings,
                          OutputWarnings(o, *format, mc, store, proj.tied && !plan.head_from_embedding, config_text,
                                                         out.path(), report));
  NIBBLE_RETURN_IF_ERROR(CheckCancelled(o.cancel, "quantize before the output was committed"));
  NIBBLE_RETURN_IF_ERROR(out.Commit(o.overwrite));
  for (const std::string& w : warnings) note(w);
  report.memory = memory.Stop();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace

}  // namespace nibble
