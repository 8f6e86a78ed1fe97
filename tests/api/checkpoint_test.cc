// Checkpoint: a quantized checkpoint's linears read back in the common int4 convention, checked
// against the float model they were quantized from (RTN: every weight within a step of its
// group) and against the formula w = (q - z) * s; names and float linears refused with kNotFound /
// kInvalidArgument.
#include <nibble/nibble.h>

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_paths.h"
#include "test_util.h"

namespace {

std::string QuantizeEmbedded(const nibble_test::TempDir& tmp, const std::string& scheme, const std::string& format) {
  nibble::QuantizeRequest r;
  r.model_dir = nibble_test::EmbeddedModel();
  r.output_dir = tmp.path() + "/q";
  r.quant_scheme = scheme;
  r.group_size = 32;
  r.model_export = format;
  auto s = nibble::Quantize(r);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return r.output_dir;
}

void CheckAgainstFloat(const std::string& scheme, const std::string& format) {
  nibble_test::TempDir tmp;
  auto q = nibble::Checkpoint::Open(QuantizeEmbedded(tmp, scheme, format));
  auto f = nibble::Checkpoint::Open(nibble_test::EmbeddedModel());
  ASSERT_TRUE(q.ok() && f.ok());
  EXPECT_EQ((*f)->format(), "dense");
  EXPECT_EQ((*q)->format(), format == "hf_format" ? "quark" : format);
  ASSERT_EQ((*q)->linears().size(), (*f)->linears().size());
  int quantized = 0;
  for (const nibble::CheckpointLinear& l : (*q)->linears()) {
    auto w = (*q)->Dequantize(l.name);
    auto ref = (*f)->Dequantize(l.name);
    ASSERT_TRUE(w.ok() && ref.ok()) << l.name;
    ASSERT_EQ(w->size(), static_cast<size_t>(l.out_features * l.in_features));
    if (!l.quantized) {
      EXPECT_EQ(*w, *ref) << l.name;  // kept in float: the same values
      EXPECT_EQ((*q)->Quantized(l.name).error().code, nibble::ErrorCode::kInvalidArgument);
      continue;
    }
    ++quantized;
    EXPECT_NE(l.scheme.find("g32"), std::string::npos) << l.scheme;
    auto qw = (*q)->Quantized(l.name);
    ASSERT_TRUE(qw.ok()) << qw.error().message;
    const int64_t groups = l.in_features / qw->group_size;
    ASSERT_EQ(qw->codes.size(), w->size());
    ASSERT_EQ(qw->scales.size(), static_cast<size_t>(l.out_features * groups));
    for (int64_t n = 0; n < l.out_features; ++n)
      for (int64_t k = 0; k < l.in_features; ++k) {
        const size_t i = static_cast<size_t>(n * l.in_features + k), g = static_cast<size_t>(n * groups + k / qw->group_size);
        const float s = qw->scales[g];
        ASSERT_EQ((*w)[i], (static_cast<float>(qw->codes[i]) - static_cast<float>(qw->zero_points[g])) * s);
        // RTN: within one step of the float weight (half a step of rounding, and up to half a step
        // more where the rounded zero point clamps the group's extreme; the stored scale is rounded).
        ASSERT_LE(std::fabs((*w)[i] - (*ref)[i]), 1.01f * s + 1e-6f) << l.name << " [" << n << ", " << k << "]";
      }
  }
  EXPECT_EQ(quantized, static_cast<int>((*q)->linears().size()) - 1);  // all but lm_head
}

TEST(Checkpoint, QuarkAsymmetricReadsBackWithinAStep) { CheckAgainstFloat("w_uint4_per_group_asym", "hf_format"); }

TEST(Checkpoint, GptqSymmetricReadsBackWithinAStep) { CheckAgainstFloat("w_int4_per_group_sym", "gptq"); }

TEST(Checkpoint, UnknownNamesAndMissingDirsAreNotFound) {
  auto f = nibble::Checkpoint::Open(nibble_test::EmbeddedModel());
  ASSERT_TRUE(f.ok());
  auto w = (*f)->Dequantize("model.layers.99.mlp.up_proj");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, nibble::ErrorCode::kNotFound);
  EXPECT_NE(w.error().message.find("model.layers.99.mlp.up_proj"), std::string::npos);
  auto missing = nibble::Checkpoint::Open("/nonexistent/checkpoint");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, nibble::ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("/nonexistent/checkpoint"), std::string::npos);
}

}  // namespace
