// Scalar W4A32 reference GEMM (see int4_ref.h).
#include "kernels/int4_ref.h"

#include "base/check.h"

namespace nibble {

void GemmW4A32Ref(const W4GemmArgs& a) {
  NIBBLE_CHECK(a.m >= 0 && a.n >= 0 && a.k >= 0);
  NIBBLE_CHECK_MSG(a.k == 0 || (a.group_size >= 1 && a.k % a.group_size == 0), "k=%lld group_size=%lld",
                   static_cast<long long>(a.k), static_cast<long long>(a.group_size));
  if (a.m == 0 || a.n == 0) return;
  NIBBLE_CHECK(a.y != nullptr);
  NIBBLE_CHECK(a.k == 0 || (a.x != nullptr && a.codes != nullptr && a.scales != nullptr && a.zero_points != nullptr));
  const int64_t groups = a.k == 0 ? 0 : a.k / a.group_size;
  for (int64_t i = 0; i < a.m; ++i) {
    const float* x = a.x + i * a.k;
    for (int64_t j = 0; j < a.n; ++j) {
      const uint8_t* q = a.codes + j * a.k;
      const float* s = a.scales + j * groups;
      const uint8_t* z = a.zero_points + j * groups;
      float acc = 0.f;
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float scale = s[gi];
        const int zero = z[gi];
        for (int64_t kk = gi * a.group_size; kk < (gi + 1) * a.group_size; ++kk) {
          const float w = static_cast<float>(int{q[kk]} - zero) * scale;
          acc += x[kk] * w;
        }
      }
      a.y[i * a.n + j] = a.bias != nullptr ? acc + a.bias[j] : acc;
    }
  }
}

}  // namespace nibble
