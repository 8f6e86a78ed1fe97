#include "kernels/aligned_acts.h"

#include <cstring>
#include <vector>

#include "base/check.h"

namespace nibble {

const float* AlignedActs(const float* x, int64_t count) {
  NIBBLE_CHECK(count >= 0 && (count == 0 || x != nullptr));
  if (count == 0 || reinterpret_cast<uintptr_t>(x) % kActsAlignment == 0) return x;
  constexpr int64_t kPad = kActsAlignment / static_cast<int64_t>(sizeof(float));
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < count + kPad) scratch.resize(static_cast<size_t>(count + kPad));
  const uintptr_t p = reinterpret_cast<uintptr_t>(scratch.data());
  float* out = scratch.data() + (kActsAlignment - p % kActsAlignment) % kActsAlignment / sizeof(float);
  std::memcpy(out, x, static_cast<size_t>(count) * sizeof(float));
  return out;
}

}  // namespace nibble
