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
#include "test_util.h"

namespace nibble {
namespace {

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

// A random matrix of case `c`, exported as Quark tensors (`tensors` keeps their bytes) and viewed
// as ImportQuarkLinear reads them.
struct Exported {
  Int4Matrix matrix;
  WeightQuantSpec spec;
  QuarkLinearTensors tensors;
  TensorView w, s, z;
  QuarkLinearViews views() const { return {&w, &s, &z}; }
};

std::unique_ptr<Exported> Export(const Case& c, uint32_t seed) {
  auto e = std::make_unique<Exported>();
  std::mt19937 rng(seed);
  e->matrix = nibble_test::RandomInt4Matrix(rng, c.n, c.k, c.g, c.sym);
  e->spec.dtype = c.sym ? QuantDType::kInt4 : QuantDType::kUint4;
  e->spec.symmetric = c.sym;
  e->spec.group_size = c.g;
  auto t = ExportQuarkLinear("p", e->matrix, e->spec, c.pack, DType::kF32);
  if (!t.ok()) {
    ADD_FAILURE() << t.error().message;
    return nullptr;
  }
  e->tensors = std::move(t).value();
  e->w = ViewOf(e->tensors.weight);
  e->s = ViewOf(e->tensors.weight_scale);
  e->z = ViewOf(e->tensors.weight_zero_point);
  return e;
}

TEST(Int4Repack, TransposedWordsPackAsTheDecodedMatrix) {
  const Case cases[] = {{24, 256, 128, true, PackMethod::kReorder}, {264, 512, 128, false, PackMethod::kReorder},
                        {136, 256, 32, false, PackMethod::kOrder},  {40, 384, 48, true, PackMethod::kOrder},
                        {128, 1024, 256, false, PackMethod::kReorder}, {16, 128, 64, true, PackMethod::kReorder}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " g=" + std::to_string(c.g) +
                 (c.sym ? " int4" : " uint4") + (c.pack == PackMethod::kOrder ? " order" : " reorder"));
    const std::unique_ptr<Exported> e = Export(c, seed++);
    ASSERT_NE(e, nullptr);
    auto decoded = ImportQuarkLinear(e->views(), "p", e->spec, c.pack, c.n, c.k);
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    auto deferred = ImportQuarkLinearDeferred(e->views(), "p", e->spec, c.pack, c.n, c.k);
    ASSERT_TRUE(deferred.ok()) << deferred.error().message;
    ASSERT_TRUE(deferred->has_value());
    EXPECT_TRUE((*deferred)->matrix.codes.empty());
    const Int4Linear reference(*decoded, {}, "ref");
    std::unique_ptr<Int4Linear> fast = Int4Linear::FromTransposed(**deferred, {}, "fast");
    ASSERT_NE(fast, nullptr);
    ASSERT_EQ(fast->WeightBytes(), reference.WeightBytes());
    EXPECT_EQ(std::memcmp(fast->packed().data, reference.packed().data, static_cast<size_t>(reference.WeightBytes())), 0);
    EXPECT_TRUE(fast->weight() == e->matrix);
  }
}

TEST(Int4Repack, ShapesTheWordsCannotServeFallBack) {
  // N not a multiple of 8 (a partial word), K not a multiple of 128, g not a multiple of 16.
  for (const Case& c : {Case{20, 256, 128, false, PackMethod::kReorder}, Case{16, 192, 64, false, PackMethod::kReorder},
                        Case{16, 256, 8, true, PackMethod::kOrder}}) {
    const std::unique_ptr<Exported> e = Export(c, 7);
    ASSERT_NE(e, nullptr);
    auto deferred = ImportQuarkLinearDeferred(e->views(), "p", e->spec, c.pack, c.n, c.k);
    ASSERT_TRUE(deferred.ok() && deferred->has_value());
    EXPECT_EQ(Int4Linear::FromTransposed(**deferred, {}, "fast"), nullptr);
  }
}

}  // namespace
}  // namespace nibble
