// Quark hf_format int4 pack/unpack: SPEC test vectors TV-1, TV-2, TV-3, TV-5 bit-exact, round
// trips through safetensors bytes on awkward shapes, and import errors.
#include "formats/quark_pack.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include "formats/float_dtype.h"
#include "formats/int4_matrix.h"
#include "test_util.h"

namespace nibble {
namespace {

WeightQuantSpec Spec(bool sym, int64_t g, QScheme qs = QScheme::kPerGroup) {
  WeightQuantSpec s;
  s.dtype = sym ? QuantDType::kInt4 : QuantDType::kUint4;
  s.symmetric = sym;
  s.group_size = g;
  s.qscheme = qs;
  s.ch_axis = qs == QScheme::kPerGroup ? 1 : 0;
  return s;
}

std::vector<uint32_t> Words(const TensorToWrite& t) {
  EXPECT_EQ(t.dtype, DType::kI32);
  std::vector<uint32_t> w(t.bytes.size() / 4);
  std::memcpy(w.data(), t.bytes.data(), t.bytes.size());
  return w;
}

std::vector<float> Floats(const TensorToWrite& t) {
  const size_t es = DTypeSize(t.dtype);
  std::vector<float> v(t.bytes.size() / es);
  for (size_t i = 0; i < v.size(); ++i) v[i] = LoadFloatAs(t.bytes.data() + i * es, t.dtype);
  return v;
}

// ---- TV-2 / word level -------------------------------------------------------------------------

TEST(QuarkPackTest, Tv2OneWord) {
  const uint8_t codes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(PackNibbleWord(codes, PackMethod::kOrder), 0x87654321u);
  EXPECT_EQ(PackNibbleWord(codes, PackMethod::kReorder), 0x86427531u);
  for (PackMethod p : {PackMethod::kOrder, PackMethod::kReorder}) {
    uint8_t back[8];
    UnpackNibbleWord(PackNibbleWord(codes, p), p, back);
    EXPECT_EQ(std::memcmp(back, codes, 8), 0);
  }
}

TEST(QuarkPackTest, ReorderShiftsMatchSpec) {
  // SPEC §1.5: for reorder, element j lives at shift 4 * inv[j], inv = [0,4,1,5,2,6,3,7].
  const int inv[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int j = 0; j < 8; ++j) {
    uint8_t one[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    one[j] = 0xF;
    EXPECT_EQ(PackNibbleWord(one, PackMethod::kReorder), 0xFu << (4 * inv[j])) << j;
    EXPECT_EQ(PackNibbleWord(one, PackMethod::kOrder), 0xFu << (4 * j)) << j;
  }
}

// ---- TV-1 ----------------------------------------------------------------------------------------

Int4Matrix Tv1Matrix() {
  Int4Matrix m;
  m.n = 2;
  m.k = 16;
  m.group_size = 8;
  m.symmetric = false;
  m.codes = {0, 1, 2, 4, 6, 8, 12, 15, 2, 4, 6, 8, 10, 12, 14, 15, 0, 2, 4, 6, 8, 10, 12, 15, 0, 3, 7, 11, 15, 14, 13, 9};
  m.zero_points = {4, 0, 8, 15};
  m.scales = {0.25f, 0.25f, 0.25f, 0.25f};
  return m;
}

TEST(QuarkPackTest, Tv1OrderAndReorderWords) {
  const Int4Matrix m = Tv1Matrix();
  auto order = ExportQuarkLinear("model.layers.0.self_attn.q_proj", m, Spec(false, 8), PackMethod::kOrder, DType::kBF16);
  ASSERT_TRUE(order.ok()) << order.error().message;
  EXPECT_EQ(order->weight.name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(order->weight_scale.name, "model.layers.0.self_attn.q_proj.weight_scale");
  EXPECT_EQ(order->weight_zero_point.name, "model.layers.0.self_attn.q_proj.weight_zero_point");
  EXPECT_EQ(order->weight.shape, (std::vector<int64_t>{16, 1}));
  EXPECT_EQ(order->weight_scale.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(order->weight_zero_point.shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(Words(order->weight), (std::vector<uint32_t>{0x00, 0x21, 0x42, 0x64, 0x86, 0xA8, 0xCC, 0xFF, 0x02, 0x34, 0x76,
                                                         0xB8, 0xFA, 0xEC, 0xDE, 0x9F}));
  EXPECT_EQ(Words(order->weight_zero_point), (std::vector<uint32_t>{0x84, 0xF0}));
  EXPECT_EQ(order->weight_scale.dtype, DType::kBF16);
  EXPECT_EQ(order->weight_scale.bytes, (std::vector<uint8_t>{0x80, 0x3E, 0x80, 0x3E, 0x80, 0x3E, 0x80, 0x3E}));  // bf16 0.25

  auto reorder = ExportQuarkLinear("p", m, Spec(false, 8), PackMethod::kReorder, DType::kF16);
  ASSERT_TRUE(reorder.ok()) << reorder.error().message;
  EXPECT_EQ(Words(reorder->weight),
            (std::vector<uint32_t>{0x00000000, 0x00020001, 0x00040002, 0x00060004, 0x00080006, 0x000A0008, 0x000C000C,
                                   0x000F000F, 0x00000002, 0x00030004, 0x00070006, 0x000B0008, 0x000F000A, 0x000E000C,
                                   0x000D000E, 0x0009000F}));
  EXPECT_EQ(Words(reorder->weight_zero_point), (std::vector<uint32_t>{0x00080004, 0x000F0000}));
  EXPECT_EQ(Floats(reorder->weight_scale), std::vector<float>(4, 0.25f));
  EXPECT_EQ(reorder->weight_scale.bytes[1], 0x34);  // fp16 0.25 = 0x3400
}

// Scale layout is transposed [G, N]: distinct scales show the index order.
TEST(QuarkPackTest, ScalesAreTransposed) {
  Int4Matrix m = Tv1Matrix();
  m.scales = {1.0f, 2.0f, 3.0f, 4.0f};  // [N=2, G=2]: n0 = (1, 2), n1 = (3, 4)
  auto t = ExportQuarkLinear("p", m, Spec(false, 8), PackMethod::kOrder, DType::kF32);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(Floats(t->weight_scale), (std::vector<float>{1.0f, 3.0f, 2.0f, 4.0f}));  // [G, N]
}

// ---- TV-3 ----------------------------------------------------------------------------------------

TEST(QuarkPackTest, Tv3SymmetricInt4Words) {
  const int q[8] = {-8, -1, 0, 1, 2, 3, 7, -2};
  Int4Matrix m;
  m.n = 8;
  m.k = 8;
  m.group_size = 8;
  m.symmetric = true;
  m.codes.assign(64, 8);  // q = 0 elsewhere
  for (int n = 0; n < 8; ++n) m.codes[n * 8 + 0] = static_cast<uint8_t>(q[n] + 8);  // input row 0
  m.zero_points.assign(8, 8);
  m.scales.assign(8, 0.5f);
  auto re = ExportQuarkLinear("p", m, Spec(true, 8), PackMethod::kReorder, DType::kBF16);
  ASSERT_TRUE(re.ok()) << re.error().message;
  const std::vector<uint32_t> w = Words(re->weight);
  ASSERT_EQ(w.size(), 8u);  // [K = 8, 1]
  EXPECT_EQ(w[0], 0xE31F7208u);
  EXPECT_EQ(static_cast<int32_t>(w[0]), -484478456);
  for (int k = 1; k < 8; ++k) EXPECT_EQ(w[k], 0u) << k;  // q = 0 → nibble 0
  EXPECT_EQ(Words(re->weight_zero_point), std::vector<uint32_t>{0u});  // all-zero zero points
  EXPECT_EQ(w[0] ^ 0x88888888u, 0x6B97FA80u);  // vLLM canonical uint4b8 (TV-3)

  auto ord = ExportQuarkLinear("p", m, Spec(true, 8), PackMethod::kOrder, DType::kBF16);
  ASSERT_TRUE(ord.ok());
  EXPECT_EQ(Words(ord->weight)[0], 0xE73210F8u);
  EXPECT_EQ(static_cast<int32_t>(Words(ord->weight)[0]), -416149256);
}

// ---- TV-5 and per-channel shapes -----------------------------------------------------------------

TEST(QuarkPackTest, Tv5Shapes) {
  auto s = QuarkLinearShapes(Spec(false, 128), /*n=*/14336, /*k=*/4096);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->weight, (std::vector<int64_t>{4096, 1792}));
  EXPECT_EQ(s->weight_scale, (std::vector<int64_t>{32, 14336}));
  EXPECT_EQ(s->weight_zero_point, (std::vector<int64_t>{32, 1792}));

  auto pc = QuarkLinearShapes(Spec(true, -1, QScheme::kPerChannel), 14336, 4096);
  ASSERT_TRUE(pc.ok());
  EXPECT_EQ(pc->weight, (std::vector<int64_t>{14336, 512}));
  EXPECT_EQ(pc->weight_scale, (std::vector<int64_t>{14336}));
  EXPECT_EQ(pc->weight_zero_point, (std::vector<int64_t>{1792}));

  auto row = QuarkLinearShapes(Spec(false, -1), 65, 96);  // per_group with g = K
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->weight, (std::vector<int64_t>{96, 9}));
  EXPECT_EQ(row->weight_scale, (std::vector<int64_t>{1, 65}));
  EXPECT_EQ(row->weight_zero_point, (std::vector<int64_t>{1, 9}));

  auto bad = QuarkLinearShapes(Spec(false, 128), 14336, 4000);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("K = 4000 is not aligned with group_size 128"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("N = 14336"), std::string::npos);
}

// ---- round trips ---------------------------------------------------------------------------------

// Scales not representable in F16/BF16: export rounds them.
Int4Matrix RandomMatrix(std::mt19937& rng, int64_t n, int64_t k, int64_t g, bool sym) {
  return nibble_test::RandomInt4Matrix(rng, n, k, g, sym, 1e-4f, 0.1f);
}

// Export → safetensors bytes → parse → import.
Result<Int4Matrix> RoundTrip(const Int4Matrix& m, const WeightQuantSpec& spec, PackMethod pack, DType dt,
                             std::vector<uint8_t>* image) {
  NIBBLE_ASSIGN_OR_RETURN(QuarkLinearTensors t, ExportQuarkLinear("model.layers.3.mlp.up_proj", m, spec, pack, dt));
  NIBBLE_ASSIGN_OR_RETURN(*image, SerializeSafetensors({&t.weight, &t.weight_scale, &t.weight_zero_point}, {}));
  NIBBLE_ASSIGN_OR_RETURN(SafetensorsHeader h, ParseSafetensors(image->data(), image->size(), "roundtrip.safetensors"));
  std::map<std::string, const TensorView*> by_name;
  for (const auto& v : h.tensors) by_name[v.name] = &v;
  QuarkLinearViews views{by_name["model.layers.3.mlp.up_proj.weight"], by_name["model.layers.3.mlp.up_proj.weight_scale"],
                         by_name["model.layers.3.mlp.up_proj.weight_zero_point"]};
  return ImportQuarkLinear(views, "model.layers.3.mlp.up_proj", spec, pack, m.n, m.k);
}

TEST(QuarkPackTest, RoundTripAwkwardShapes) {
  std::mt19937 rng(1234);
  const DType dts[3] = {DType::kF32, DType::kF16, DType::kBF16};
  int cases = 0;
  for (int64_t n : {1, 7, 8, 9, 63, 65, 130}) {  // 130: two full 64-row import tiles and a partial one
    for (int64_t g : {32, 64, 128, -1}) {
      for (int64_t k_mult : {1, 3}) {
        for (bool sym : {false, true}) {
          for (PackMethod pack : {PackMethod::kOrder, PackMethod::kReorder}) {
            for (QScheme qs : {QScheme::kPerGroup, QScheme::kPerChannel}) {
              if (qs == QScheme::kPerChannel && g != -1) continue;
              const int64_t k = (g == -1 ? 32 : g) * k_mult;
              const int64_t eff_g = g == -1 ? k : g;
              const DType dt = dts[cases % 3];
              Int4Matrix m = RandomMatrix(rng, n, k, eff_g, sym);
              std::vector<uint8_t> image;
              auto back = RoundTrip(m, Spec(sym, g, qs), pack, dt, &image);
              ASSERT_TRUE(back.ok()) << back.error().message;
              Int4Matrix want = m;
              for (auto& s : want.scales) s = RoundToDType(s, dt);
              EXPECT_TRUE(*back == want) << "n=" << n << " k=" << k << " g=" << g << " sym=" << sym
                                         << " pack=" << PackMethodName(pack) << " qscheme=" << QSchemeName(qs)
                                         << " scale dtype=" << DTypeName(dt);
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 7 * (3 * 2 * 2 * 2 + 2 * 2 * 2 * 2));
}

// Large enough (N·K >= 2^20) for the import's threaded tile loop; the result must not depend on
// the thread count.
TEST(QuarkPackTest, ThreadedImportRoundTripsAndMatchesOneThread) {
  std::mt19937 rng(77);
  for (PackMethod pack : {PackMethod::kOrder, PackMethod::kReorder}) {
    Int4Matrix m = RandomMatrix(rng, 520, 2048, 128, false);
    std::vector<uint8_t> image;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    auto two = RoundTrip(m, Spec(false, 128), pack, DType::kF32, &image);
    omp_set_num_threads(1);
    auto one = RoundTrip(m, Spec(false, 128), pack, DType::kF32, &image);
    omp_set_num_threads(saved);
    ASSERT_TRUE(two.ok() && one.ok());
    EXPECT_TRUE(*two == m) << PackMethodName(pack);
    EXPECT_TRUE(*one == *two) << PackMethodName(pack);
  }
}

TEST(QuarkPackTest, RoundTripThroughTensorStoreFile) {
  std::mt19937 rng(99);
  const Int4Matrix m = RandomMatrix(rng, 9, 64, 32, false);
  auto t = ExportQuarkLinear("model.layers.0.mlp.down_proj", m, Spec(false, 32), PackMethod::kReorder, DType::kBF16);
  ASSERT_TRUE(t.ok());
  const std::string path =
      (std::filesystem::temp_directory_path() / ("nibble_quark_pack_" + std::to_string(::getpid()) + ".safetensors")).string();
  ASSERT_TRUE(WriteSafetensors(path, {&t->weight, &t->weight_scale, &t->weight_zero_point}, {{"format", "pt"}}).ok());
  auto store = TensorStore::OpenFiles({path});
  ASSERT_TRUE(store.ok()) << store.error().message;
  auto back = ImportQuarkLinear(*store, "model.layers.0.mlp.down_proj", Spec(false, 32), PackMethod::kReorder, 9, 64);
  ASSERT_TRUE(back.ok()) << back.error().message;
  Int4Matrix want = m;
  for (auto& s : want.scales) s = RoundToDType(s, DType::kBF16);
  EXPECT_TRUE(*back == want);
  // A layer that is not in the file: the error names the tensor and the file set.
  auto missing = ImportQuarkLinear(*store, "model.layers.1.mlp.down_proj", Spec(false, 32), PackMethod::kReorder, 9, 64);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("tensor model.layers.1.mlp.down_proj.weight: missing"), std::string::npos)
      << missing.error().message;
  EXPECT_NE(missing.error().message.find(path), std::string::npos) << missing.error().message;
  std::filesystem::remove(path);
}

TEST(QuarkPackTest, PaddingNibblesAreIgnoredOnImport) {
  std::mt19937 rng(5);
  const Int4Matrix m = RandomMatrix(rng, 7, 32, 32, false);  // N = 7: nibble slot 7 of each word is padding
  auto t = ExportQuarkLinear("p", m, Spec(false, 32), PackMethod::kOrder, DType::kF32);
  ASSERT_TRUE(t.ok());
  for (size_t i = 0; i < t->weight.bytes.size(); i += 4) EXPECT_EQ(t->weight.bytes[i + 3] & 0xF0, 0) << "padding written as 0";
  for (size_t i = 0; i < t->weight.bytes.size(); i += 4) t->weight.bytes[i + 3] |= 0xA0;  // garbage in slot 7
  t->weight_zero_point.bytes[3] |= 0x50;
  TensorView w{t->weight.name, DType::kI32, t->weight.shape, t->weight.bytes.data(), t->weight.bytes.size(), ""};
  TensorView s{t->weight_scale.name, DType::kF32, t->weight_scale.shape, t->weight_scale.bytes.data(), t->weight_scale.bytes.size(), ""};
  TensorView z{t->weight_zero_point.name, DType::kI32, t->weight_zero_point.shape, t->weight_zero_point.bytes.data(),
               t->weight_zero_point.bytes.size(), ""};
  auto back = ImportQuarkLinear(QuarkLinearViews{&w, &s, &z}, "p", Spec(false, 32), PackMethod::kOrder, 7, 32);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_TRUE(*back == m);
}

// ---- import errors -------------------------------------------------------------------------------

struct Stored {
  QuarkLinearTensors t;
  TensorView w, s, z;
  QuarkLinearViews Views() {
    w = {t.weight.name, t.weight.dtype, t.weight.shape, t.weight.bytes.data(), t.weight.bytes.size(), "x.safetensors"};
    s = {t.weight_scale.name, t.weight_scale.dtype, t.weight_scale.shape, t.weight_scale.bytes.data(), t.weight_scale.bytes.size(), "x.safetensors"};
    z = {t.weight_zero_point.name, t.weight_zero_point.dtype, t.weight_zero_point.shape, t.weight_zero_point.bytes.data(),
         t.weight_zero_point.bytes.size(), "x.safetensors"};
    return {&w, &s, &z};
  }
};

Stored MakeStored(bool sym) {
  std::mt19937 rng(17);
  Stored st;
  st.t = ExportQuarkLinear("L", RandomMatrix(rng, 16, 64, 32, sym), Spec(sym, 32), PackMethod::kReorder, DType::kBF16).value();
  return st;
}

void ExpectImportError(Stored& st, bool sym, int64_t n, int64_t k, const std::vector<std::string>& fragments) {
  auto r = ImportQuarkLinear(st.Views(), "L", Spec(sym, 32), PackMethod::kReorder, n, k);
  ASSERT_FALSE(r.ok());
  for (const auto& f : fragments) EXPECT_NE(r.error().message.find(f), std::string::npos) << "missing \"" << f << "\" in: " << r.error().message;
}

TEST(QuarkImportErrorTest, WrongShape) {
  Stored st = MakeStored(false);
  st.t.weight.shape = {64, 1};  // N = 16 needs 2 words per row
  st.t.weight.bytes.resize(64 * 4);
  ExpectImportError(st, false, 16, 64, {"tensor L.weight (x.safetensors)", "shape [64, 1]", "expected [64, 2]", "uint4 per_group g=32, N=16, K=64"});
  st = MakeStored(false);
  ExpectImportError(st, false, 24, 64, {"tensor L.weight", "shape [64, 2]", "expected [64, 3]"});  // model says N = 24
  st = MakeStored(false);
  st.t.weight_scale.shape = {16, 2};  // not transposed
  ExpectImportError(st, false, 16, 64, {"tensor L.weight_scale", "shape [16, 2]", "expected [2, 16]"});
  st = MakeStored(false);
  st.t.weight_zero_point.shape = {2, 2, 1};
  ExpectImportError(st, false, 16, 64, {"tensor L.weight_zero_point", "expected [2, 2]"});
}

TEST(QuarkImportErrorTest, WrongDtypeAndMissing) {
  Stored st = MakeStored(false);
  st.t.weight.dtype = DType::kF32;
  ExpectImportError(st, false, 16, 64, {"tensor L.weight", "dtype F32, expected I32", "fake_quantized"});
  st = MakeStored(false);
  st.t.weight_scale.dtype = DType::kI16;
  ExpectImportError(st, false, 16, 64, {"tensor L.weight_scale", "dtype I16, expected F32, F16 or BF16"});
  st = MakeStored(false);
  st.t.weight_zero_point.dtype = DType::kF32;
  ExpectImportError(st, false, 16, 64, {"tensor L.weight_zero_point", "dtype F32, expected I32"});
  st = MakeStored(false);
  QuarkLinearViews v = st.Views();
  v.weight_zero_point = nullptr;
  auto r = ImportQuarkLinear(v, "L", Spec(false, 32), PackMethod::kReorder, 16, 64);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tensor L.weight_zero_point: missing; expected I32 [2, 2]"), std::string::npos) << r.error().message;
}

TEST(QuarkImportErrorTest, Int4NonZeroZeroPoint) {
  Stored st = MakeStored(true);
  // Zero-point word (group 1, outputs 8..15) gets nibble 3 at shift 4 → reorder element 2 → output 10.
  const uint32_t bad = 0x30;
  std::memcpy(st.t.weight_zero_point.bytes.data() + 3 * 4, &bad, 4);
  ExpectImportError(st, true, 16, 64, {"tensor L.weight_zero_point", "zero point nibble 3 out of range for symmetric int4",
                                       "group 1", "output 10"});
  // The same words are fine for uint4 (any nibble is a valid zero point).
  Stored ok = MakeStored(false);
  std::memcpy(ok.t.weight_zero_point.bytes.data() + 3 * 4, &bad, 4);
  EXPECT_TRUE(ImportQuarkLinear(ok.Views(), "L", Spec(false, 32), PackMethod::kReorder, 16, 64).ok());
}

TEST(QuarkImportErrorTest, NonFiniteScaleAndBadExpectedSizes) {
  Stored st = MakeStored(false);
  const uint16_t nan_bf16 = 0x7FC0;
  std::memcpy(st.t.weight_scale.bytes.data() + 2 * 5, &nan_bf16, 2);
  ExpectImportError(st, false, 16, 64, {"tensor L.weight_scale", "group 0, output 5", "finite"});
  st = MakeStored(false);
  ExpectImportError(st, false, 16, 48, {"L: Quark layout: input size K = 48 is not aligned with group_size 32"});
  st = MakeStored(false);
  ExpectImportError(st, false, 0, 64, {"N >= 1"});
}

TEST(QuarkExportErrorTest, InconsistentInputs) {
  std::mt19937 rng(3);
  Int4Matrix m = RandomMatrix(rng, 8, 64, 32, false);
  auto r = ExportQuarkLinear("L", m, Spec(true, 32), PackMethod::kOrder, DType::kBF16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("asymmetric"), std::string::npos) << r.error().message;
  r = ExportQuarkLinear("L", m, Spec(false, 64), PackMethod::kOrder, DType::kBF16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("group size 32 does not match"), std::string::npos) << r.error().message;
  r = ExportQuarkLinear("L", m, Spec(false, 32), PackMethod::kOrder, DType::kI8);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("scale dtype I8"), std::string::npos);
  m.codes[70] = 16;
  r = ExportQuarkLinear("L", m, Spec(false, 32), PackMethod::kOrder, DType::kBF16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("L: codes[1][6] = 16 out of range 0..15"), std::string::npos) << r.error().message;
  m.codes[70] = 1;
  m.scales[0] = 1e6f;
  r = ExportQuarkLinear("L", m, Spec(false, 32), PackMethod::kOrder, DType::kF16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("overflows F16"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace nibble
