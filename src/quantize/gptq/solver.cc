// GPTQ for one linear (see solver.h).
#include "quantize/gptq/solver.h"

#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "formats/rtn.h"
#include "kernels/dense_gemm.h"

namespace nibble {

namespace {

// A factor's diagonal is finite and positive (LAPACK returned success on a usable factor).
bool PositiveDiagonal(const std::vector<float>& a, int64_t k) {
  for (int64_t i = 0; i < k; ++i)
    if (!std::isfinite(a[i * k + i]) || !(a[i * k + i] > 0)) return false;
  return true;
}

// a (symmetric, damped) -> the upper Cholesky factor of a⁻¹ in a's row-major upper triangle.
// LAPACK is column-major: a symmetric matrix reads the same either way, and the column-major
// lower factor L of a⁻¹ (a⁻¹ = L Lᵀ) read row-major is U = Lᵀ. false when a step fails.
bool InverseCholeskyUpper(std::vector<float>& a, int64_t k) {
  const lapack_int n = static_cast<lapack_int>(k);
  if (LAPACKE_spotrf(LAPACK_COL_MAJOR, 'L', n, a.data(), n) != 0) return false;
  if (LAPACKE_spotri(LAPACK_COL_MAJOR, 'L', n, a.data(), n) != 0) return false;
  for (int64_t j = 0; j < k; ++j)  // mirror the column-major lower triangle of a⁻¹ into the upper
    for (int64_t i = j + 1; i < k; ++i) a[i * k + j] = a[j * k + i];
  if (LAPACKE_spotrf(LAPACK_COL_MAJOR, 'L', n, a.data(), n) != 0) return false;
  return PositiveDiagonal(a, k);
}

// The same U with half the arithmetic. A row-major matrix's elements in reverse order are J·A·J
// (J the reversal permutation). LAPACK's upper Cholesky of H' = J·H·J (column-major H' = U'ᵀU')
// read row-major is the lower L' = U'ᵀ, its triangular inverse L'⁻¹; reversed back, J·L'⁻¹·J is
// upper and is U: H = V·Vᵀ with V = J·L'·J upper, so H⁻¹ = V⁻ᵀ·V⁻¹ = Uᵀ·U with U = V⁻¹.
bool ReversedCholeskyUpper(std::vector<float>& a, int64_t k) {
  const lapack_int n = static_cast<lapack_int>(k);
  std::reverse(a.begin(), a.end());
  if (LAPACKE_spotrf(LAPACK_COL_MAJOR, 'U', n, a.data(), n) != 0) return false;
  if (LAPACKE_strtri(LAPACK_COL_MAJOR, 'U', 'N', n, a.data(), n) != 0) return false;
  std::reverse(a.begin(), a.end());
  return PositiveDiagonal(a, k);
}

}  // namespace

Result<GptqFactor> FactorGptqHessian(std::vector<float> h, int64_t k, const GptqSettings& s, GptqFactorization how) {
  if (k < 1 || static_cast<int64_t>(h.size()) != k * k)
    return MakeError("GPTQ Hessian has ", h.size(), " entries, expected ", k, " x ", k);
  for (size_t i = 0; i < h.size(); ++i)
    if (!std::isfinite(h[i])) return MakeError("GPTQ Hessian entry [", i / k, "][", i % k, "] = ", h[i], " is not finite");
  GptqFactor f;
  f.k = k;
  for (int64_t j = 0; j < k; ++j)
    if (h[j * k + j] == 0.0f) {
      h[j * k + j] = 1.0f;
      f.dead.push_back(j);
    }
  f.perm.resize(static_cast<size_t>(k));
  std::iota(f.perm.begin(), f.perm.end(), int64_t{0});
  if (s.actorder != GptqActOrder::kNone) {
    std::stable_sort(f.perm.begin(), f.perm.end(), [&](int64_t a, int64_t b) { return h[a * k + a] > h[b * k + b]; });
    std::vector<float> p(h.size());
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) p[i * k + j] = h[f.perm[i] * k + f.perm[j]];
    h = std::move(p);
  }
  double mean = 0;
  for (int64_t j = 0; j < k; ++j) mean += h[j * k + j];
  mean /= static_cast<double>(k);
  for (double frac = s.dampening_frac; frac < 1.0; frac += s.damp_increment, ++f.retries) {
    std::vector<float> a = h;
    const float damp = static_cast<float>(frac * mean);
    for (int64_t j = 0; j < k; ++j) a[j * k + j] += damp;
    if (how == GptqFactorization::kReversedCholesky ? ReversedCholeskyUpper(a, k) : InverseCholeskyUpper(a, k)) {
      f.u = std::move(a);
      f.dampening_frac = frac;
      return f;
    }
    if (s.damp_increment <= 0) break;
  }
  f.fallback_rtn = true;
  return f;
}

