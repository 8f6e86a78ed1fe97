// The ETA rule of every progress display (tools/support/progress.h): a moving rate that follows
// the recent work, not the first units' rate nor the mean since the start.
#include <gtest/gtest.h>

#include "support/progress.h"

namespace {

using nibble::EtaEstimator;

TEST(EtaEstimator, UnknownBeforeTheFirstUnit) {
  EtaEstimator eta(10);
  EXPECT_FALSE(eta.known());
  EXPECT_EQ(eta.Remaining(100), 0.0);
  eta.Update(0, 5.0);  // time passes, no unit done yet
  EXPECT_FALSE(eta.known());
  eta.Update(1, 6.0);  // the first unit took 6 s, waiting included
  ASSERT_TRUE(eta.known());
  EXPECT_DOUBLE_EQ(eta.Remaining(100), 99 * 6.0);
}

TEST(EtaEstimator, ConstantRateGivesTheExactRemainingTimeWhateverTheUpdateSizes) {
  EtaEstimator eta(10);
  const int steps[] = {1, 3, 1, 7, 2, 6};  // 20 units at 2 s each
  double done = 0;
  for (int s : steps) {
    done += s;
    eta.Update(done, 2.0 * done);
  }
  EXPECT_NEAR(eta.Remaining(100), 80 * 2.0, 1e-9);
  EXPECT_NEAR(eta.Remaining(20), 0.0, 1e-12);
  EXPECT_NEAR(eta.Remaining(10), 0.0, 1e-12);  // never negative
}

// The machine gets busier after the first half (1 s per unit, then 3 s): the estimate follows
// the new rate, where the mean since the start (or the first unit's rate) is far off.
TEST(EtaEstimator, FollowsARateThatChanges) {
  EtaEstimator eta(nibble::EtaWindow(100));
  double t = 0;
  for (int i = 1; i <= 50; ++i) eta.Update(i, t += 1.0);
  EXPECT_NEAR(eta.Remaining(100), 50.0, 1e-9);
  for (int i = 51; i <= 80; ++i) eta.Update(i, t += 3.0);
  const double truth = 20 * 3.0, mean_rate = 20 * t / 80;  // mean: 35 s
  EXPECT_NEAR(eta.Remaining(100), truth, 0.1 * truth) << "mean-rate estimate: " << mean_rate;
  // The same run updated in chunks of 5 units gives the same estimate within a few percent.
  EtaEstimator chunked(nibble::EtaWindow(100));
  for (int i = 5; i <= 50; i += 5) chunked.Update(i, i * 1.0);
  for (int i = 55; i <= 80; i += 5) chunked.Update(i, 50 + (i - 50) * 3.0);
  EXPECT_NEAR(chunked.Remaining(100), eta.Remaining(100), 0.05 * eta.Remaining(100));
}

TEST(EtaEstimator, LaterUnitsFasterThanTheFirstAreNotOverestimated) {
  // A slow first layer (warm-up, page faults) then 1 s per unit: the estimate drops to the
  // steady rate within a few windows instead of staying at the first layer's 20 s.
  EtaEstimator eta(nibble::EtaWindow(40));  // window 4 units
  eta.Update(1, 20.0);
  EXPECT_NEAR(eta.Remaining(40), 39 * 20.0, 1e-9);
  double t = 20;
  for (int i = 2; i <= 20; ++i) eta.Update(i, t += 1.0);
  EXPECT_NEAR(eta.Remaining(40), 20 * 1.0, 0.1 * 20);
}

}  // namespace
