#include "onnx/decoder_graph.h"

#include <cmath>
#include <mutex>
#include <optional>

#include <onnx/defs/schema.h>

#include "base/memory.h"
#include "formats/float_dtype.h"
#include "formats/matmul_nbits.h"
#include "model/decoder_layer.h"
#include "model/llama.h"
#include "model/model_loader.h"
#include "model/weights.h"

namespace nibble {

namespace {

constexpr const char* kMs = "com.microsoft";
constexpr const char* kSeqlensK = "/model/attn_mask_reformat/seqlens_k";
constexpr const char* kTotalSeqLen = "/model/attn_mask_reformat/total_seq_len";

int32_t ElemType(DType t) {
  return t == DType::kF16 ? onnx::TensorProto_DataType_FLOAT16 : onnx::TensorProto_DataType_FLOAT;
}

// Builds the graph node by node; weights go to the writer as each node is made.
class GraphBuilder {
 public:
  GraphBuilder(const ModelConfig& c, const TensorStore& s, const QuantizedFormat* f, const DecoderGraphOptions& o,
               OnnxWriter& w)
      : c_(c), store_(s), format_(f), o_(o), w_(w), io_(ElemType(o.io_dtype)) {}

  Result<DecoderGraphStats> Build();

 private:
  Status InputsAndMask();
  Status RopeCaches();
  Status Layer(int64_t i, std::string& hidden, std::string& residual);
  Status Mlp(const std::string& p, const std::string& x, const std::string& y);
  Status Head(const std::string& hidden, const std::string& residual);
  // y = module(x): MatMulNBits or MatMul, then the bias when the config gives the module one.
  Status Linear(const std::string& module, const std::string& x, const std::string& y);
  Status QuantMatMul(const std::string& module, const Int4Matrix& m, const std::string& x, const std::string& y);
  Status FloatMatMul(const std::string& module, const TensorView& weight, const std::string& x, const std::string& y);
  // A stored float tensor in the io dtype; `transpose` writes a [R, C] tensor as [C, R].
  Status WriteFloatTensor(const std::string& name, const TensorView& t, bool transpose);
  Status WriteFloats(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& v);
  // RMSNorm of `x` (plus `skip` when given, whose sum goes to `sum`) with weight tensor `weight`.
  Status Norm(const std::string& name, const std::string& weight, const std::string& x, const std::string& skip,
              const std::string& y, const std::string& sum);
  bool HasBias(const std::string& module) const;

