// The vectorised row ops (kernels/vec_ops.h) built for AVX2. Call only when dispatch reports the
// ISA supported (CPUID + XCR0 YMM state); see kernels/int4_dispatch.h.
#pragma once

#include "kernels/vec_ops.h"

namespace nibble {

/// The AVX2 build of kernels/vec_ops_impl.h (8-lane registers; the same bits as the scalar one).
VecKernels VecKernelsAvx2();

}  // namespace nibble
