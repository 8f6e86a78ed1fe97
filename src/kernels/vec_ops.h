// Vectorised row operations of the forward pass, of RTN and of AWQ: exp of a shifted row (softmax,
// SiLU), the attention softmax row, a squared-error sum, RTN's row passes and AWQ's candidate
// rows. One source of the arithmetic (kernels/vec_ops_impl.h) is compiled once per ISA — baseline
// x86-64 / scalar, AVX2, AVX-512 — and the table is chosen by the W4A32 dispatch decision
// (kernels/int4_dispatch.h), so NIBBLE_ISA forces it and `nibble inspect --kernels` reports it.
// Every ISA gives the same bits: contraction into FMA is off and every reduction's lane structure
// is fixed in the source, not by the vector width.
#pragma once

#include <cstdint>

namespace nibble {

/// row[i] = ExpF(row[i] + shift) for i < n (kernels/exp_f.h), bit for bit.
void ExpShiftedInPlace(float* row, int64_t n, float shift);

/// Causal softmax of one attention score row, in place: row[i] *= scale for i < valid, then
/// ExpF(row[i] − max), then times 1 / sum; row[i] = 0 for valid <= i < len. Max and sum run over
/// 16 lanes (lane l takes the elements i ≡ l mod 16 of the leading multiple of 16, in order), then
/// the tail in order, then the lanes 0..15 in order — a different summation order from
/// model/ops.h SoftmaxRow, so the same values up to rounding.
void ScaledSoftmaxRow(float* row, int64_t valid, int64_t len, float scale);

/// Σ (a[i] − b[i])² in double: 8 lanes (lane l takes the elements i ≡ l mod 8 of the leading
/// multiple of 8, in order) added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the
/// tail in order.
double SquaredErrorSum(const float* a, const float* b, int64_t n);

/// The stored dtype of a weight row read by RtnRowRange.
enum class RowDType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

/// The first pass of RTN over one row of a weight (quantize/rtn_fast.h): x[i] = the fp32 value of
/// element i < k of `src` (little-endian `dtype`) and, for each group j of g consecutive columns
/// (k % g == 0), mn[j] = min(0, its values), mx[j] = max(0, its values). False when any value is
/// inf or nan (x, mn and mx are then unspecified).
bool RtnRowRange(const uint8_t* src, RowDType dtype, int64_t k, int64_t g, float* x, float* mn, float* mx);

/// The second pass: codes[i] = QuarkCode(x[i], inv[j], z[j], symmetric) (formats/rtn.h) for
/// column i of group j, and in column order *num += (x[i] - deq)² and *den += x[i]² in double, deq
/// = float(code - zero point) * s[j] as DequantizeRef computes it (zero point: z[j], 8 for int4).
/// The two sums run element by element, in order, as the scalar relative error does. Needs the
/// default rounding mode.
void RtnRowCodes(const float* x, int64_t k, int64_t g, const float* s, const float* inv, const float* z, bool symmetric,
                 uint8_t* codes, double* num, double* den);

/// AWQ's candidate row (quantize/awq/search.cc): out[i] = float(codes[i] − zp[j]) · s[j] / d[i]
/// for column i of group j (k % g == 0), the product and the quotient each rounded to fp32 — the
/// dequantized value of Q(W·d) divided back by the column's scale, as the scalar loop computes it.
void RtnRowDequantDiv(const uint8_t* codes, int64_t k, int64_t g, const float* s, const int32_t* zp, const float* d,
                      float* out);

/// One ISA's implementations (W4Kernels::vec holds the chosen one).
struct VecKernels {
  const char* name = "scalar";  // "scalar" | "avx2" | "avx512": the translation unit's ISA
  void (*exp_shifted)(float* row, int64_t n, float shift) = nullptr;
  void (*scaled_softmax_row)(float* row, int64_t valid, int64_t len, float scale) = nullptr;
  double (*squared_error_sum)(const float* a, const float* b, int64_t n) = nullptr;
  bool (*rtn_row_range)(const uint8_t* src, RowDType dtype, int64_t k, int64_t g, float* x, float* mn, float* mx) = nullptr;
  void (*rtn_row_codes)(const float* x, int64_t k, int64_t g, const float* s, const float* inv, const float* z,
                        bool symmetric, uint8_t* codes, double* num, double* den) = nullptr;
  void (*rtn_row_dequant_div)(const uint8_t* codes, int64_t k, int64_t g, const float* s, const int32_t* zp,
                              const float* d, float* out) = nullptr;
  void (*to_bf16_bits)(const float* x, int64_t n, uint16_t* out) = nullptr;  // kernels/int4_packed.h ToBf16Bits
  void (*round_to_bf16)(const float* x, int64_t n, float* out) = nullptr;    // and RoundToBf16, one thread
  /// PrepareActsBf16's per-value arrays (kernels/int4_packed.h W4Bf16Acts) for x[K], g: xb, xf,
  /// xs (g = 128, else nullptr) and sigma[K / g] = each group's bf16 values added in K order in fp32.
  void (*bf16_acts)(const float* x, int64_t k, int64_t group_size, uint16_t* xb, float* xf, uint16_t* xs,
                    float* sigma) = nullptr;
};

/// The baseline build's implementations (SSE2 on x86-64): the fallback and the tests' oracle.
VecKernels VecKernelsScalar();

}  // namespace nibble