  const ModelConfig& c_;
  const TensorStore& store_;
  const QuantizedFormat* format_;
  const DecoderGraphOptions& o_;
  OnnxWriter& w_;
  int32_t io_;
  DecoderGraphStats stats_;
};

Status GraphBuilder::WriteFloats(const std::string& name, const std::vector<int64_t>& shape,
                                 const std::vector<float>& v) {
  const size_t es = DTypeSize(o_.io_dtype);
  std::vector<uint8_t> bytes(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) StoreFloatAs(v[i], o_.io_dtype, bytes.data() + i * es);
  return w_.AddInitializer(name, io_, shape, bytes);
}

Status GraphBuilder::WriteFloatTensor(const std::string& name, const TensorView& t, bool transpose) {
  NIBBLE_RETURN_IF_ERROR(CheckFinite(t));
  const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = t.numel() / rows;
  const size_t in_es = DTypeSize(t.dtype), es = DTypeSize(o_.io_dtype);
  const int64_t out_rows = transpose ? cols : rows, out_cols = transpose ? rows : cols;
  NIBBLE_RETURN_IF_ERROR(
      w_.BeginInitializer(name, io_, transpose ? std::vector<int64_t>{cols, rows} : t.shape));
  std::vector<uint8_t> buf;
  for (int64_t r0 = 0; r0 < out_rows; r0 += 64) {  // 64 output rows at a time: bounded memory
    const int64_t r1 = std::min(out_rows, r0 + 64);
    buf.resize(static_cast<size_t>((r1 - r0) * out_cols) * es);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < out_cols; ++j) {
        const int64_t src = transpose ? j * cols + r : r * cols + j;
        const float v = LoadFloatAs(t.data + static_cast<size_t>(src) * in_es, t.dtype);
        StoreFloatAs(v, o_.io_dtype, buf.data() + static_cast<size_t>((r - r0) * out_cols + j) * es);
      }
    NIBBLE_RETURN_IF_ERROR(w_.Append(buf));
  }
  return w_.EndInitializer();
}

bool GraphBuilder::HasBias(const std::string& module) const {
  auto ends = [&](const char* s) { return module.ends_with(s); };
  if (ends("q_proj") || ends("k_proj") || ends("v_proj")) return c_.qkv_bias;
  if (ends("o_proj")) return c_.o_bias;
  if (ends("gate_proj") || ends("up_proj") || ends("down_proj")) return c_.mlp_bias;
  return false;
}

Status GraphBuilder::QuantMatMul(const std::string& module, const Int4Matrix& m, const std::string& x,
                                 const std::string& y) {
  NIBBLE_ASSIGN_OR_RETURN(MatMulNBitsWeight q, ToMatMulNBits(m, module));
  const std::string b = module + ".qweight", s = module + ".scales", z = module + ".qzeros";
  NIBBLE_RETURN_IF_ERROR(w_.AddInitializer(b, onnx::TensorProto_DataType_UINT8, {q.n, q.k_blocks, q.block_size / 2}, q.b));
  NIBBLE_RETURN_IF_ERROR(WriteFloats(s, {q.n, q.k_blocks}, q.scales));
  std::vector<std::string> inputs = {x, b, s};
  if (!q.zero_points.empty()) {
    NIBBLE_RETURN_IF_ERROR(
        w_.AddInitializer(z, onnx::TensorProto_DataType_UINT8, {q.n, (q.k_blocks + 1) / 2}, q.zero_points));
    inputs.push_back(z);
  }
  onnx::NodeProto& n = w_.AddNode("MatMulNBits", "/" + module + "/MatMulNBits", inputs, {y}, kMs);
  AttrInt(n, "K", q.k);
  AttrInt(n, "N", q.n);
  AttrInt(n, "bits", 4);
  AttrInt(n, "block_size", q.block_size);
  AttrInt(n, "accuracy_level", o_.accuracy_level);
  ++stats_.matmul_nbits;
  stats_.block_size[module] = q.block_size;
  return Status::Ok();
}

Status GraphBuilder::FloatMatMul(const std::string& module, const TensorView& weight, const std::string& x,
                                 const std::string& y) {
  const std::string name = module + ".MatMul.weight";
  NIBBLE_RETURN_IF_ERROR(WriteFloatTensor(name, weight, /*transpose=*/true));
  w_.AddNode("MatMul", "/" + module + "/MatMul", {x, name}, {y});
  ++stats_.matmul_float;
  return Status::Ok();
}

Status GraphBuilder::Linear(const std::string& module, const std::string& x, const std::string& y) {
  NIBBLE_RETURN_IF_ERROR(CheckCancelled(o_.cancel, "export-onnx at " + module));
  const auto [n, k] = LinearShape(c_, module);
  const bool bias = HasBias(module);
  const std::string mm = bias ? "/" + module + "/MatMul/output_0" : y;
  std::optional<Int4Matrix> q;
  if (format_) {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format_->Resolve(module));
    NIBBLE_ASSIGN_OR_RETURN(q, format_->Import(store_, module, plan, n, k));
  }
  if (q) {
    NIBBLE_RETURN_IF_ERROR(QuantMatMul(module, *q, x, mm));
  } else {
    NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, GetShaped(store_, module + ".weight", {n, k}));
    NIBBLE_RETURN_IF_ERROR(FloatMatMul(module, *t, x, mm));
  }
  if (!bias) return Status::Ok();
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* b, GetShaped(store_, module + ".bias", {n}));
  NIBBLE_RETURN_IF_ERROR(WriteFloatTensor(module + ".bias", *b, false));
  w_.AddNode("Add", "/" + module + "/Add", {mm, module + ".bias"}, {y});
  return Status::Ok();
}

