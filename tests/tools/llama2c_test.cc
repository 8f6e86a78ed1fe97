// The llama2.c files `nibble synth --llama2c` writes for llama.cpp's converter: the header, the
// stacked-array offsets and the vocab entries, read back here with the layout written out
// independently of tools/support/llama2c.cc, against the dense checkpoint's own tensors.
#include "support/llama2c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>

#include "base/half.h"
#include "io/safetensors.h"
#include "support/bench.h"
#include "test_paths.h"
#include "test_util.h"

namespace nibble {
namespace {

constexpr const char* kConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "vocab_size": 4100, "max_position_embeddings": 32, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false, %EXTRA%
  "bos_token_id": 1, "eos_token_id": 2})";

std::string Config(const std::string& extra) {
  std::string c = kConfig;
  c.replace(c.find("%EXTRA%"), 7, extra);
  return c;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

float At(const std::string& bytes, int64_t float_index) {
  float v;
  std::memcpy(&v, bytes.data() + 28 + float_index * 4, 4);
  return v;
}

float Tensor(const TensorStore& s, const std::string& name, int64_t i) {
  const TensorView* t = s.Find(name);
  EXPECT_NE(t, nullptr) << name;
  return t == nullptr ? 0.f : Bf16ToF32(reinterpret_cast<const uint16_t*>(t->data)[i]);
}

TEST(Llama2c, WritesTheLayoutLlamaCppReads) {
  nibble_test::TempDir tmp;
  SynthRequest q;
  q.config_path = tmp.Write("config.json", Config(""));
  q.out_dir = tmp.sub("dense");
  q.format = "dense";
  q.tokenizer_dir = nibble_test::EmbeddedModel();
  ASSERT_TRUE(WriteSyntheticCheckpoint(q).ok());
  const Status st = WriteLlama2c(q.out_dir, tmp.sub("m.bin"), tmp.sub("v.bin"));
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto store = TensorStore::OpenDir(q.out_dir);
  ASSERT_TRUE(store.ok());

  const std::string m = ReadAll(tmp.sub("m.bin"));
  int32_t h[7];
  std::memcpy(h, m.data(), sizeof(h));
  EXPECT_EQ(std::vector<int32_t>(h, h + 7), (std::vector<int32_t>{64, 96, 2, 4, 2, -4100, 32}));
  const int64_t d = 64, f = 96, kv = 32, v = 4100, l = 2, head = 16;
  const int64_t emb = v * d, norms = l * d, q_all = l * d * d, kv_all = l * kv * d, ffn = l * f * d;
  const int64_t total = emb + norms + q_all + 2 * kv_all + q_all + norms + 3 * ffn + d + 32 * head + v * d;
  ASSERT_EQ(static_cast<int64_t>(m.size()), 28 + total * 4);
  // Spot checks at the start of stacked arrays and inside layer 1.
  EXPECT_EQ(At(m, 7), Tensor(*store, "model.embed_tokens.weight", 7));
  const int64_t k_at = emb + norms + q_all;  // k_proj of layer 0
  EXPECT_EQ(At(m, k_at + kv * d + 5), Tensor(*store, "model.layers.1.self_attn.k_proj.weight", 5));
  const int64_t down_at = k_at + 2 * kv_all + q_all + norms + ffn;  // down_proj of layer 0
  EXPECT_EQ(At(m, down_at + d * f + 95), Tensor(*store, "model.layers.1.mlp.down_proj.weight", 95));
  EXPECT_EQ(At(m, total - 1), Tensor(*store, "lm_head.weight", v * d - 1));
  EXPECT_NE(At(m, total - 1), 0.f);

  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(nibble_test::EmbeddedModel() + "/tokenizer.model").ok());
  const std::string vb = ReadAll(tmp.sub("v.bin"));
  size_t at = 4;
  std::vector<std::string> pieces;
  while (at + 8 <= vb.size()) {
    uint32_t len;
    std::memcpy(&len, vb.data() + at + 4, 4);
    pieces.push_back(vb.substr(at + 8, len));
    at += 8 + len;
  }
  EXPECT_EQ(at, vb.size());
  ASSERT_EQ(pieces.size(), 4100u);
  std::string p300 = sp.IdToPiece(300);
  for (size_t i; (i = p300.find("\xE2\x96\x81")) != std::string::npos;) p300.replace(i, 3, " ");
  EXPECT_EQ(pieces[300], p300);
  EXPECT_EQ(pieces[4099], "<extra_4099>");
}

TEST(Llama2c, RefusesWhatTheFormatCannotCarry) {
  nibble_test::TempDir tmp;
  SynthRequest q;
  q.config_path = tmp.Write("config.json", Config("\"head_dim\": 32,"));
  q.out_dir = tmp.sub("dense");
  q.format = "dense";
  q.tokenizer_dir = nibble_test::EmbeddedModel();
  ASSERT_TRUE(WriteSyntheticCheckpoint(q).ok());
  const Status st = WriteLlama2c(q.out_dir, tmp.sub("m.bin"), tmp.sub("v.bin"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("head_dim 32"), std::string::npos) << st.error().message;
  EXPECT_FALSE(std::ifstream(tmp.sub("m.bin")).good());
}

}  // namespace
}  // namespace nibble
