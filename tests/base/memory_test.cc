// base/memory.h: the available-memory figure and the up-front allocation check.
#include "base/memory.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "test_util.h"

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

// Minor page faults of allocating, filling and freeing `bytes` on this thread.
long FaultsOfFill(size_t bytes) {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  const long f0 = u.ru_minflt;
  char* p = static_cast<char*>(std::malloc(bytes));
  if (p == nullptr) return -1;
  std::memset(p, 1, bytes);
  asm volatile("" : : "r"(p) : "memory");  // the fill is observed: not elided with the block
  std::free(p);
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt - f0;
}

TEST(Memory, RetainFreedMemoryReusesFreedBlocksUntilTheLastScopeEnds) {
#if defined(NIBBLE_TEST_ASAN) || !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's malloc only (a sanitizer brings its own)";
#endif
  constexpr size_t kBytes = size_t{64} << 20;  // above any mmap threshold of glibc's: a mapping of its own
  // A fresh mapping faults once per page, or per huge page (32) where THP is always on.
  EXPECT_GE(FaultsOfFill(kBytes), 32);
  {
    const RetainFreedMemory retain;
    FaultsOfFill(kBytes);  // the heap grows, once
    EXPECT_LT(FaultsOfFill(kBytes), 8);  // then its pages are used again
    { const RetainFreedMemory nested; }
    EXPECT_LT(FaultsOfFill(kBytes), 8);  // a nested scope's end keeps them
  }
  EXPECT_GE(FaultsOfFill(kBytes), 32);  // handed back: fresh pages again
}

}  // namespace
}  // namespace nibble
