// A small random Llama-family checkpoint for tests that need a model of a chosen shape:
// config.json + model.safetensors (+ a tokenizer.model copied from another model). The caller
// draws the values through a fill callback; the tensor order (TinyOrder) is the order fill is
// called in, so together with the caller's seed it fixes which random values each tensor gets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nibble/quantize.h>
#include <nlohmann/json.hpp>

#include "formats/float_dtype.h"
#include "io/safetensors.h"
#include "test_paths.h"

namespace nibble_test {

/// The model's shape and its HF config.json fields (Llama, Mistral, Qwen2, Qwen3).
struct TinyLlamaSpec {
  std::string model_type = "llama";
  std::string architecture = "LlamaForCausalLM";
  int64_t hidden = 64, inter = 128, layers = 2, heads = 8, kv_heads = 2;
  int64_t head_dim = 8;         // q/k/v width per head
  bool write_head_dim = false;  // config "head_dim" (else implied: hidden / heads)
  int64_t vocab = 512, max_pos = 256;
  double eps = 1e-5, theta = 10000.0;
  // Bias tensors written. config.json says attention_bias = qkv_bias (Llama: q/k/v/o biases;
  // Qwen2 always has q/k/v biases and no o bias) and mlp_bias.
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  bool tie = false;  // tie_word_embeddings, and no lm_head.weight
  bool qk_norm = false;  // self_attn.q_norm / k_norm.weight [head_dim] written (Qwen3)
  nibble::DType dtype = nibble::DType::kF16;
  nlohmann::json extra = nlohmann::json::object();  // merged into config.json
};

inline nlohmann::json TinyLlamaConfig(const TinyLlamaSpec& s) {
  const nibble::DType dt = s.dtype;
  nlohmann::json j = {{"architectures", {s.architecture}},
                      {"model_type", s.model_type},
                      {"hidden_size", s.hidden},
                      {"intermediate_size", s.inter},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"vocab_size", s.vocab},
                      {"max_position_embeddings", s.max_pos},
                      {"rms_norm_eps", s.eps},
                      {"rope_theta", s.theta},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", s.tie},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2},
                      {"torch_dtype", dt == nibble::DType::kF32 ? "float32" : dt == nibble::DType::kBF16 ? "bfloat16" : "float16"}};
  if (s.write_head_dim) j["head_dim"] = s.head_dim;
  if (s.model_type != "qwen2") j["attention_bias"] = s.qkv_bias;
  if (s.mlp_bias) j["mlp_bias"] = true;
  j.merge_patch(s.extra);
  return j;
}

/// What a tensor is, for the fill callback's choice of distribution (kLinear includes lm_head).
enum class TinyRole { kEmbedding, kNorm, kQueryKey, kLinear, kBias };

struct TinyTensor {
  std::string name;
  std::vector<int64_t> shape;
  TinyRole role;
};

/// kHf: embeddings; per layer input norm, q/k/v/o (+ biases), post-attention norm, MLP (+ biases);
/// final norm, lm_head. kNormsFirst: embeddings, final norm, lm_head; per layer both norms, then
/// q/k/v/o and the MLP.
enum class TinyOrder { kHf, kNormsFirst };

inline std::vector<TinyTensor> TinyLlamaTensorList(const TinyLlamaSpec& s, TinyOrder order) {
  using R = TinyRole;
  const int64_t q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
  std::vector<TinyTensor> out = {{"model.embed_tokens.weight", {s.vocab, s.hidden}, R::kEmbedding}};
  auto head = [&] {
    out.push_back({"model.norm.weight", {s.hidden}, R::kNorm});
    if (!s.tie) out.push_back({"lm_head.weight", {s.vocab, s.hidden}, R::kLinear});
  };
  if (order == TinyOrder::kNormsFirst) head();
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const TinyTensor in_norm{p + "input_layernorm.weight", {s.hidden}, R::kNorm};
    const TinyTensor post_norm{p + "post_attention_layernorm.weight", {s.hidden}, R::kNorm};
    std::vector<TinyTensor> attn = {{p + "self_attn.q_proj.weight", {q_dim, s.hidden}, R::kQueryKey},
                                    {p + "self_attn.k_proj.weight", {kv_dim, s.hidden}, R::kQueryKey},
                                    {p + "self_attn.v_proj.weight", {kv_dim, s.hidden}, R::kLinear},
                                    {p + "self_attn.o_proj.weight", {s.hidden, q_dim}, R::kLinear}};
    if (s.qkv_bias)
      attn.insert(attn.end(), {{p + "self_attn.q_proj.bias", {q_dim}, R::kBias},
                               {p + "self_attn.k_proj.bias", {kv_dim}, R::kBias},
                               {p + "self_attn.v_proj.bias", {kv_dim}, R::kBias}});
    if (s.o_bias) attn.push_back({p + "self_attn.o_proj.bias", {s.hidden}, R::kBias});
    if (s.qk_norm)
      attn.insert(attn.end(), {{p + "self_attn.q_norm.weight", {s.head_dim}, R::kNorm},
                               {p + "self_attn.k_norm.weight", {s.head_dim}, R::kNorm}});
    std::vector<TinyTensor> mlp = {{p + "mlp.gate_proj.weight", {s.inter, s.hidden}, R::kLinear},
                                   {p + "mlp.up_proj.weight", {s.inter, s.hidden}, R::kLinear},
                                   {p + "mlp.down_proj.weight", {s.hidden, s.inter}, R::kLinear}};
    if (s.mlp_bias)
      mlp.insert(mlp.end(), {{p + "mlp.gate_proj.bias", {s.inter}, R::kBias},
                             {p + "mlp.up_proj.bias", {s.inter}, R::kBias},
                             {p + "mlp.down_proj.bias", {s.hidden}, R::kBias}});
    if (order == TinyOrder::kNormsFirst) {
      out.insert(out.end(), {in_norm, post_norm});
      out.insert(out.end(), attn.begin(), attn.end());
    } else {
      out.push_back(in_norm);
      out.insert(out.end(), attn.begin(), attn.end());
      out.push_back(post_norm);
    }
    out.insert(out.end(), mlp.begin(), mlp.end());
  }
  if (order == TinyOrder::kHf) head();
  return out;
}

