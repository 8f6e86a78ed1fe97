// FormatWriter::LinearLayout against WriteLinear: for every export format, several shapes and
// schemes, the laid-out tensors (names, dtypes, shapes, in order) are those WriteLinear writes for
// the RTN of a random weight of that shape, so an output laid out before its first tensor
// (CheckpointWriter::LayOut) holds the same bytes as one written as the tensors come.
#include <random>

#include <gtest/gtest.h>

#include "formats/checkpoint_format.h"
#include "formats/rtn.h"

namespace nibble {
namespace {

struct Case {
  int64_t n, k, group_size;  // group_size -1: per_channel
  bool symmetric;
};

ExportRequest RequestFor(const Case& c) {
  ExportRequest r;
  WeightQuantSpec s;
  s.dtype = c.symmetric ? QuantDType::kInt4 : QuantDType::kUint4;
  s.symmetric = c.symmetric;
  s.group_size = c.group_size;
  if (c.group_size == -1) {
    s.qscheme = QScheme::kPerChannel;
    s.ch_axis = 0;
  }
  r.config.global = s;
  r.gptq_format = "v2";  // v1 cannot hold every zero point
  return r;
}

std::string Text(const std::vector<TensorSlot>& ts) {
  std::string s;
  for (const TensorSlot& t : ts) s += t.name + " " + DTypeName(t.dtype) + " " + ShapeToString(t.shape) + "; ";
  return s;
}

TEST(LinearLayout, EveryFormatLaysOutWhatWriteLinearWrites) {
  const std::vector<Case> cases = {{8, 16, 8, false}, {24, 32, 16, false}, {12, 16, 8, false},
                                   {16, 32, 8, true}, {16, 24, -1, false}, {16, 32, 32, true}};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const FormatEntry& entry : Formats()) {
    if (entry.writer == nullptr) continue;
    int laid_out = 0;
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(entry.export_name) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " g " +
                   std::to_string(c.group_size) + (c.symmetric ? " sym" : " asym"));
      auto w = entry.writer(RequestFor(c));
      if (!w.ok()) continue;  // a scheme the format refuses as a whole (AutoAWQ: symmetric, per_channel)
      QuantSpec spec;
      spec.symmetric = c.symmetric;
      spec.group_size = c.group_size;
      if (c.group_size == -1) spec.granularity = Granularity::kPerChannel;
      const DType scale_dtype = (*w)->ScaleDType().value_or(DType::kBF16);
      std::vector<float> weight(static_cast<size_t>(c.n * c.k));
      for (float& x : weight) x = normal(rng);
      auto m = QuantizeRtnRef(weight.data(), c.n, c.k, spec, scale_dtype);
      ASSERT_TRUE(m.ok()) << m.error().message;
      const std::string module = "model.layers.3.mlp.up_proj";
      const std::optional<std::vector<TensorSlot>> layout = (*w)->LinearLayout(module, c.n, c.k, spec, scale_dtype);
      auto written = (*w)->WriteLinear(module, *m, spec, scale_dtype);
      if (!layout) continue;  // streamed: nothing to agree with
      if (!written.ok()) continue;  // WriteLinear's refusal stands (a laid-out run fails with it)
      std::vector<TensorSlot> got;
      for (const TensorToWrite& t : *written) {
        got.push_back({t.name, t.dtype, t.shape});
        EXPECT_EQ(t.data().size(), SlotBytes(got.back())) << t.name;
      }
      EXPECT_EQ(Text(*layout), Text(got));
      ++laid_out;
    }
    EXPECT_GE(laid_out, 2) << entry.export_name << " lays out no RTN module of these shapes";
  }
}

}  // namespace
}  // namespace nibble
