// A byte buffer for large read-mostly data (packed int4 weights): owned, zero-initialised memory
// that asks the kernel for transparent huge pages, or a view of a mapped file kept alive by a
// shared owner (the packed-weight cache, model/weight_cache.h). Streaming 1 GiB of weights through 4 KiB pages costs
// a TLB miss every 4 KiB; on 2 MiB pages the GEMV reads measurably faster (docs/KERNELS.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace nibble {

class PageBuffer {
 public:
  PageBuffer() = default;
  /// `bytes` zero bytes, at least 64-byte aligned (one cache line: whole-line vector loads never
  /// split). Buffers of 2 MiB or more are 2 MiB aligned and advised MADV_HUGEPAGE
  /// (Linux; a refused advice only costs speed). Aborts (std::bad_alloc) when memory is exhausted,
  /// like std::vector.
  explicit PageBuffer(size_t bytes);
  /// The same without zeroing: for a writer that writes every byte itself, so that its own
  /// (parallel) first writes fault the pages in rather than one serial pass of zeros.
  struct Uninitialized {};
  PageBuffer(size_t bytes, Uninitialized);
  /// `bytes` bytes at `data` (e.g. inside a file mapping), alive while `owner` is; not freed.
  static PageBuffer View(uint8_t* data, size_t bytes, std::shared_ptr<const void> owner);
  ~PageBuffer();
  /// A moved-from buffer is empty (data() == nullptr, size() == 0).
  PageBuffer(PageBuffer&& o) noexcept;
  PageBuffer& operator=(PageBuffer&& o) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;  // set for a view: data_ is not ours to free
};

}  // namespace nibble
