// The fast RTN path (quantize/rtn_fast.h) against the scalar reference QuantizeRtnRef and the
// report's relative error, bit for bit: random and adversarial weights (ties at .5, all-equal
// groups, tiny and huge values, inf / nan), F32 / F16 / BF16 weights and scales, uint4 and int4,
// groups that are not a multiple of the vector width; and every compiled ISA's row kernels
// against the baseline build's.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "formats/float_dtype.h"
#include "formats/rtn.h"
#include "kernels/int4_dispatch.h"
#include "kernels/vec_ops.h"
#include "model/weights.h"
#include "quantize/pipeline.h"
#include "quantize/rtn_fast.h"

namespace {

using nibble::DType;

// A stored tensor: `values` rounded to `dtype` and kept as its bytes.
struct Stored {
  std::vector<uint8_t> bytes;
  nibble::TensorView view;
};

Stored Store(const std::vector<float>& values, int64_t n, int64_t k, DType dtype) {
  Stored s;
  const size_t es = nibble::DTypeSize(dtype);
  s.bytes.resize(values.size() * es);
  for (size_t i = 0; i < values.size(); ++i) nibble::StoreFloatAs(values[i], dtype, s.bytes.data() + i * es);
  s.view.name = "w";
  s.view.file = "test.safetensors";
  s.view.dtype = dtype;
  s.view.shape = {n, k};
  s.view.data = s.bytes.data();
  s.view.nbytes = s.bytes.size();
  return s;
}

nibble::QuantSpec Spec(int64_t group_size, bool symmetric) {
  nibble::QuantSpec spec;
  spec.group_size = group_size;
  spec.symmetric = symmetric;
  if (group_size == -1) spec.granularity = nibble::Granularity::kPerChannel;
  return spec;
}

// Fast equals reference (codes, scales, zero points, the rel error's bits), or both refuse.
void ExpectSameAsReference(const std::vector<float>& values, int64_t n, int64_t k, DType dtype, int64_t g, bool sym,
                           DType scale_dtype, const std::string& what) {
  SCOPED_TRACE(what + " dtype " + nibble::DTypeName(dtype) + " scale " + nibble::DTypeName(scale_dtype) + " g " +
               std::to_string(g) + (sym ? " int4" : " uint4"));
  const Stored s = Store(values, n, k, dtype);
  const nibble::QuantSpec spec = Spec(g, sym);
  nibble::Int4Matrix fast;
  double fast_err = -1;
  const bool ran = nibble::QuantizeRtnFast(s.view, spec, scale_dtype, &fast, &fast_err);
  auto w = nibble::TensorToF32(s.view);
  if (!w.ok()) {
    EXPECT_FALSE(ran) << "the fast path quantized a tensor the reference refuses: " << w.error().message;
    return;
  }
  auto ref = nibble::QuantizeRtnRef(w->data(), n, k, spec, scale_dtype);
  if (!ref.ok()) {
    EXPECT_FALSE(ran) << "the fast path quantized a tensor the reference refuses: " << ref.error().message;
    return;
  }
  ASSERT_TRUE(ran);
  EXPECT_EQ(fast.n, ref->n);
  EXPECT_EQ(fast.group_size, ref->group_size);
  EXPECT_EQ(fast.symmetric, ref->symmetric);
  ASSERT_EQ(fast.codes, ref->codes);
  ASSERT_EQ(fast.zero_points, ref->zero_points);
  ASSERT_EQ(fast.scales.size(), ref->scales.size());
  EXPECT_EQ(0, std::memcmp(fast.scales.data(), ref->scales.data(), fast.scales.size() * 4));
  const double ref_err = nibble::RelWeightError(*w, *ref);
  EXPECT_EQ(0, std::memcmp(&fast_err, &ref_err, sizeof(double))) << fast_err << " vs " << ref_err;
}

void ExpectAllVariants(const std::vector<float>& values, int64_t n, int64_t k, const std::vector<int64_t>& groups,
                       const std::string& what) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32})
    for (DType scale_dtype : {DType::kBF16, DType::kF16, DType::kF32})
      for (int64_t g : groups)
        for (bool sym : {false, true}) ExpectSameAsReference(values, n, k, dtype, g, sym, scale_dtype, what);
}

