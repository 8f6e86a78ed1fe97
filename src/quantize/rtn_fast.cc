#include "quantize/rtn_fast.h"

#include <cfenv>
#include <cmath>

#include "formats/rtn.h"
#include "kernels/vec_ops.h"

namespace nibble {

namespace {

// Restores the caller's rounding mode (the codes need round to nearest even).
class NearestRounding {
 public:
  NearestRounding() : saved_(std::fegetround()) {
    if (saved_ != FE_TONEAREST) std::fesetround(FE_TONEAREST);
  }
  ~NearestRounding() {
    if (saved_ != FE_TONEAREST) std::fesetround(saved_);
  }
  NearestRounding(const NearestRounding&) = delete;
  NearestRounding& operator=(const NearestRounding&) = delete;

 private:
  int saved_;
};

// The fast pass; false where the reference must speak (a non-finite value, an overflowing scale).
bool FastRtn(const TensorView& t, RowDType dtype, const QuantSpec& spec, DType scale_dtype, Int4Matrix* m, double* num,
             double* den) {
  const int64_t n = t.shape[0], k = t.shape[1], g = spec.EffectiveGroupSize(k), groups = k / g;
  const size_t es = DTypeSize(t.dtype);
  m->n = n;
  m->k = k;
  m->group_size = g;
  m->symmetric = spec.symmetric;
  m->g_idx.clear();
  m->codes.resize(static_cast<size_t>(n * k));
  m->scales.resize(static_cast<size_t>(n * groups));
  m->zero_points.resize(static_cast<size_t>(n * groups));
  std::vector<float> x(static_cast<size_t>(k)), mn(static_cast<size_t>(groups)), mx(mn.size()), inv(mn.size()),
      z(mn.size());
  NearestRounding nearest;
  for (int64_t r = 0; r < n; ++r) {
    if (!RtnRowRange(t.data + static_cast<size_t>(r * k) * es, dtype, k, g, x.data(), mn.data(), mx.data())) return false;
    float* s = m->scales.data() + r * groups;
    for (int64_t j = 0; j < groups; ++j) {
      RtnGroupParams p;
      if (!RtnGroupOf(mn[j], mx[j], spec.symmetric, scale_dtype, &p)) return false;
      s[j] = p.s;
      inv[j] = p.inv;
      z[j] = p.z;
      m->zero_points[r * groups + j] = static_cast<uint8_t>(spec.symmetric ? 8 : static_cast<int>(p.z));
    }
    RtnRowCodes(x.data(), k, g, s, inv.data(), z.data(), spec.symmetric, m->codes.data() + r * k, num, den);
  }
  return true;
}

}  // namespace

double RelWeightErrorOf(double num, double den) { return den > 0 ? std::sqrt(num / den) : 0.0; }

double RelWeightError(const std::vector<float>& w, const Int4Matrix& q) {
  std::vector<float> deq(w.size());
  DequantizeRef(q, deq.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double d = static_cast<double>(w[i]) - deq[i];
    num += d * d;
    den += static_cast<double>(w[i]) * w[i];
  }
  return RelWeightErrorOf(num, den);
}

bool QuantizeRtnFast(const TensorView& t, const QuantSpec& spec, DType scale_dtype, Int4Matrix* out, double* rel_error) {
  const bool float_2d = t.shape.size() == 2 &&
                        (t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16) &&
                        t.nbytes == static_cast<size_t>(t.numel()) * DTypeSize(t.dtype);
  if (!float_2d || !CheckRtnArgs(t.shape[0], t.shape[1], spec, scale_dtype).ok()) return false;
  const RowDType dtype = t.dtype == DType::kF32 ? RowDType::kF32 : t.dtype == DType::kBF16 ? RowDType::kBF16 : RowDType::kF16;
  double num = 0, den = 0;
  if (!FastRtn(t, dtype, spec, scale_dtype, out, &num, &den)) return false;
  *rel_error = RelWeightErrorOf(num, den);
  return true;
}

}  // namespace nibble
