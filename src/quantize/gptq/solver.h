// GPTQ for one linear (SPEC §3.1): the damped Hessian's inverse Cholesky factor, then the column
// loop that quantizes one column at a time against fixed group parameters and spreads each
// column's rounding error over the columns not yet quantized, in lazy blocks.
//
// Layout: H [K, K] row-major fp32 (symmetric). The factor U is the upper Cholesky factor of
// H⁻¹ in the act-order permutation (H⁻¹ = Uᵀ U), row-major [K, K], upper triangle valid. The
// column loop works on Wᵀ [K, N] (one column of W per row, contiguous over N).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "formats/int4_matrix.h"
#include "formats/quant_spec.h"
#include "io/safetensors.h"
#include "quantize/gptq/settings.h"

namespace nibble {

/// The factorised Hessian of one linear input, shared by every linear fed by that input.
struct GptqFactor {
  int64_t k = 0;
  std::vector<float> u;          // [K, K], see the file comment; empty when fallback_rtn
  std::vector<int64_t> perm;     // position -> natural column (identity without act-order)
  std::vector<int64_t> dead;     // natural columns with H[j][j] == 0 (their weights are zeroed)
  double dampening_frac = 0;     // the fraction that factorised (after retries)
  int retries = 0;               // factorisations that failed before it
  bool fallback_rtn = false;     // no damping below 1 factorised: plain RTN
};

/// How U is computed from the damped H (the same matrix; the roundings differ).
enum class GptqFactorization {
  // LAPACK's Cholesky, its inverse, and the Cholesky of that inverse (as GPTQ's reference code
  // does): 4/3 K³ flops. The fp32 calibration pipeline's bytes.
  kCholeskyOfInverse,
  // The Cholesky factor V of H with rows and columns reversed (H = V Vᵀ, V upper), and U = V⁻¹:
  // one factorisation and one triangular inverse, 2/3 K³ flops. The 16-bit calibration's.
  kReversedCholesky,
};

/// Factorises H (consumed): dead columns get H[j][j] = 1, act-order permutes, then
/// H + frac·mean(diag(H))·I is factorised with LAPACK as `how` says, raising frac by
/// settings.damp_increment after each failure while it is below 1.
/// Errors: H not [K, K], a non-finite entry (names the first), act-order group (needs g_idx).
Result<GptqFactor> FactorGptqHessian(std::vector<float> h, int64_t k, const GptqSettings& settings,
                                     GptqFactorization how);

/// GPTQ codes of w [N, K] (fp32 holding the model dtype's values): group parameters as Quark RTN
/// computes them (scales in `scale_dtype`), up front from w or refitted per group (dynamic), each
/// column's code by QuarkCode, errors propagated through f.u. Errors: those of QuantizeRtnRef.
/// The result does not depend on the thread count.
Result<Int4Matrix> GptqQuantize(const float* w, int64_t n, int64_t k, const GptqFactor& f, const QuantSpec& spec,
                                DType scale_dtype, const GptqSettings& settings);

}  // namespace nibble
