#include "base/page_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace nibble {

namespace {
constexpr size_t kHuge = size_t{2} << 20;
}

PageBuffer::PageBuffer(size_t bytes) : PageBuffer(bytes, Uninitialized{}) {
  if (bytes > 0) std::memset(data_, 0, bytes);
}

PageBuffer::PageBuffer(size_t bytes, Uninitialized) : size_(bytes) {
  if (bytes == 0) return;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t rounded = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple
  data_ = static_cast<uint8_t*>(std::aligned_alloc(align, rounded));
  if (data_ == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHuge) (void)madvise(data_, rounded, MADV_HUGEPAGE);
#endif
}

PageBuffer PageBuffer::View(uint8_t* data, size_t bytes, std::shared_ptr<const void> owner) {
  PageBuffer b;
  b.data_ = data;
  b.size_ = bytes;
  b.owner_ = std::move(owner);
  return b;
}

PageBuffer::~PageBuffer() {
  if (owner_ == nullptr) std::free(data_);
}

PageBuffer::PageBuffer(PageBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), owner_(std::move(o.owner_)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& o) noexcept {
  if (this != &o) {
    if (owner_ == nullptr) std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    owner_ = std::move(o.owner_);
  }
  return *this;
}

}  // namespace nibble
