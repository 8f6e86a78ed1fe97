// Int4Linear against a dense linear on the same dequantized weights: GEMV (M = 1) and GEMM
// (M > 1) paths, bias added exactly once, and GEMV and prefill results independent of the thread
// count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>
#include <random>
#include <tuple>

#include "formats/int4_matrix.h"
#include "model/int4_linear.h"
#include "model/linear.h"
#include "model/workspace.h"
#include "kernels/dense_gemm.h"
#include "kernels/int4_dispatch.h"
#include "kernels/int4_gemm.h"
#include "kernels/bf16_gemv.h"

namespace nibble {
namespace {

Int4Matrix RandomMatrix(int64_t n, int64_t k, int64_t g, bool sym, uint32_t seed) {
  std::mt19937 rng(seed);
  Int4Matrix m;
  m.n = n;
  m.k = k;
  m.group_size = g;
  m.symmetric = sym;
  m.codes.resize(n * k);
  for (auto& c : m.codes) c = static_cast<uint8_t>(rng() & 15);
  std::uniform_real_distribution<float> s(0.001f, 0.05f);
  m.scales.resize(n * (k / g));
  for (auto& v : m.scales) v = s(rng);
  m.zero_points.resize(n * (k / g));
  for (auto& z : m.zero_points) z = sym ? 8 : static_cast<uint8_t>(rng() & 15);
  return m;
}

// Act-order: column k in group g_idx[k] (alternating groups, K = 256, g = 128). The dense oracle
// dequantizes through g_idx with its own loop; weight() gives the g_idx matrix back exactly.
TEST(Int4Linear, ActOrderGIdxRunsThroughItsGroups) {
  Int4Matrix w = RandomMatrix(40, 256, 128, false, 11);
  w.g_idx.resize(256);
  for (int64_t c = 0; c < 256; ++c) w.g_idx[c] = static_cast<int32_t>(c % 2);
  ASSERT_TRUE(ValidateInt4Matrix(w, "w").ok());
  EXPECT_FALSE(HasNaturalGroups(w));
  auto dense_w = std::make_shared<std::vector<float>>(40 * 256);
  for (int64_t r = 0; r < 40; ++r)
    for (int64_t c = 0; c < 256; ++c) {
      const int64_t gi = r * 2 + c % 2;
      (*dense_w)[r * 256 + c] = static_cast<float>(int{w.codes[r * 256 + c]} - int{w.zero_points[gi]}) * w.scales[gi];
    }
  std::vector<float> ref(40 * 256);
  DequantizeRef(w, ref.data());
  EXPECT_EQ(ref, *dense_w);
  DenseLinear dense(40, 256, dense_w, {});
  Int4Linear q(w, {}, "test");
  EXPECT_EQ(q.weight(), w);
  for (int64_t m : {1, 3, 70}) {
    std::vector<float> x(m * 256), y1(m * 40), y2(m * 40);
    std::mt19937 rng(static_cast<uint32_t>(m));
    std::normal_distribution<float> d(0, 1);
    for (auto& v : x) v = d(rng);
    dense.Forward(x.data(), m, y1.data());
    q.Forward(x.data(), m, y2.data());
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_NEAR(y1[i], y2[i], 1e-3) << "M=" << m << " element " << i;
  }
  // A group holding other than g columns is refused.
  w.g_idx[0] = 1;
  const Status bad = ValidateInt4Matrix(w, "layer");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("group_size = 128"), std::string::npos) << bad.error().message;
}

TEST(Int4Linear, MatchesDenseOnDequantizedWeightsWithBiasOnce) {
  for (int64_t m : {1, 2, 7}) {
    for (auto [n, k, g] : {std::tuple<int64_t, int64_t, int64_t>{65, 96, 32}, {130, 256, 128}, {9, 64, 64}}) {
      Int4Matrix w = RandomMatrix(n, k, g, m % 2 == 0, static_cast<uint32_t>(n * 31 + k + m));
      std::vector<float> bias(n);
      std::mt19937 rng(7);
      std::normal_distribution<float> d(0, 1);
      for (auto& b : bias) b = d(rng);
      std::vector<float> x(m * k);
      for (auto& v : x) v = d(rng);
      auto dense_w = std::make_shared<std::vector<float>>(n * k);
      DequantizeRef(w, dense_w->data());
      DenseLinear dense(n, k, dense_w, bias);
      Int4Linear q(w, bias, "test");
      std::vector<float> y1(m * n), y2(m * n);
      dense.Forward(x.data(), m, y1.data());
      q.Forward(x.data(), m, y2.data());
      double scale = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = std::fabs(bias[j]);
          for (int64_t kk = 0; kk < k; ++kk) s += std::fabs(x[i * k + kk] * (*dense_w)[j * k + kk]);
          scale = std::max(scale, s);
        }
      const double tol = 2.0 * (k + 2) * 1.2e-7 * scale;  // two fp32 sums of K terms, different order
      for (size_t i = 0; i < y1.size(); ++i)
        ASSERT_NEAR(y1[i], y2[i], tol) << "M=" << m << " N=" << n << " K=" << k << " element " << i;
    }
  }
}