Status GraphBuilder::Norm(const std::string& name, const std::string& weight, const std::string& x,
                          const std::string& skip, const std::string& y, const std::string& sum) {
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, GetShaped(store_, weight, {c_.hidden_size}));
  NIBBLE_RETURN_IF_ERROR(WriteFloatTensor(weight, *t, false));
  if (skip.empty()) {
    onnx::NodeProto& n = w_.AddNode("SimplifiedLayerNormalization", name, {x, weight}, {y});
    AttrInt(n, "axis", -1);
    AttrFloat(n, "epsilon", static_cast<float>(c_.rms_norm_eps));
    AttrInt(n, "stash_type", 1);
  } else {
    onnx::NodeProto& n = w_.AddNode("SkipSimplifiedLayerNormalization", name, {x, skip, weight}, {y, "", "", sum}, kMs);
    AttrFloat(n, "epsilon", static_cast<float>(c_.rms_norm_eps));
  }
  return Status::Ok();
}

Status GraphBuilder::InputsAndMask() {
  const int32_t i64 = onnx::TensorProto_DataType_INT64, i32 = onnx::TensorProto_DataType_INT32;
  const std::string kv = std::to_string(c_.num_key_value_heads), hs = std::to_string(c_.head_dim);
  w_.AddInput("input_ids", i64, {"batch_size", "sequence_length"});
  w_.AddInput("attention_mask", i64, {"batch_size", "total_sequence_length"});
  for (int64_t i = 0; i < c_.num_hidden_layers; ++i)
    for (const char* kind : {"key", "value"})
      w_.AddInput("past_key_values." + std::to_string(i) + "." + kind, io_,
                  {"batch_size", kv, "past_sequence_length", hs});
  w_.AddOutput("logits", io_, {"batch_size", "sequence_length", std::to_string(c_.vocab_size)});
  for (int64_t i = 0; i < c_.num_hidden_layers; ++i)
    for (const char* kind : {"key", "value"})
      w_.AddOutput("present." + std::to_string(i) + "." + kind, io_, {"batch_size", kv, "total_sequence_length", hs});
  // seqlens_k = ReduceSum(attention_mask, axis 1) - 1; total_seq_len = shape(attention_mask)[1].
  const std::string base = "/model/attn_mask_reformat/";
  w_.AddInlineInt64("/model/constants/INT64/[1]", {1}, {1});
  w_.AddInlineInt64("/model/constants/INT64/1", {}, {1});
  onnx::NodeProto& sum = w_.AddNode("ReduceSum", base + "ReduceSum", {"attention_mask", "/model/constants/INT64/[1]"},
                                    {base + "ReduceSum/output_0"});
  AttrInt(sum, "keepdims", 0);
  w_.AddNode("Sub", base + "Sub", {base + "ReduceSum/output_0", "/model/constants/INT64/1"}, {base + "Sub/output_0"});
  AttrInt(w_.AddNode("Cast", base + "Sub/Cast", {base + "Sub/output_0"}, {kSeqlensK}), "to", i32);
  w_.AddNode("Shape", base + "Shape", {"attention_mask"}, {base + "Shape/output_0"});
  AttrInt(w_.AddNode("Gather", base + "Gather", {base + "Shape/output_0", "/model/constants/INT64/1"},
                     {base + "Gather/output_0"}),
          "axis", 0);
  AttrInt(w_.AddNode("Cast", base + "Gather/Cast", {base + "Gather/output_0"}, {kTotalSeqLen}), "to", i32);
  return Status::Ok();
}

Status GraphBuilder::RopeCaches() {
  const RopeTables rope = BuildRopeTables(c_, c_.max_position_embeddings);
  NIBBLE_RETURN_IF_ERROR(WriteFloats("cos_cache", {c_.max_position_embeddings, rope.half}, rope.cos));
  return WriteFloats("sin_cache", {c_.max_position_embeddings, rope.half}, rope.sin);
}

Status GraphBuilder::Mlp(const std::string& p, const std::string& x, const std::string& y) {
  const std::string m = "/" + p + "mlp/";
  NIBBLE_RETURN_IF_ERROR(Linear(p + "mlp.gate_proj", x, m + "gate/output_0"));
  NIBBLE_RETURN_IF_ERROR(Linear(p + "mlp.up_proj", x, m + "up/output_0"));
  w_.AddNode("Sigmoid", m + "act/Sigmoid", {m + "gate/output_0"}, {m + "act/Sigmoid/output_0"});
  w_.AddNode("Mul", m + "act/Mul", {m + "gate/output_0", m + "act/Sigmoid/output_0"}, {m + "act/output_0"});
  w_.AddNode("Mul", m + "Mul", {m + "act/output_0", m + "up/output_0"}, {m + "Mul/output_0"});
  return Linear(p + "mlp.down_proj", m + "Mul/output_0", y);
}

