// The vectorised row ops' entry points (through the dispatch decision) and their baseline build
// (compiled with the default flags: SSE2 on x86-64). See kernels/vec_ops.h.
#include "kernels/vec_ops.h"

#include "kernels/int4_dispatch.h"
#include "kernels/vec_ops_impl.h"

namespace nibble {

VecKernels VecKernelsScalar() { return VecKernelsOfThisUnit("scalar"); }

void ExpShiftedInPlace(float* row, int64_t n, float shift) { ActiveW4Dispatch().kernels.vec.exp_shifted(row, n, shift); }

void ScaledSoftmaxRow(float* row, int64_t valid, int64_t len, float scale) {
  ActiveW4Dispatch().kernels.vec.scaled_softmax_row(row, valid, len, scale);
}

double SquaredErrorSum(const float* a, const float* b, int64_t n) {
  return ActiveW4Dispatch().kernels.vec.squared_error_sum(a, b, n);
}

bool RtnRowRange(const uint8_t* src, RowDType dtype, int64_t k, int64_t g, float* x, float* mn, float* mx) {
  return ActiveW4Dispatch().kernels.vec.rtn_row_range(src, dtype, k, g, x, mn, mx);
}

void RtnRowCodes(const float* x, int64_t k, int64_t g, const float* s, const float* inv, const float* z, bool symmetric,
                 uint8_t* codes, double* num, double* den) {
  ActiveW4Dispatch().kernels.vec.rtn_row_codes(x, k, g, s, inv, z, symmetric, codes, num, den);
}

void RtnRowDequantDiv(const uint8_t* codes, int64_t k, int64_t g, const float* s, const int32_t* zp, const float* d,
                      float* out) {
  ActiveW4Dispatch().kernels.vec.rtn_row_dequant_div(codes, k, g, s, zp, d, out);
}

}  // namespace nibble