namespace {

// The column loop's state: Wᵀ in the processing order, group parameters as the loop uses them.
// by_position: act-order group, where position i of the order is in group i / g (else column
// perm[i] is in group perm[i] / g).
struct ColumnLoop {
  int64_t n, k, g, groups;
  bool sym, by_position;
  std::vector<float> wt;   // [K, N], row i = column perm[i] of W
  std::vector<float> inv;  // [N, G] fp32(1 / scale)
  std::vector<float> z;    // [N, G] zero point added before rounding (uint4), 0 for int4
};

void SetGroupParams(ColumnLoop& L, const Int4Matrix& m, int64_t gi, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t idx = r * L.groups + gi;
    L.inv[idx] = 1.f / m.scales[idx];
    L.z[idx] = L.sym ? 0.f : static_cast<float>(m.zero_points[idx]);
  }
}

// GPTQModel's refit at a group's first position in the loop's order (act-order none or group),
// for rows [r0, r1): from W as it stood at the start of the current block for the block's
// positions (in-block updates not yet applied), the current W beyond it.
Status RefitGroup(ColumnLoop& L, Int4Matrix& m, int64_t gi, int64_t i1, int64_t i2, const std::vector<float>& start,
                  const QuantSpec& spec, DType dt, int64_t r0, int64_t r1) {
  const int64_t rows = r1 - r0;
  std::vector<float> buf(static_cast<size_t>(rows * L.g));
  for (int64_t t = 0; t < L.g; ++t) {
    const int64_t p = gi * L.g + t;
    const float* src = p < i2 ? &start[(p - i1) * L.n] : &L.wt[p * L.n];
    for (int64_t r = r0; r < r1; ++r) buf[(r - r0) * L.g + t] = src[r];
  }
  QuantSpec one = spec;
  one.group_size = spec.granularity == Granularity::kPerChannel ? -1 : L.g;
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix q, QuantizeRtnRef(buf.data(), rows, L.g, one, dt));
  for (int64_t r = r0; r < r1; ++r) {
    m.scales[r * L.groups + gi] = q.scales[r - r0];
    m.zero_points[r * L.groups + gi] = q.zero_points[r - r0];
  }
  SetGroupParams(L, m, gi, r0, r1);
  return Status::Ok();
}

// Position i (column c = perm[i]) for rows [r0, r1): its codes into m.codes, (w − ŵ) / d into e,
// then the block's later columns j < i2 updated by e · U[i][j].
void QuantizeColumn(ColumnLoop& L, Int4Matrix& m, const std::vector<float>& u, int64_t i, int64_t c, int64_t i2,
                    float* e, int64_t r0, int64_t r1) {
  const int64_t gi = L.by_position ? i / L.g : c / L.g;
  const float d = u[i * L.k + i];
  const float* row = &L.wt[i * L.n];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t idx = r * L.groups + gi;
    const uint8_t code = QuarkCode(row[r], L.inv[idx], L.z[idx], L.sym);
    m.codes[r * L.k + c] = code;
    const float deq = (static_cast<float>(code) - static_cast<float>(m.zero_points[idx])) * m.scales[idx];
    e[r] = (row[r] - deq) / d;
  }
  for (int64_t j = i + 1; j < i2; ++j) {
    const float uij = u[i * L.k + j];
    float* dst = &L.wt[j * L.n];
    for (int64_t r = r0; r < r1; ++r) dst[r] -= e[r] * uij;
  }
}

// One block [i1, i2) of the column loop. Every step is independent across rows of W, so fixed
// 64-row tiles run the whole block in parallel (one parallel region per block, not per column).
Status RunBlock(ColumnLoop& L, Int4Matrix& m, const GptqFactor& f, int64_t i1, int64_t i2, bool dynamic,
                const std::vector<float>& start, std::vector<float>& err, const QuantSpec& spec, DType dt) {
  constexpr int64_t kRows = 64;
  const int64_t tiles = (L.n + kRows - 1) / kRows;
  std::vector<Status> status(static_cast<size_t>(tiles), Status::Ok());
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r0 = t * kRows, r1 = std::min(L.n, r0 + kRows);
    for (int64_t i = i1; i < i2; ++i) {
      const int64_t c = f.perm[i];
      if (dynamic && i % L.g == 0) {  // dynamic runs in natural or act-order group order only
        status[t] = RefitGroup(L, m, i / L.g, i1, i2, start, spec, dt, r0, r1);
        if (!status[t].ok()) break;
      }
      QuantizeColumn(L, m, f.u, i, c, i2, &err[(i - i1) * L.n], r0, r1);
    }
  }
  for (const Status& st : status) NIBBLE_RETURN_IF_ERROR(st);
  return Status::Ok();
}