// `hidden` is the previous block's output (layer 0: the embeddings) and `residual` the residual
// stream before it ("" for layer 0); both are advanced past this layer.
Status GraphBuilder::Layer(int64_t i, std::string& hidden, std::string& residual) {
  const std::string p = "model.layers." + std::to_string(i) + ".", g = "/" + p;
  const std::string n1 = g + "input_layernorm/output_0", r1 = residual.empty() ? hidden : g + "input_layernorm/sum";
  NIBBLE_RETURN_IF_ERROR(Norm(g + "input_layernorm", p + "input_layernorm.weight", hidden, residual, n1,
                              residual.empty() ? "" : r1));
  const std::string a = g + "attn/";
  for (const char* proj : {"q_proj", "k_proj", "v_proj"})
    NIBBLE_RETURN_IF_ERROR(Linear(p + "self_attn." + proj, n1, a + proj + "/output_0"));
  const std::string past = "past_key_values." + std::to_string(i), present = "present." + std::to_string(i);
  onnx::NodeProto& gqa = w_.AddNode(
      "GroupQueryAttention", a + "GroupQueryAttention",
      {a + "q_proj/output_0", a + "k_proj/output_0", a + "v_proj/output_0", past + ".key", past + ".value", kSeqlensK,
       kTotalSeqLen, "cos_cache", "sin_cache"},
      {a + "GroupQueryAttention/output_0", present + ".key", present + ".value"}, kMs);
  AttrInt(gqa, "num_heads", c_.num_attention_heads);
  AttrInt(gqa, "kv_num_heads", c_.num_key_value_heads);
  AttrFloat(gqa, "scale", static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim))));
  AttrInt(gqa, "local_window_size", c_.sliding_window > 0 ? c_.sliding_window : -1);
  AttrInt(gqa, "do_rotary", 1);
  AttrInt(gqa, "rotary_interleaved", 0);
  NIBBLE_RETURN_IF_ERROR(Linear(p + "self_attn.o_proj", a + "GroupQueryAttention/output_0", a + "o_proj/output_0"));
  const std::string n2 = g + "post_attention_layernorm/output_0", r2 = g + "post_attention_layernorm/sum";
  NIBBLE_RETURN_IF_ERROR(Norm(g + "post_attention_layernorm", p + "post_attention_layernorm.weight",
                              a + "o_proj/output_0", r1, n2, r2));
  hidden = g + "mlp/output_0";
  residual = r2;
  return Mlp(p, n2, hidden);
}

Status GraphBuilder::Head(const std::string& hidden, const std::string& residual) {
  NIBBLE_RETURN_IF_ERROR(Norm("/model/norm", "model.norm.weight", hidden, residual, "/model/norm/output_0",
                              "/model/norm/sum"));
  NIBBLE_ASSIGN_OR_RETURN(const OutputProjection proj, FindOutputProjection(c_, store_));
  if (proj.ReadsHeadModule()) return Linear("lm_head", "/model/norm/output_0", "logits");
  // Tied: the embedding is the output projection, as Transformers, vLLM and nibble use it.
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* e, GetShaped(store_, proj.FloatTensor(), {c_.vocab_size, c_.hidden_size}));
  return FloatMatMul("lm_head", *e, "/model/norm/output_0", "logits");
}

Result<DecoderGraphStats> GraphBuilder::Build() {
  onnx::ModelProto& m = w_.model();
  m.set_ir_version(8);
  m.set_producer_name("nibble");
  onnx::OperatorSetIdProto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  op = m.add_opset_import();
  op->set_domain(kMs);
  op->set_version(1);
  w_.graph().set_name("main_graph");
  NIBBLE_RETURN_IF_ERROR(InputsAndMask());
  NIBBLE_RETURN_IF_ERROR(RopeCaches());
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* e,
                          GetShaped(store_, "model.embed_tokens.weight", {c_.vocab_size, c_.hidden_size}));
  NIBBLE_RETURN_IF_ERROR(WriteFloatTensor("model.embed_tokens.weight", *e, false));
  std::string hidden = "/model/embed_tokens/Gather/output_0", residual;
  w_.AddNode("Gather", "/model/embed_tokens/Gather", {"model.embed_tokens.weight", "input_ids"}, {hidden});
  for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
    NIBBLE_RETURN_IF_ERROR(CheckCancelled(o_.cancel, "export-onnx at layer " + std::to_string(i + 1) + " of " +
                                                         std::to_string(c_.num_hidden_layers)));
    NIBBLE_RETURN_IF_ERROR(Layer(i, hidden, residual));
  }
  NIBBLE_RETURN_IF_ERROR(Head(hidden, residual));
  return stats_;
}

}  // namespace

