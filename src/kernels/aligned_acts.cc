#include "kernels/aligned_acts.h"

#include <cstring>

#include "base/check.h"
#include "base/page_buffer.h"

namespace nibble {

const float* AlignedActs(const float* x, int64_t count) {
  NIBBLE_CHECK(count >= 0 && (count == 0 || x != nullptr));
  if (count == 0 || reinterpret_cast<uintptr_t>(x) % kActsAlignment == 0) return x;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  // The calling thread's copy, as large as the largest x it was given. The model's linears pass
  // rows already aligned (their workspace, model/workspace.h AlignedRows), so inference never
  // copies here; direct kernel callers (benchmarks, tests) do. PageBuffer storage is at least
  // 64-byte aligned.
  thread_local PageBuffer scratch;
  if (scratch.size() < bytes) scratch = PageBuffer(bytes);
  float* out = reinterpret_cast<float*>(scratch.data());
  std::memcpy(out, x, bytes);
  return out;
}

}  // namespace nibble