TEST(Int4Linear, GemvIndependentOfThreadCount) {
  Int4Matrix w = RandomMatrix(1000, 256, 32, false, 3);
  Int4Linear q(w, {}, "test");
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  std::vector<float> a(1000), b(1000);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  q.Forward(x.data(), 1, a.data());
  omp_set_num_threads(2);
  q.Forward(x.data(), 1, b.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(a, b);
}

// Linears of one input (q / k / v, gate / up) through ForwardSameInput, for each way the fused
// kernels take their rows (fp32; int8; bf16: the bf16 kernels' rows, or the rows rounded to bf16
// through the W4A32 kernels on CPUs without them): one prepared input and one parallel pass, and
// every output has the bits of its own Forward at 1 and 2 threads, with and without bias, N off
// the block size, M = 1 and 3. A dense linear, a different K, a linear prepared another way or
// the prefill row count among them: each Forward in turn, the same outputs.
TEST(Int4Linear, SameInputForwardsGiveEachLinearsOwnBits) {
  const int64_t k = 384;
  Int4Linear q(RandomMatrix(300, k, 128, true, 21), std::vector<float>(300, 0.25f), "q");
  Int4Linear kp(RandomMatrix(64, k, 128, false, 22), {}, "k");
  Int4Linear v(RandomMatrix(72, k, 128, true, 23), {}, "v");
  Int4Linear other_k(RandomMatrix(64, 256, 128, true, 24), {}, "k256");
  Int4Linear other_way(RandomMatrix(40, k, 128, false, 25), {}, "other");
  DenseLinear dense(50, k, std::make_shared<const std::vector<float>>(50 * k, 0.01f), {});
  const int64_t m_prefill = std::max(Int4Linear::Bf16MatmulMinRows(128), Int4Linear::kDequantGemmMinRows);
  std::vector<float> x(static_cast<size_t>(m_prefill * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 7 == 0 ? 9.f : 1.f);
  const auto check = [&](std::vector<const Linear*> ls, int64_t m, int threads, const char* mode) {
    std::vector<std::vector<float>> want, got;
    std::vector<float*> ys;
    for (const Linear* l : ls) {
      want.emplace_back(static_cast<size_t>(m * l->out_features()));
      got.emplace_back(static_cast<size_t>(m * l->out_features()), -1.f);
      l->Forward(x.data(), m, want.back().data());
    }
    for (auto& g : got) ys.push_back(g.data());
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Workspace ws;
    ForwardSameInput(ls.data(), ys.data(), static_cast<int64_t>(ls.size()), x.data(), m, ws);
    omp_set_num_threads(saved);
    for (size_t i = 0; i < ls.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * 4), 0)
          << mode << ": " << ls[i]->Describe() << " m=" << m << " threads=" << threads;
  };
  for (const char* mode : {"fp32", "int8", "bf16"}) {
    const std::string md = mode;
    for (Int4Linear* l : {&q, &kp, &v, &other_k}) {
      l->SetInt8Activations(false);
      l->SetBf16Activations(false);
      ASSERT_TRUE(md != "int8" || l->SetInt8Activations(true)) << mode;
      ASSERT_TRUE(md != "bf16" || l->SetBf16Activations(true)) << mode;
    }
    // Prepared the other way round: never shares a pass with the others.
    if (md == "int8") other_way.SetBf16Activations(true);
    else other_way.SetInt8Activations(true);
    const Int4Linear::Route route = q.RouteFor(1);
    EXPECT_EQ(route, md == "fp32"   ? Int4Linear::Route::kFusedFp32
                     : md == "int8" ? Int4Linear::Route::kFusedInt8
                     : q.Bf16KernelServes(1) ? Int4Linear::Route::kFusedBf16
                                             : Int4Linear::Route::kFusedRoundedBf16);
    for (int threads : {1, 2})
      for (int64_t m : {int64_t{1}, int64_t{3}}) {
        check({&q, &kp, &v}, m, threads, mode);
        check({&kp, &q}, m, threads, mode);
        check({&q, &dense, &v}, m, threads, mode);
        check({&q, &other_way}, m, threads, mode);
      }
    check({&q, &other_k}, 1, 2, mode);  // K differs: no shared row (each Forward reads its own K)
    check({&q, &kp, &v}, m_prefill, 2, mode);
  }
}

// Prefill rows (the dequantized-weight GEMM, and the bf16 route of every CPU) at a width where
// oneDNN's threaded sgemm splits K by the thread count: the same bits on 1, 2 and 3 threads; so
// does the dense fp32 linear.
TEST(Int4Linear, PrefillIndependentOfThreadCount) {
  const int64_t n = 2048, k = 2048, m = 96;
  const Int4Matrix w = RandomMatrix(n, k, 128, false, 11);
  std::vector<float> x(m * k);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<float> dense(n * k);
  Int4Linear q(w, {}, "int4");
  DequantW4Packed(q.packed(), dense.data());
  const DenseLinear fp(n, k, std::make_shared<const std::vector<float>>(dense), {});
  const int saved = omp_get_max_threads();
  for (const int mode : {0, 1, 2}) {  // int4 fp32 activations, int4 bf16, dense fp32
    if (mode == 1 && !q.SetBf16Activations(true)) continue;
    std::vector<float> one(m * n);
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> y(m * n);
      if (mode == 2) {
        fp.Forward(x.data(), m, y.data());
      } else {
        q.Forward(x.data(), m, y.data());
      }
      if (threads == 1) one = y;
      EXPECT_EQ(std::memcmp(y.data(), one.data(), y.size() * sizeof(float)), 0) << "mode " << mode << ", " << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// From kDequantGemmMinRows rows on, the weight is dequantized and multiplied in tiles of
// LinearTileRows rows: each output element is the same dot product as the GEMM of that tile of
// the whole dequantized matrix, so the results are bit-identical, and the workspace holds a
// tile, not the matrix. fp32 (dequantized fp32 tiles, sgemm) and bf16 activations (bf16 tiles,
// oneDNN's bf16 matmul or the fp32 GEMM on the same values; on Intel without AMX the fp32 path on
// the bf16-rounded rows).
TEST(Int4Linear, TiledDequantGemmEqualsTheWholeMatrixGemmInBoundedScratch) {
  // A tile budget of 512 KiB: tiles of kLinearTileMinRows rows (K = 256), five of them.
  const int64_t k = 256, n = 4 * kLinearTileMinRows + 37, m = 130, budget = 512 << 10;
  ASSERT_EQ(LinearTileRows(n, k, 2, budget), kLinearTileMinRows);
  ASSERT_EQ(LinearTileRows(n, k, 4, budget), kLinearTileMinRows);
  const Int4Matrix w = RandomMatrix(n, k, 128, false, 5);
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(m * k), bias(n);
  for (float& v : x) v = nd(rng);
  for (float& v : bias) v = nd(rng);
  for (const bool bf16 : {false, true}) {
    Int4Linear q(w, bias, "int4");
    if (bf16 && !q.SetBf16Activations(true)) continue;
    ASSERT_GE(m, bf16 ? Int4Linear::Bf16MatmulMinRows(128) : Int4Linear::kDequantGemmMinRows);
    // The whole-matrix oracle, as Forward ran before tiling.
    std::vector<float> want(m * n);
    // Intel without AMX: bf16 prefill is the fp32 path on the bf16-rounded rows.
    const bool wide = !bf16 || ActiveW4Dispatch().kernels.bf16_prefill_sgemm;
    if (wide) {
      std::vector<float> dense(n * k), xr(x);
      if (bf16) RoundToBf16(x.data(), m * k, xr.data());
      DequantW4Packed(q.packed(), dense.data());
      // The fp32 GEMM runs per weight tile (SgemmXWtTiled's grid follows each tile's shape).
      const int64_t rows = LinearTileRows(n, k, 4, budget);
      for (int64_t n0 = 0; n0 < n; n0 += rows)
        SgemmXWtTiled(m, std::min(rows, n - n0), k, xr.data(), k, dense.data() + n0 * k, k, want.data() + n0, n);
    } else {
      std::vector<uint16_t> xb(m * k), wb(n * k);
      ToBf16Bits(x.data(), m * k, xb.data());
      DequantW4PackedBf16(q.packed(), wb.data());
      if (!GemmBf16XWt(m, n, k, xb.data(), wb.data(), want.data())) {
        std::vector<float> xf(m * k), wf(n * k);
        Bf16ToF32Rows(xb.data(), m, k, xf.data());
        Bf16ToF32Rows(wb.data(), n, k, wf.data());
        // SgemmWidenedBf16: tiles of LinearTileRows(n, k, 4) rows, x in blocks of kWidenedRows.
        const int64_t rows = LinearTileRows(n, k, 4, budget);
        for (int64_t n0 = 0; n0 < n; n0 += rows)
          for (int64_t r0 = 0; r0 < m; r0 += kWidenedRows)
            SgemmXWtTiled(std::min(kWidenedRows, m - r0), std::min(rows, n - n0), k, xf.data() + r0 * k, k,
                          wf.data() + n0 * k, k, want.data() + r0 * n + n0, n);
      }
    }
    AddBiasRows(want.data(), m, n, bias.data());
    Workspace ws;
    ws.set_tile_bytes(budget);
    std::vector<float> got(m * n);
    q.Forward(x.data(), m, got.data(), &ws);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "bf16 " << bf16;
    // Scratch: the input rows (bf16 or aligned), one tile and one tile of output rows at most.
    const int64_t tile = LinearTileRows(n, k, wide ? 4 : 2, budget);
    EXPECT_LE(ws.bytes(), tile * k * (wide ? 4 : 2) + m * k * 4 + m * tile * 4) << "bf16 " << bf16;
    EXPECT_LT(ws.bytes(), n * k * 2) << "bf16 " << bf16 << ": the scratch holds the whole matrix";
    // The workspace is reused: a second call grows nothing and gives the same bits.
    const int64_t held = ws.bytes();
    std::vector<float> again(m * n);
    q.Forward(x.data(), m, again.data(), &ws);
    EXPECT_EQ(ws.bytes(), held);
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace nibble