Status CheckDecoderGraph(const ModelConfig& c, const QuantizedFormat* format, const DecoderGraphOptions& o) {
  if (o.io_dtype != DType::kF32 && o.io_dtype != DType::kF16)
    return MakeErrorCode(ErrorCode::kUnsupported, "--io_dtype ", DTypeName(o.io_dtype),
                         ": the CPU execution provider's GroupQueryAttention and MatMulNBits kernels take fp32 or fp16");
  if (o.accuracy_level < 0 || o.accuracy_level > 4)
    return MakeError("--accuracy_level ", o.accuracy_level, ": expected 0, 1, 2, 3 or 4");
  if (c.head_dim % 2 != 0)
    return MakeErrorCode(ErrorCode::kUnsupported, "config.json head_dim ", c.head_dim,
                         " is odd: GroupQueryAttention's rotary needs an even head size");
  // GroupQueryAttention applies its rotary to the projections as they come; Qwen3 norms each head
  // of q and k first, which this graph does not express.
  if (c.qk_norm)
    return MakeErrorCode(ErrorCode::kUnsupported, "model_type ", c.model_type, " (", c.architecture,
                         "): the ONNX export does not support Qwen3's per-head q_norm / k_norm before the rotary");
  // cos_cache / sin_cache cover every position GroupQueryAttention may see (as ORT GenAI's builder
  // writes them); both are built in memory before they are written.
  NIBBLE_RETURN_IF_ERROR(CheckMemoryFor(4.0 * static_cast<double>(c.max_position_embeddings) * static_cast<double>(c.head_dim),
                                        c.path + ": the rotary cos/sin caches of max_position_embeddings " +
                                            std::to_string(c.max_position_embeddings) + " x head_dim / 2 " +
                                            std::to_string(c.head_dim / 2)));
  if (!format) return Status::Ok();
  for (const std::string& module : LinearModuleNames(c, true)) {
    NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, format->Resolve(module));
    if (!plan.spec) continue;
    const auto [n, k] = LinearShape(c, module);
    Int4Matrix shape_only;
    shape_only.n = n;
    shape_only.k = k;
    shape_only.group_size = plan.spec->EffectiveGroupSize(k);
    NIBBLE_RETURN_IF_ERROR(MatMulNBitsBlockSize(shape_only, module));
  }
  return Status::Ok();
}

Result<DecoderGraphStats> WriteDecoderGraph(const ModelConfig& c, const TensorStore& store,
                                            const QuantizedFormat* format, const DecoderGraphOptions& o,
                                            OnnxWriter& w) {
  NIBBLE_RETURN_IF_ERROR(CheckDecoderGraph(c, format, o));
  return GraphBuilder(c, store, format, o, w).Build();
}

void RegisterContribSchemasForChecker() {
  static std::once_flag once;
  std::call_once(once, [] {
    onnx::OpSchema s;
    s.SetName("SimplifiedLayerNormalization")
        .SetDomain("")
        .SinceVersion(1)
        .Attr("axis", "normalized axes start", onnx::AttributeProto::INT, static_cast<int64_t>(-1))
        .Attr("epsilon", "added to the mean square", onnx::AttributeProto::FLOAT, 1e-5f)
        .Attr("stash_type", "type of the statistics", onnx::AttributeProto::INT, static_cast<int64_t>(1))
        .Input(0, "X", "input", "T")
        .Input(1, "scale", "weight", "V")
        .Output(0, "Y", "normalized", "V")
        .Output(1, "inv_std_var", "statistics", "U", onnx::OpSchema::Optional)
        .TypeConstraint("T", {"tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"}, "input")
        .TypeConstraint("U", {"tensor(float)", "tensor(double)"}, "statistics")
        .TypeConstraint("V", {"tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"}, "output");
    onnx::RegisterSchema(std::move(s));
  });
}

}  // namespace nibble
