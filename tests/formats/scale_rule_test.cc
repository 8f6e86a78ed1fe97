// One rule for stored scales in every format's reader (IsValidScale: finite and >= 0): each
// registered format writes a small module, one scale is replaced on disk, and the reader must
// refuse a negative, NaN or infinite scale with the same wording, naming the tensor, and accept 0.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/checkpoint_format.h"
#include "formats/float_dtype.h"
#include "io/safetensors.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
const std::string kRuleModule = "model.layers.0.mlp.up_proj";

// [8, 16], group 8, codes and zero points in range, every scale 0.25.
Int4Matrix RuleMatrix() {
  Int4Matrix m;
  m.n = 8;
  m.k = 16;
  m.group_size = 8;
  m.codes.resize(8 * 16);
  for (size_t i = 0; i < m.codes.size(); ++i) m.codes[i] = static_cast<uint8_t>(i % 16);
  m.scales.assign(16, 0.25f);
  m.zero_points.assign(16, 5);
  return m;
}

ExportRequest RuleRequest() {
  ExportRequest r;
  WeightQuantSpec s;
  s.dtype = QuantDType::kUint4;
  s.symmetric = false;
  s.group_size = 8;
  r.config.global = s;
  r.gptq_format = "v2";  // v1 cannot hold every zero point
  return r;
}

// The module written by `entry` with scale `index` (in the stored tensor's order) set to `value`,
// then read back through the registry.
Result<std::optional<Int4Matrix>> WriteEditRead(const FormatEntry& entry, float value, std::string* scale_name) {
  const ExportRequest request = RuleRequest();
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<FormatWriter> w, entry.writer(request));
  QuantSpec spec;
  spec.group_size = 8;
  spec.symmetric = false;
  NIBBLE_ASSIGN_OR_RETURN(std::vector<TensorToWrite> ts,
                          w->WriteLinear(kRuleModule, RuleMatrix(), spec, w->ScaleDType().value_or(DType::kBF16)));
  for (TensorToWrite& t : ts) {
    if (!t.name.ends_with("scale") && !t.name.ends_with("scales")) continue;
    *scale_name = t.name;
    StoreFloatAs(value, t.dtype, t.bytes.data() + 3 * DTypeSize(t.dtype));
  }
  const std::string dir = (fs::temp_directory_path() / ("nibble_scale_rule_" + std::string(entry.export_name) + "_" +
                                                        std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << nlohmann::json{{"quantization_config", w->QuantizationConfig(request)}}.dump();
  std::vector<const TensorToWrite*> ptrs;
  for (const TensorToWrite& t : ts) ptrs.push_back(&t);
  NIBBLE_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", ptrs, {{"format", "pt"}}));
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<QuantizedFormat> f, OpenCheckpointFormat(dir));
  NIBBLE_ASSIGN_OR_RETURN(TensorStore store, TensorStore::OpenDir(dir));
  NIBBLE_ASSIGN_OR_RETURN(LinearPlan plan, f->Resolve(kRuleModule));
  auto m = f->Import(store, kRuleModule, plan, 8, 16);
  fs::remove_all(dir);
  return m;
}

TEST(ScaleRule, EveryReaderRefusesNegativeAndNonFiniteScalesAlike) {
  ASSERT_FALSE(Formats().empty());
  for (const FormatEntry& entry : Formats()) {
    for (float bad : {-0.25f, NAN, INFINITY, -INFINITY}) {
      std::string scale_name;
      auto r = WriteEditRead(entry, bad, &scale_name);
      ASSERT_FALSE(scale_name.empty()) << entry.export_name << ": no scale tensor written";
      ASSERT_FALSE(r.ok()) << entry.export_name << " accepted scale " << bad;
      const std::string& msg = r.error().message;
      EXPECT_EQ(r.error().code, ErrorCode::kCorruptInput) << entry.export_name << ": " << msg;
      EXPECT_NE(msg.find("(expected a finite scale >= 0)"), std::string::npos) << entry.export_name << ": " << msg;
      EXPECT_NE(msg.find(scale_name), std::string::npos) << entry.export_name << ": " << msg;
    }
  }
}

TEST(ScaleRule, ZeroScaleIsAnAllZeroGroupInEveryReader) {
  for (const FormatEntry& entry : Formats()) {
    std::string scale_name;
    auto r = WriteEditRead(entry, 0.0f, &scale_name);
    ASSERT_TRUE(r.ok()) << entry.export_name << ": " << r.error().message;
    ASSERT_TRUE(r->has_value()) << entry.export_name;
    int zeros = 0;
    for (float s : (*r)->scales) zeros += s == 0.0f;
    EXPECT_EQ(zeros, 1) << entry.export_name;
  }
}

TEST(ScaleRule, ValidateInt4MatrixAppliesTheSameRule) {
  Int4Matrix m = RuleMatrix();
  ASSERT_TRUE(ValidateInt4Matrix(m, "m").ok());
  m.scales[5] = -1.0f;
  Status s = ValidateInt4Matrix(m, "m");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("m: scales[2][1] is -1 (expected a finite scale >= 0)"), std::string::npos)
      << s.error().message;
}

}  // namespace
}  // namespace nibble
