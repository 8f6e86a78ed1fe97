// kernels/vec_ops_impl.h compiled with the AVX2 flags (CMakeLists.txt, contraction off); called
// only after dispatch has checked CPUID and XCR0 (kernels/int4_dispatch.cc).
#if defined(__x86_64__)

#include "kernels/x86_avx2/vec_ops_avx2.h"

#include "kernels/vec_ops_impl.h"

namespace nibble {

VecKernels VecKernelsAvx2() { return VecKernelsOfThisUnit("avx2"); }

}  // namespace nibble

#endif  // __x86_64__
