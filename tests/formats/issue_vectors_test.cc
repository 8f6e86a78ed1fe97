// Vectors named in the Quark format requirements, checked bit for bit through the real code paths.
#include <gtest/gtest.h>

#include <cstring>

#include "formats/int4_matrix.h"
#include "formats/quark_config.h"
#include "formats/quark_pack.h"
#include "io/safetensors.h"

namespace nibble {
namespace {

TEST(IssueVectors, CodesZeroToSevenPackPerMethod) {
  const uint8_t codes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(PackNibbleWord(codes, PackMethod::kReorder), 0x75316420u);
  EXPECT_EQ(PackNibbleWord(codes, PackMethod::kOrder), 0x76543210u);
}

TensorToWrite I32(const std::string& name, std::vector<int64_t> shape, std::vector<uint32_t> words) {
  TensorToWrite t{name, DType::kI32, std::move(shape), std::vector<uint8_t>(words.size() * 4)};
  std::memcpy(t.bytes.data(), words.data(), t.bytes.size());
  return t;
}

// One input row (k = 0) of a K = 8, g = 8 layer with 4 outputs, `order` packing: the nibbles of
// outputs 0..3 sit at shifts 0, 4, 8, 12 of word [0][0]; scale 0.5 everywhere.
std::vector<float> DecodeRow0(QuantDType dtype, uint32_t word, uint32_t zero_word) {
  WeightQuantSpec spec;
  spec.dtype = dtype;
  spec.symmetric = dtype == QuantDType::kInt4;
  spec.group_size = 8;
  std::vector<uint32_t> w(8, 0);
  w[0] = word;
  TensorToWrite weight = I32("p.weight", {8, 1}, w);
  TensorToWrite zp = I32("p.weight_zero_point", {1, 1}, {zero_word});
  TensorToWrite scale{"p.weight_scale", DType::kF32, {1, 4}, std::vector<uint8_t>(16)};
  const float half[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  std::memcpy(scale.bytes.data(), half, 16);
  auto bytes = SerializeSafetensors({&weight, &scale, &zp}, {});
  EXPECT_TRUE(bytes.ok());
  auto h = ParseSafetensors(bytes->data(), bytes->size(), "test");
  EXPECT_TRUE(h.ok()) << h.error().message;
  QuarkLinearViews v{&h->tensors[0], &h->tensors[1], &h->tensors[2]};
  auto m = ImportQuarkLinear(v, "p", spec, PackMethod::kOrder, 4, 8);
  EXPECT_TRUE(m.ok()) << m.error().message;
  std::vector<float> deq(4 * 8);
  DequantizeRef(*m, deq.data());
  return {deq[0 * 8], deq[1 * 8], deq[2 * 8], deq[3 * 8]};
}

TEST(IssueVectors, SignedAndUnsignedNibblesDecodeToSameValues) {
  const std::vector<float> want = {-4.0f, -0.5f, 0.0f, 3.5f};
  // int4: nibbles [0x8, 0xF, 0x0, 0x7] (two's complement -8, -1, 0, 7), zero points 0.
  EXPECT_EQ(DecodeRow0(QuantDType::kInt4, 0x70F8u, 0x0u), want);
  // uint4: nibbles [0x0, 0x7, 0x8, 0xF] with zero point 8 for each output.
  EXPECT_EQ(DecodeRow0(QuantDType::kUint4, 0xF870u, 0x8888u), want);
}

TEST(IssueVectors, ExcludeGateAndLmHeadExactly) {
  QuarkQuantConfig c;
  c.global = WeightQuantSpec{};
  c.exclude = {"*mlp.gate", "lm_head"};
  const std::pair<const char*, bool> cases[] = {
      {"model.layers.0.mlp.gate", false},       {"lm_head", false},
      {"model.layers.0.mlp.gate_proj", true},   {"model.lm_head", true},
      {"model.layers.3.mlp.up_proj", true},     {"model.layers.0.mlp.gate.weight", true},
  };
  for (const auto& [name, quantized] : cases) {
    auto r = ResolveLayer(c, name);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->spec.has_value(), quantized) << name << " (" << r->rule << ")";
  }
}

}  // namespace
}  // namespace nibble
