// base/parallel.h and base/claim_pool.h: ParallelFor / ParallelRanges run every index once, with
// or without the claim pool; the pool joins only when it is worth it, more than one thread is
// allowed and no region or chunk encloses the call; loops nested in a chunk run serially;
// several threads' loops at once each finish; oneDNN inside a chunk is held to one thread.
#include "base/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace nibble {
namespace {

TEST(ParallelTest, EveryIndexOnceAndThePoolOnlyWhereItRunsOnManyThreads) {
  const int saved = omp_get_max_threads();
  for (int threads : {2, 3, 8}) {
    omp_set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 7, 1000, 100003}) {
      for (bool worth : {false, true}) {
        std::vector<int> hits(static_cast<size_t>(n), 0);
        ParallelFor(n, worth, [&](int64_t i) { hits[static_cast<size_t>(i)] += 1; });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "n=" << n << " worth=" << worth << " threads=" << threads;
      }
    }
  }
  omp_set_num_threads(2);
  EXPECT_TRUE(OpenTeam(true));
  EXPECT_FALSE(OpenTeam(false));
  // Not worth it: one range, the calling thread.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  ParallelRanges(100, false, [&](int64_t b, int64_t e) { ranges.emplace_back(b, e); });
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], (std::pair<int64_t, int64_t>{0, 100}));
  // Worth it: chunks tile the range; inside one, no second loop parallelises.
  std::atomic<int> nested_open{0};
  std::vector<int> hits(1000, 0);
  ParallelRanges(1000, true, [&](int64_t b, int64_t e) {
    EXPECT_TRUE(InClaimedChunk());
    if (OpenTeam(true)) ++nested_open;
    ParallelFor(e - b, true, [&](int64_t i) { hits[static_cast<size_t>(b + i)] += 1; });
  });
  EXPECT_EQ(nested_open.load(), 0);
  for (int h : hits) EXPECT_EQ(h, 1);
  EXPECT_FALSE(InClaimedChunk());
  // Inside an OpenMP region no pool joins either.
  int nested = -1;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    nested = OpenTeam(true) ? 1 : 0;
  }
  EXPECT_EQ(nested, 0);
  omp_set_num_threads(1);
  EXPECT_FALSE(OpenTeam(true));
  omp_set_num_threads(saved);
}

// The pool's workers do join (the loop runs on more than one thread), and a chunk's oneDNN
// thread count is 1 under SingleThreadedBlas, restored after.
TEST(ParallelTest, WorkersJoinAndSingleThreadedBlasHoldsOneThread) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> max_inside{0};
  for (int round = 0; round < 200 && ids.size() < 2; ++round)
    ParallelRanges(4096, true, [&](int64_t, int64_t) {
      {
        const SingleThreadedBlas one;
        max_inside = std::max(max_inside.load(), omp_get_max_threads());
      }
      volatile double x = 0;
      for (int i = 0; i < 20000; ++i) x = x + i;
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    });
  EXPECT_GE(ids.size(), 2u) << "no worker ever claimed a chunk";
  EXPECT_EQ(max_inside.load(), 1);
  EXPECT_EQ(omp_get_max_threads(), 2);
  omp_set_num_threads(saved);
}

// Loops from several threads at once: one holds the pool, the others run serially; all finish
// with every index once.
TEST(ParallelTest, ConcurrentCallersEachFinish) {
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&bad] {
      omp_set_num_threads(2);
      for (int round = 0; round < 50; ++round) {
        std::vector<int> hits(5000, 0);
        ParallelFor(5000, true, [&](int64_t i) { hits[static_cast<size_t>(i)] += 1; });
        for (int h : hits) bad += h != 1 ? 1 : 0;
      }
    });
  for (std::thread& c : callers) c.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace nibble
