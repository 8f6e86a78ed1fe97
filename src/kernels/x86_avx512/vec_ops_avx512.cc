// kernels/vec_ops_impl.h compiled with the AVX-512 flags (CMakeLists.txt, contraction off);
// called only after dispatch has checked CPUID and XCR0 (kernels/int4_dispatch.cc).
#if defined(__x86_64__)

#include "kernels/x86_avx512/vec_ops_avx512.h"

#include "kernels/vec_ops_impl.h"

namespace nibble {

VecKernels VecKernelsAvx512() { return VecKernelsOfThisUnit("avx512"); }

}  // namespace nibble

#endif  // __x86_64__
