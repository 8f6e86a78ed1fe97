#include "model/workspace.h"

#include <algorithm>
#include <cstring>

namespace nibble {

uint8_t* Workspace::Bytes(Slot slot, size_t bytes) {
  PageBuffer& b = buffers_[static_cast<size_t>(slot)];
  if (b.size() < bytes) {
    b = PageBuffer();  // the old buffer goes first: never two at once
    b = PageBuffer(bytes);
  }
  return b.data();
}

int64_t Workspace::bytes() const {
  int64_t total = 0;
  for (const PageBuffer& b : buffers_) total += static_cast<int64_t>(b.size());
  return total;
}

void Workspace::Trim(size_t keep) {
  if (static_cast<size_t>(bytes()) <= keep) return;
  for (PageBuffer& b : buffers_) b = PageBuffer();
}

int64_t LinearTileRows(int64_t n, int64_t k, int64_t elem_bytes, int64_t tile_bytes) {
  const int64_t rows = tile_bytes / std::max<int64_t>(1, k * elem_bytes) / 64 * 64;
  return std::min(n, std::max(kLinearTileMinRows, rows));
}

const float* AlignedRows(const float* x, int64_t count, Workspace& ws) {
  if (reinterpret_cast<uintptr_t>(x) % 64 == 0 || count == 0) return x;
  float* out = ws.Get<float>(Workspace::Slot::kLinearAligned, count);
  std::memcpy(out, x, static_cast<size_t>(count) * sizeof(float));
  return out;
}

}  // namespace nibble