// Wᵀ[i2:, :] −= U[i1:i2, i2:]ᵀ · Err: fixed 256-column tiles of N, each one sgemm in its own
// thread, so the sums are the same for any thread count.
void LazyBlockUpdate(ColumnLoop& L, const std::vector<float>& u, int64_t i1, int64_t i2, std::vector<float>& err) {
  constexpr int64_t kTile = 256;
  const int64_t cnt = i2 - i1, rest = L.k - i2, tiles = (L.n + kTile - 1) / kTile;
  for (int64_t i = 0; i < cnt * L.n; ++i) err[i] = -err[i];
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n0 = t * kTile, nt = std::min(kTile, L.n - n0);
    SgemmAtB(rest, nt, cnt, &u[i1 * L.k + i2], L.k, &err[n0], L.n, 1.0f, &L.wt[i2 * L.n + n0], L.n);
  }
}

// Act-order group's up-front parameters: RTN over W with its columns in the loop's order, so
// group j holds positions [j g, (j + 1) g); the codes come back at their own columns with
// g_idx[perm[i]] = i / g.
Result<Int4Matrix> ActOrderGroupRtn(const float* w, int64_t n, int64_t k, const std::vector<int64_t>& perm,
                                    const QuantSpec& spec, DType dt) {
  std::vector<float> wp(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) wp[r * k + i] = w[r * k + perm[i]];
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m, QuantizeRtnRef(wp.data(), n, k, spec, dt));
  std::vector<uint8_t> codes(m.codes.size());
  m.g_idx.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    m.g_idx[perm[i]] = static_cast<int32_t>(i / m.group_size);
    for (int64_t r = 0; r < n; ++r) codes[r * k + perm[i]] = m.codes[r * k + i];
  }
  m.codes = std::move(codes);
  return m;
}

}  // namespace

Result<Int4Matrix> GptqQuantize(const float* w, int64_t n, int64_t k, const GptqFactor& f, const QuantSpec& spec,
                                DType dt, const GptqSettings& s) {
  if (f.k != k || static_cast<int64_t>(f.perm.size()) != k || (!f.fallback_rtn && static_cast<int64_t>(f.u.size()) != k * k))
    return MakeError("GPTQ factor is for K = ", f.k, ", the weight has K = ", k);
  const bool by_position = s.actorder == GptqActOrder::kGroup;
  NIBBLE_ASSIGN_OR_RETURN(Int4Matrix m, by_position ? ActOrderGroupRtn(w, n, k, f.perm, spec, dt) : QuantizeRtnRef(w, n, k, spec, dt));
  if (f.fallback_rtn) return m;
  ColumnLoop L{n, k, m.group_size, m.groups(), m.symmetric, by_position, {}, {}, {}};
  L.inv.resize(static_cast<size_t>(n * L.groups));
  L.z.resize(L.inv.size());
  for (int64_t gi = 0; gi < L.groups; ++gi) SetGroupParams(L, m, gi, 0, n);
  std::vector<char> dead(static_cast<size_t>(k), 0);
  for (int64_t c : f.dead) dead[c] = 1;
  L.wt.resize(static_cast<size_t>(k * n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < k; ++i) {
    const int64_t c = f.perm[i];
    for (int64_t r = 0; r < n; ++r) L.wt[i * n + r] = dead[c] ? 0.f : w[r * k + c];
  }
  const bool dynamic = s.scale_timing == GptqScaleTiming::kDynamic;
  std::vector<float> err(static_cast<size_t>(s.block_size * n)), start;
  for (int64_t i1 = 0; i1 < k; i1 += s.block_size) {
    const int64_t i2 = std::min(k, i1 + s.block_size);
    if (dynamic) start.assign(L.wt.begin() + i1 * n, L.wt.begin() + i2 * n);
    NIBBLE_RETURN_IF_ERROR(RunBlock(L, m, f, i1, i2, dynamic, start, err, spec, dt));
    if (i2 < k) LazyBlockUpdate(L, f.u, i1, i2, err);
  }
  return m;
}

}  // namespace nibble
