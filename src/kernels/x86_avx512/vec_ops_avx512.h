// The vectorised row ops (kernels/vec_ops.h) built for AVX-512. Call only when dispatch reports
// the ISA supported (CPUID + XCR0 ZMM state); see kernels/int4_dispatch.h.
#pragma once

#include "kernels/vec_ops.h"

namespace nibble {

/// The AVX-512 build of kernels/vec_ops_impl.h (16-lane registers; the same bits as the scalar
/// one).
VecKernels VecKernelsAvx512();

}  // namespace nibble
