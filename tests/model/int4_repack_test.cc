// Int4Linear::FromTransposed (Quark per_group words repacked straight into W4P) against the
// constructor on the matrix ImportQuarkLinear decodes: the same packed bytes, and weight()
// gives back the matrix that was exported, for int4 / uint4, both nibble orders, several group
// sizes and N not a multiple of 128.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "formats/int4_matrix.h"
#include "formats/quark_pack.h"
#include "model/int4_linear.h"

namespace nibble {
namespace {

Int4Matrix RandomRepackMatrix(int64_t n, int64_t k, int64_t g, bool sym, uint32_t seed) {
  std::mt19937 rng(seed);
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = g;
  m.symmetric = sym;
  m.codes.resize(static_cast<size_t>(n * k));
  for (auto& c : m.codes) c = static_cast<uint8_t>(rng() & 15);
  std::uniform_real_distribution<float> s(0.001f, 0.05f);
  m.scales.resize(static_cast<size_t>(n * (k / g)));
  for (auto& v : m.scales) v = s(rng);
  m.zero_points.resize(m.scales.size());
  for (auto& z : m.zero_points) z = sym ? 8 : static_cast<uint8_t>(rng() & 15);
  return m;
}

TensorView ViewOf(const TensorToWrite& t) {
  TensorView v;
  v.name = t.name;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.data = t.data().data();
  v.nbytes = t.data().size();
  return v;
}

struct Case {
  int64_t n, k, g;
  bool sym;
  PackMethod pack;
};

TEST(Int4Repack, TransposedWordsPackAsTheDecodedMatrix) {
  const Case cases[] = {{24, 256, 128, true, PackMethod::kReorder}, {264, 512, 128, false, PackMethod::kReorder},
                        {136, 256, 32, false, PackMethod::kOrder},  {40, 384, 48, true, PackMethod::kOrder},
                        {128, 1024, 256, false, PackMethod::kReorder}, {16, 128, 64, true, PackMethod::kReorder}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " g=" + std::to_string(c.g) +
                 (c.sym ? " int4" : " uint4") + (c.pack == PackMethod::kOrder ? " order" : " reorder"));
    const Int4Matrix m = RandomRepackMatrix(c.n, c.k, c.g, c.sym, seed++);
    WeightQuantSpec spec;
    spec.dtype = c.sym ? QuantDType::kInt4 : QuantDType::kUint4;
    spec.symmetric = c.sym;
    spec.group_size = c.g;
    auto t = ExportQuarkLinear("p", m, spec, c.pack, DType::kF32);
    ASSERT_TRUE(t.ok()) << t.error().message;
    const TensorView w = ViewOf(t->weight), s = ViewOf(t->weight_scale), z = ViewOf(t->weight_zero_point);
    const QuarkLinearViews views{&w, &s, &z};
    auto decoded = ImportQuarkLinear(views, "p", spec, c.pack, c.n, c.k);
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    auto deferred = ImportQuarkLinearDeferred(views, "p", spec, c.pack, c.n, c.k);
    ASSERT_TRUE(deferred.ok()) << deferred.error().message;
    ASSERT_TRUE(deferred->has_value());
    EXPECT_TRUE((*deferred)->matrix.codes.empty());
    const Int4Linear reference(*decoded, {}, "ref");
    std::unique_ptr<Int4Linear> fast = Int4Linear::FromTransposed(**deferred, {}, "fast");
    ASSERT_NE(fast, nullptr);
    ASSERT_EQ(fast->WeightBytes(), reference.WeightBytes());
    EXPECT_EQ(std::memcmp(fast->packed().data, reference.packed().data, static_cast<size_t>(reference.WeightBytes())), 0);
    EXPECT_TRUE(fast->weight() == m);
  }
}

TEST(Int4Repack, ShapesTheWordsCannotServeFallBack) {
  // N not a multiple of 8 (a partial word), K not a multiple of 128, g not a multiple of 16.
  for (const Case& c : {Case{20, 256, 128, false, PackMethod::kReorder}, Case{16, 192, 64, false, PackMethod::kReorder},
                        Case{16, 256, 8, true, PackMethod::kOrder}}) {
    const Int4Matrix m = RandomRepackMatrix(c.n, c.k, c.g, c.sym, 7);
    WeightQuantSpec spec;
    spec.dtype = c.sym ? QuantDType::kInt4 : QuantDType::kUint4;
    spec.symmetric = c.sym;
    spec.group_size = c.g;
    auto t = ExportQuarkLinear("p", m, spec, c.pack, DType::kF32);
    ASSERT_TRUE(t.ok()) << t.error().message;
    const TensorView w = ViewOf(t->weight), s = ViewOf(t->weight_scale), z = ViewOf(t->weight_zero_point);
    auto deferred = ImportQuarkLinearDeferred(QuarkLinearViews{&w, &s, &z}, "p", spec, c.pack, c.n, c.k);
    ASSERT_TRUE(deferred.ok() && deferred->has_value());
    EXPECT_EQ(Int4Linear::FromTransposed(**deferred, {}, "fast"), nullptr);
  }
}

}  // namespace
}  // namespace nibble
