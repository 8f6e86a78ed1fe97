// RTN of a stored weight tensor, fast: the quantized codes of formats/rtn.h (QuantizeRtnRef, the
// oracle) and the relative error the quantize report gives, in one pass over the tensor's rows
// without an fp32 copy of it. Per row: the vectorised first pass (kernels/vec_ops.h RtnRowRange:
// fp32 values, each group's min and max), the group parameters on the reference's own scalar
// code (RtnGroupOf), the vectorised second pass (RtnRowCodes: codes and the two error sums in
// column order). The bits equal TensorToF32 + QuantizeRtnRef + RelWeightError on every ISA.
#pragma once

#include <vector>

#include "base/result.h"
#include "formats/int4_matrix.h"
#include "formats/quant_spec.h"
#include "io/safetensors.h"

namespace nibble {

/// ||W - dequant||_F / ||W||_F from the two sums Σ (W - dequant)² and Σ W² (0 when W is 0).
double RelWeightErrorOf(double num, double den);

/// ||w - DequantizeRef(q)||_F / ||w||_F, summed in w's order (the reference of the fast sums).
double RelWeightError(const std::vector<float>& w, const Int4Matrix& q);

/// RTN of the 2-D float tensor `t` [N, K] (F32, F16 or BF16) under `spec` with scales rounded to
/// `scale_dtype`, into `out` (its buffers reused when large enough), and its relative error:
/// equal, bit for bit, to QuantizeRtnRef of TensorToF32(t) and RelWeightError. False, with `out`
/// unspecified, where the reference must run to say what is wrong: arguments it refuses, an
/// inf or nan weight, a scale overflowing scale_dtype (the caller then runs the reference, whose
/// errors are the contract).
bool QuantizeRtnFast(const TensorView& t, const QuantSpec& spec, DType scale_dtype, Int4Matrix* out, double* rel_error);

}  // namespace nibble
