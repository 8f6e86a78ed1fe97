#include "support/llama2c.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <sentencepiece_processor.h>

#include "base/half.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace nibble {
namespace {

// The config keys llama2.c's header cannot carry (llama.cpp's converter assumes rope_theta 10000
// and rms_norm_eps 1e-5); each refusal names the key and the value found.
Status CheckExpressible(const ModelConfig& c, const std::string& path) {
  if (c.head_dim * c.num_attention_heads != c.hidden_size)
    return MakeError(path, ": head_dim ", c.head_dim, " x num_attention_heads ", c.num_attention_heads,
                     " != hidden_size ", c.hidden_size, " (llama2.c has no separate head_dim)");
  if (c.qkv_bias || c.o_bias || c.mlp_bias) return MakeError(path, ": linear biases (llama2.c has none)");
  if (c.rope_scaling.type != RopeScaling::Type::kNone) return MakeError(path, ": rope_scaling (llama2.c has none)");
  if (c.rope_theta != 10000.0) return MakeError(path, ": rope_theta ", c.rope_theta, " (llama2.c assumes 10000)");
  if (c.rms_norm_eps != 1e-5) return MakeError(path, ": rms_norm_eps ", c.rms_norm_eps, " (llama2.c assumes 1e-5)");
  return Status::Ok();
}

// Appends tensor `name` as fp32 after checking its shape.
Status AppendF32(const TensorStore& store, const std::string& name, const std::vector<int64_t>& shape,
                 AtomicFileWriter& out) {
  NIBBLE_ASSIGN_OR_RETURN(const TensorView* t, store.Get(name));
  if (t->shape != shape)
    return MakeError(t->file, ": tensor ", name, ": expected shape ", ShapeToString(shape), ", found ", t->ShapeString());
  const int64_t n = t->numel();
  std::vector<float> v(static_cast<size_t>(n));
  const auto* h = reinterpret_cast<const uint16_t*>(t->data);
  switch (t->dtype) {
    case DType::kF32: std::copy_n(reinterpret_cast<const float*>(t->data), n, v.data()); break;
    case DType::kBF16: for (int64_t i = 0; i < n; ++i) v[i] = Bf16ToF32(h[i]); break;
    case DType::kF16: for (int64_t i = 0; i < n; ++i) v[i] = F16ToF32(h[i]); break;
    default: return MakeError(t->file, ": tensor ", name, ": expected F32, F16 or BF16");
  }
  return out.Write(v.data(), v.size() * sizeof(float));
}

Status WriteModel(const TensorStore& store, const ModelConfig& c, const std::string& path) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Open(path));
  const int64_t d = c.hidden_size, f = c.intermediate_size, kv = c.num_key_value_heads * c.head_dim;
  const int64_t v = c.vocab_size, seq = c.max_position_embeddings;
  const int32_t header[7] = {int32_t(d), int32_t(f), int32_t(c.num_hidden_layers), int32_t(c.num_attention_heads),
                             int32_t(c.num_key_value_heads), int32_t(c.tie_word_embeddings ? v : -v), int32_t(seq)};
  NIBBLE_RETURN_IF_ERROR(out->Write(header, sizeof(header)));
  NIBBLE_RETURN_IF_ERROR(AppendF32(store, "model.embed_tokens.weight", {v, d}, *out));
  // One stacked array per kind: every layer's tensor of that kind, in layer order.
  const std::pair<const char*, std::vector<int64_t>> kinds[] = {
      {"input_layernorm", {d}},     {"self_attn.q_proj", {d, d}},         {"self_attn.k_proj", {kv, d}},
      {"self_attn.v_proj", {kv, d}}, {"self_attn.o_proj", {d, d}},         {"post_attention_layernorm", {d}},
      {"mlp.gate_proj", {f, d}},    {"mlp.down_proj", {d, f}},            {"mlp.up_proj", {f, d}}};
  for (const auto& [kind, shape] : kinds)
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      NIBBLE_RETURN_IF_ERROR(
          AppendF32(store, "model.layers." + std::to_string(l) + "." + kind + ".weight", shape, *out));
  NIBBLE_RETURN_IF_ERROR(AppendF32(store, "model.norm.weight", {d}, *out));
  const std::vector<float> rope_tables(static_cast<size_t>(seq * c.head_dim), 0.f);
  NIBBLE_RETURN_IF_ERROR(out->Write(rope_tables.data(), rope_tables.size() * sizeof(float)));
  if (!c.tie_word_embeddings) NIBBLE_RETURN_IF_ERROR(AppendF32(store, "lm_head.weight", {v, d}, *out));
  return out->Commit();
}

Status WriteVocab(const std::string& dir, int64_t vocab_size, const std::string& path) {
  const std::string model = JoinPath(dir, "tokenizer.model");
  sentencepiece::SentencePieceProcessor sp;
  if (const auto st = sp.Load(model); !st.ok()) return MakeError(model, ": ", st.ToString());
  if (sp.GetPieceSize() > vocab_size)
    return MakeError(model, ": ", sp.GetPieceSize(), " pieces, more than vocab_size ", vocab_size);
  std::vector<std::string> pieces;
  std::vector<float> scores;
  for (int64_t id = 0; id < vocab_size; ++id) {
    std::string p = id < sp.GetPieceSize() ? sp.IdToPiece(int(id)) : "<extra_" + std::to_string(id) + ">";
    for (size_t at; (at = p.find("\xE2\x96\x81")) != std::string::npos;) p.replace(at, 3, " ");
    scores.push_back(id < sp.GetPieceSize() ? sp.GetScore(int(id)) : 0.f);
    pieces.push_back(std::move(p));
  }
  std::string bytes;
  uint32_t longest = 0;
  for (const std::string& p : pieces) longest = std::max(longest, uint32_t(p.size()));
  bytes.append(reinterpret_cast<const char*>(&longest), 4);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const uint32_t len = uint32_t(pieces[i].size());
    bytes.append(reinterpret_cast<const char*>(&scores[i]), 4);
    bytes.append(reinterpret_cast<const char*>(&len), 4);
    bytes += pieces[i];
  }
  return WriteFileAtomic(path, bytes.data(), bytes.size());
}

}  // namespace

Status WriteLlama2c(const std::string& dense_dir, const std::string& model_path, const std::string& vocab_path) {
  NIBBLE_ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(dense_dir));
  NIBBLE_RETURN_IF_ERROR(CheckExpressible(c, JoinPath(dense_dir, "config.json")));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dense_dir));
  NIBBLE_RETURN_IF_ERROR(WriteModel(store, c, model_path));
  return WriteVocab(dense_dir, c.vocab_size, vocab_path);
}

}  // namespace nibble