std::vector<float> Normal(size_t count, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(RtnFast, RandomWeightsEqualTheReference) {
  // K = 192: groups of 32, 64 and 192 (per channel), and 48 (not a multiple of 16 lanes).
  ExpectAllVariants(Normal(7 * 192, 0.02f, 1), 7, 192, {32, 48, 64, -1}, "normal");
  // Outliers in some groups: a wide range with most codes near the zero point.
  std::vector<float> v = Normal(5 * 256, 0.01f, 2);
  for (size_t i = 0; i < v.size(); i += 97) v[i] = (i % 2 ? 1 : -1) * 3.5f;
  ExpectAllVariants(v, 5, 256, {128, -1}, "outliers");
  // Groups smaller than a vector and K not a multiple of 16.
  ExpectAllVariants(Normal(3 * 15, 1.f, 3), 3, 15, {5, 15, -1}, "small groups");
}

TEST(RtnFast, AdversarialWeightsEqualTheReference) {
  const int64_t k = 64;
  std::vector<float> v;
  auto group = [&](auto f) {
    for (int64_t i = 0; i < 32; ++i) v.push_back(f(i));
  };
  group([](int64_t i) { return static_cast<float>(i % 16) - 0.5f; });     // ties at .5 (uint4: s = 1)
  group([](int64_t i) { return static_cast<float>(i % 16) * 0.5f + 0.25f; });  // ties after the scale
  group([](int64_t) { return 0.f; });                                       // all zero: s = 2^-23
  group([](int64_t) { return -0.f; });
  group([](int64_t) { return 0.75f; });                                     // all equal, positive
  group([](int64_t) { return -3.f; });                                      // all equal, negative
  group([](int64_t i) { return i % 2 ? 1e-30f : -1e-30f; });                // below the smallest scale
  group([](int64_t i) { return static_cast<float>(i) * 1e-6f; });           // F16 subnormal scales
  group([](int64_t i) { return i == 7 ? 7.5f : static_cast<float>(i % 8) - 8.f; });  // int4 ties at the ends
  group([](int64_t i) { return static_cast<float>(i - 16) * 1000.f; });     // large values
  ExpectAllVariants(v, static_cast<int64_t>(v.size()) / k, k, {32, -1}, "adversarial");
}

TEST(RtnFast, NonFiniteAndOverflowAreLeftToTheReference) {
  std::vector<float> v = Normal(4 * 64, 0.1f, 4);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> w = v;
    w[3 * 64 + 17] = bad;
    ExpectAllVariants(w, 4, 64, {32, -1}, "non-finite");
  }
  // |x| = 3e5 fits F32 / BF16 weights but its scale overflows F16 (the reference's error).
  std::vector<float> w = v;
  w[70] = 3e5f;
  for (int64_t g : {32, -1})
    for (bool sym : {false, true}) ExpectSameAsReference(w, 4, 64, DType::kF32, g, sym, DType::kF16, "scale overflow");
}

TEST(RtnFast, ArgumentsTheReferenceRefusesAreLeftToIt) {
  const Stored s = Store(Normal(4 * 100, 0.1f, 5), 4, 100, DType::kBF16);
  nibble::Int4Matrix m;
  double err = 0;
  EXPECT_FALSE(nibble::QuantizeRtnFast(s.view, Spec(32, false), DType::kBF16, &m, &err));  // K % g != 0
  EXPECT_FALSE(nibble::QuantizeRtnFast(s.view, Spec(50, false), DType::kI32, &m, &err));   // scale dtype
  nibble::QuantSpec three_bits = Spec(50, false);
  three_bits.bits = 3;
  EXPECT_FALSE(nibble::QuantizeRtnFast(s.view, three_bits, DType::kBF16, &m, &err));
  EXPECT_TRUE(nibble::QuantizeRtnFast(s.view, Spec(50, false), DType::kBF16, &m, &err));
}

