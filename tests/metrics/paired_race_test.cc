// The race of a new checkpoint against the best (metrics/paired_race.h): its "worse" decision keeps
// its error rate at most 5 % whatever row it stops at, and a clearly worse checkpoint is decided
// after a fraction of its rows. Simulated: paired per-row Dice differences, drawn in a seeded
// random order from a population of N rows whose mean difference is set exactly.
#include "metrics/paired_race.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

// N paired differences with population mean exactly `mean`: noise of sd `sd` (clipped to +/-0.5),
// centred, then shifted; the order shuffled by `rng`.
std::vector<double> Population(std::mt19937_64& rng, int n, double mean, double sd) {
  std::normal_distribution<double> noise(0, sd);
  std::vector<double> d(n);
  for (double& v : d) v = std::clamp(noise(rng), -0.5, 0.5);
  const double centre = std::accumulate(d.begin(), d.end(), 0.0) / n;
  for (double& v : d) v += mean - centre;
  std::shuffle(d.begin(), d.end(), rng);
  return d;
}

// How many of `races` races over populations of true mean `mean` are decided worse than -margin,
// and the rows each decided one used.
int DecidedWorse(int races, int n, double mean, double sd, double margin, std::vector<int64_t>* rows_used) {
  std::mt19937_64 rng(20261206);
  int worse = 0;
  for (int r = 0; r < races; ++r) {
    PairedRace race(n, margin);
    for (double d : Population(rng, n, mean, sd)) {
      race.Add(d);
      if (race.decided_worse()) break;  // The follow stops the job here.
    }
    if (race.decided_worse()) {
      ++worse;
      if (rows_used != nullptr) rows_used->push_back(race.decided_at());
      const auto [lo, hi] = race.Interval();
      EXPECT_LT(hi, -margin + 1e-6) << "decided, but the interval reaches past -margin: [" << lo << ", " << hi << "]";
    }
  }
  return worse;
}

TEST(PairedRaceTest, AnEqualCheckpointIsDecidedWorseInAtMostFivePercentOfRaces) {
  // 1000 races each: a checkpoint exactly as good, noisy or nearly constant differences, small and
  // larger sets; and one worse by less than the margin.
  for (const auto& [n, sd] : std::vector<std::pair<int, double>>{{200, 0.05}, {200, 0.3}, {1000, 0.1}}) {
    const int worse = DecidedWorse(1000, n, 0.0, sd, 0.0, nullptr);
    std::printf("equal checkpoints, n %d, sd %.2f: %d of 1000 races decided worse\n", n, sd, worse);
    EXPECT_LE(worse, 50) << "n " << n << " sd " << sd;
  }
  EXPECT_LE(DecidedWorse(1000, 500, -0.01, 0.1, 0.02, nullptr), 50);
}

TEST(PairedRaceTest, AClearlyWorseCheckpointIsStoppedAfterAFractionOfItsRows) {
  std::vector<int64_t> used;
  const int n = 2000;
  const int worse = DecidedWorse(200, n, -0.1, 0.1, 0.0, &used);
  EXPECT_GE(worse, 195);
  std::sort(used.begin(), used.end());
  ASSERT_FALSE(used.empty());
  std::printf("worse by 0.1 (sd 0.1): %d of 200 decided, median %lld of %d rows\n", worse,
              static_cast<long long>(used[used.size() / 2]), n);
  EXPECT_LT(used[used.size() / 2], n / 10) << "median rows to the decision";
  // Worse by 0.1, but within a margin of 0.15: never decided.
  EXPECT_EQ(DecidedWorse(200, n, -0.1, 0.1, 0.15, nullptr), 0);
}

TEST(PairedRaceTest, TheIntervalCoversTheMeanAndTheRaceIsDeterministic) {
  std::mt19937_64 rng(7);
  const std::vector<double> d = Population(rng, 400, 0.05, 0.2);
  PairedRace a(400, 0), b(400, 0);
  for (double v : d) {
    a.Add(v);
    b.Add(v);
  }
  EXPECT_FALSE(a.decided_worse());
  const auto [lo, hi] = a.Interval();
  EXPECT_LE(lo, 0.05);
  EXPECT_GE(hi, 0.05);
  EXPECT_LT(hi - lo, 0.1);
  EXPECT_NEAR(a.mean(), 0.05, 1e-12);
  EXPECT_EQ(a.Interval(), b.Interval());
  // Every row drawn (N of N): the finite-population interval closes in on the mean.
  EXPECT_LT(hi - lo, 0.02);
}

}  // namespace
}  // namespace tally
