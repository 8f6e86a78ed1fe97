// PageBuffer: zero-initialised, 2 MiB aligned from 2 MiB on, movable, empty when default-built.
#include "base/page_buffer.h"

#include <cstdint>
#include <utility>

#include <gtest/gtest.h>

namespace nibble {
namespace {

TEST(PageBufferTest, ZeroedAlignedAndMovable) {
  PageBuffer empty;
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
  for (size_t bytes : {size_t{1}, size_t{4097}, (size_t{2} << 20) + 3}) {
    PageBuffer b(bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), bytes);
    const size_t align = bytes >= (size_t{2} << 20) ? (size_t{2} << 20) : 64;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % align, 0u) << bytes;
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; ++i) nonzero += b.data()[i] != 0;
    EXPECT_EQ(nonzero, 0u);
    b.data()[bytes - 1] = 7;
    uint8_t* p = b.data();
    PageBuffer moved(std::move(b));
    EXPECT_EQ(moved.data(), p);
    EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
    EXPECT_EQ(b.size(), 0u);
    PageBuffer assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.data()[bytes - 1], 7);
  }
}

}  // namespace
}  // namespace nibble
