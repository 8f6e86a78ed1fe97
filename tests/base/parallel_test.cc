// base/parallel.h: ParallelFor runs every index once, with or without a team; a team opens only
// when it is worth one, more than one thread is allowed and no region encloses the call.
#include "base/parallel.h"

#include <omp.h>

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace nibble {
namespace {

TEST(ParallelTest, EveryIndexOnceAndATeamOnlyWhereItRunsOnManyThreads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (int64_t n : {0, 1, 7, 1000}) {
    for (bool worth : {false, true}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      ParallelFor(n, worth, [&](int64_t i) { hits[static_cast<size_t>(i)] += 1; });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)], 1) << "n=" << n << " worth=" << worth;
    }
  }
  EXPECT_TRUE(OpenTeam(true));
  EXPECT_FALSE(OpenTeam(false));
  // Not worth a team: every index on the calling thread, outside any region.
  std::vector<int> in_region(4, -1);
  ParallelFor(4, false, [&](int64_t i) { in_region[static_cast<size_t>(i)] = omp_in_parallel(); });
  for (int v : in_region) EXPECT_EQ(v, 0);
  // Worth one: inside an active region.
  ParallelFor(4, true, [&](int64_t i) { in_region[static_cast<size_t>(i)] = omp_in_parallel(); });
  for (int v : in_region) EXPECT_EQ(v, 1);
  // Inside a region no second team opens.
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

}  // namespace
}  // namespace nibble