/// Sets every value of one tensor (`values` has its element count); called in TinyOrder order.
using TinyFill = std::function<void(const TinyTensor& tensor, std::vector<float>& values)>;

/// The tensors of `s` in `order`, filled by `fill` and stored as s.dtype (rounded to nearest).
inline std::vector<nibble::TensorToWrite> TinyLlamaTensors(const TinyLlamaSpec& s, TinyOrder order, const TinyFill& fill) {
  std::vector<nibble::TensorToWrite> ts;
  const size_t es = nibble::DTypeSize(s.dtype);
  for (const TinyTensor& t : TinyLlamaTensorList(s, order)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    fill(t, v);
    nibble::TensorToWrite w{t.name, s.dtype, t.shape, std::vector<uint8_t>(v.size() * es)};
    for (size_t i = 0; i < v.size(); ++i) nibble::StoreFloatAs(v[i], s.dtype, w.bytes.data() + i * es);
    ts.push_back(std::move(w));
  }
  return ts;
}

/// Writes `config` as dir/config.json, `tensors` as dir/model.safetensors (in their order) and,
/// when `tokenizer_from` is a model directory, copies its tokenizer.model. Creates `dir`.
inline void WriteTinyLlama(const std::string& dir, const nlohmann::json& config,
                           const std::vector<nibble::TensorToWrite>& tensors, const std::string& tokenizer_from = "") {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  if (!tokenizer_from.empty())
    std::filesystem::copy_file(tokenizer_from + "/tokenizer.model", dir + "/tokenizer.model",
                               std::filesystem::copy_options::overwrite_existing);
  std::vector<const nibble::TensorToWrite*> ptrs;
  for (const auto& t : tensors) ptrs.push_back(&t);
  const nibble::Status st = nibble::WriteSafetensors(dir + "/model.safetensors", ptrs, {{"format", "pt"}});
  ASSERT_TRUE(st.ok()) << st.error().message;
}

/// A tiny random Llama of shape `s` (N(0, 0.1) linears, N(0, 1) embedding, norms 1 + N(0, 0.05);
/// seed 7, norms first) with stories260K's tokenizer unless `tokenizer` is false; `edit(name,
/// values)` may change a tensor before writing.
inline void WriteTinyModel(const std::string& dir, const TinyLlamaSpec& s,
                           const std::function<void(const std::string&, std::vector<float>&)>& edit = nullptr,
                           bool tokenizer = true) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](const TinyTensor& t, std::vector<float>& v) {
    const float stddev = t.role == TinyRole::kEmbedding ? 1.0f : t.role == TinyRole::kNorm ? 0.05f : 0.1f;
    const float mean = t.role == TinyRole::kNorm ? 1.0f : 0.0f;
    for (auto& x : v) x = mean + stddev * nd(rng);
    if (edit) edit(t.name, v);
  };
  WriteTinyLlama(dir, TinyLlamaConfig(s), TinyLlamaTensors(s, TinyOrder::kNormsFirst, fill),
                 tokenizer ? SharedModel("stories260K") : "");
}

/// Calibration text for tiny models: the first 60000 bytes of tinyshakespeare written to `path`
/// (a few thousand tokens); returns `path`.
inline std::string TinyCalibFile(const std::string& path) {
  std::ifstream in(SharedData("tinyshakespeare.txt"), std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::binary) << text.substr(0, 60000);
  return path;
}

/// A calibrated quantize request sized for tiny models: uint4 asym g32, 4 chunks of 64 tokens.
inline nibble::QuantizeRequest TinyCalibRequest(const std::string& algo, const std::string& model, const std::string& out,
                                                const std::string& calib) {
  nibble::QuantizeRequest r;
  r.model_dir = model;
  r.output_dir = out;
  r.quant_algo = algo;
  r.quant_scheme = "w_uint4_per_group_asym";
  r.group_size = 32;
  r.dataset = calib;
  r.num_calib_data = 4;
  r.seq_len = 64;
  r.overwrite = true;
  return r;
}

/// Every file of `dir` (not recursive): name -> bytes.
inline std::map<std::string, std::string> DirBytes(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    m[e.path().filename().string()] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return m;
}

}  // namespace nibble_test