// Each compiled ISA's row kernels give the baseline build's bits (RtnFast above runs the chosen one).
TEST(RtnFast, EveryIsaGivesTheScalarBits) {
  const nibble::VecKernels scalar = nibble::VecKernelsScalar();
  const int64_t k = 384, g = 48;
  std::vector<float> values = Normal(k, 0.05f, 6);
  for (int64_t i = 0; i < 48; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 16) - 0.5f;  // ties
  for (const nibble::Isa isa : {nibble::Isa::kScalar, nibble::Isa::kAvx2, nibble::Isa::kAvx512}) {
    const nibble::W4Kernels* kern = nibble::W4KernelsFor(isa);
    if (kern == nullptr) continue;
    SCOPED_TRACE(nibble::IsaName(isa));
    for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      const Stored s = Store(values, 1, k, dtype);
      const auto rd = dtype == DType::kF32 ? nibble::RowDType::kF32 : dtype == DType::kBF16 ? nibble::RowDType::kBF16 : nibble::RowDType::kF16;
      std::vector<float> x0(k), x1(k), mn0(k / g), mn1(k / g), mx0(k / g), mx1(k / g);
      ASSERT_TRUE(scalar.rtn_row_range(s.bytes.data(), rd, k, g, x0.data(), mn0.data(), mx0.data()));
      ASSERT_TRUE(kern->vec.rtn_row_range(s.bytes.data(), rd, k, g, x1.data(), mn1.data(), mx1.data()));
      EXPECT_EQ(0, std::memcmp(x0.data(), x1.data(), k * 4));
      EXPECT_EQ(mn0, mn1);
      EXPECT_EQ(mx0, mx1);
      for (bool sym : {false, true}) {
        std::vector<float> sc(k / g), inv(k / g), z(k / g);
        for (int64_t j = 0; j < k / g; ++j) {
          nibble::RtnGroupParams p;
          ASSERT_TRUE(nibble::RtnGroupOf(mn0[j], mx0[j], sym, DType::kBF16, &p));
          sc[j] = p.s, inv[j] = p.inv, z[j] = p.z;
        }
        std::vector<uint8_t> c0(k), c1(k);
        double num0 = 0.5, den0 = 0.25, num1 = 0.5, den1 = 0.25;
        scalar.rtn_row_codes(x0.data(), k, g, sc.data(), inv.data(), z.data(), sym, c0.data(), &num0, &den0);
        kern->vec.rtn_row_codes(x0.data(), k, g, sc.data(), inv.data(), z.data(), sym, c1.data(), &num1, &den1);
        EXPECT_EQ(c0, c1);
        EXPECT_EQ(0, std::memcmp(&num0, &num1, 8));
        EXPECT_EQ(0, std::memcmp(&den0, &den1, 8));
      }
      std::vector<float> bad = values;
      bad[200] = std::numeric_limits<float>::infinity();
      const Stored sb = Store(bad, 1, k, dtype);
      EXPECT_FALSE(kern->vec.rtn_row_range(sb.bytes.data(), rd, k, g, x1.data(), mn1.data(), mx1.data()));
    }
  }
}

// AWQ's candidate rows: every ISA's float(code − zp) · s / d equals the formula written out here,
// each operation rounded on its own, at groups with and without a vector tail.
TEST(RtnFast, EveryIsaDequantizesAndDividesAsTheFormula) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.25f, 4.f);
  for (const int64_t g : {48, 128}) {
    const int64_t k = 4 * g;
    std::vector<uint8_t> codes(k);
    std::vector<float> d(k), s(k / g);
    std::vector<int32_t> zp(k / g);
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    for (auto& v : d) v = scale(rng);
    d[3] = 1.f / 3.f;  // a quotient that is not exact
    for (int64_t j = 0; j < k / g; ++j) s[j] = scale(rng) * 1e-3f, zp[j] = code(rng);
    std::vector<float> expect(k);
    for (int64_t i = 0; i < k; ++i) {
      const float deq = static_cast<float>(int32_t{codes[i]} - zp[i / g]) * s[i / g];
      expect[i] = deq / d[i];
    }
    for (const nibble::Isa isa : {nibble::Isa::kScalar, nibble::Isa::kAvx2, nibble::Isa::kAvx512}) {
      const nibble::W4Kernels* kern = nibble::W4KernelsFor(isa);
      if (kern == nullptr) continue;
      SCOPED_TRACE(std::string(nibble::IsaName(isa)) + " g " + std::to_string(g));
      std::vector<float> out(k, -1.f);
      kern->vec.rtn_row_dequant_div(codes.data(), k, g, s.data(), zp.data(), d.data(), out.data());
      EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), k * 4));
    }
    std::vector<float> out(k);
    nibble::RtnRowDequantDiv(codes.data(), k, g, s.data(), zp.data(), d.data(), out.data());
    EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), k * 4));
  }
}

// The pipeline's RtnDequant without codes runs blocks of rows in parallel: the reference's
// values at one and two threads, over a last block shorter than the others; a non-finite weight
// is the whole matrix's error, naming its row and column.
TEST(RtnDequant, RowBlocksGiveTheReferenceAndItsErrors) {
  const int64_t n = 200, k = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> w(static_cast<size_t>(n * k));
  for (float& v : w) v = nd(rng);
  nibble::QuantSpec spec;
  spec.group_size = 32;
  auto ref = nibble::QuantizeRtnRef(w.data(), n, k, spec, DType::kBF16);
  ASSERT_TRUE(ref.ok());
  std::vector<float> expect(w.size());
  nibble::DequantizeRef(*ref, expect.data());
  const int before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    auto d = nibble::RtnDequant(w, n, k, spec, DType::kBF16);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(*d, expect) << threads << " thread(s)";
  }
  w[150 * k + 7] = std::numeric_limits<float>::quiet_NaN();
  auto bad = nibble::RtnDequant(w, n, k, spec, DType::kBF16);
  omp_set_num_threads(before);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("weight[150][7]"), std::string::npos) << bad.error().message;
}

}  // namespace
