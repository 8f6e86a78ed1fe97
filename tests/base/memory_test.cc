// base/memory.h: the available-memory figure and the up-front allocation check.
#include "base/memory.h"

#include <gtest/gtest.h>

namespace nibble {
namespace {

TEST(Memory, AvailableIsKnownOnLinuxAndBoundsTheCheck) {
  const int64_t avail = AvailableMemoryBytes();
  ASSERT_GT(avail, 0);  // /proc/meminfo has MemAvailable
  EXPECT_TRUE(CheckMemoryFor(1 << 20, "a small table").ok());
  const Status s = CheckMemoryFor(4.0 * static_cast<double>(avail), "the KV cache of 2147483647 positions");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("the KV cache of 2147483647 positions needs "), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find(" of memory available (MemAvailable"), std::string::npos) << s.error().message;
}

TEST(Memory, FormatBytesPicksTheUnit) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3.5 * 1024 * 1024), "3.5 MiB");
  EXPECT_EQ(FormatBytes(16.0 * 1024 * 1024 * 1024), "16.0 GiB");
}

}  // namespace
}  // namespace nibble
