// An owning, zero-initialised byte buffer for large read-mostly data (packed int4 weights) that
// asks the kernel for transparent huge pages. Streaming 1 GiB of weights through 4 KiB pages costs
// a TLB miss every 4 KiB; on 2 MiB pages the GEMV reads measurably faster (docs/KERNELS.md).
#pragma once

#include <cstddef>
#include <cstdint>

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
};

}  // namespace nibble
