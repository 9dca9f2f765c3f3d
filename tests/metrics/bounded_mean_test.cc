// The betting interval of a bounded mean (metrics/bounded_mean.h): against an independent grid
// evaluation of the same capital processes, and by simulation on skewed populations (a few
// outliers, bimodal, many zeros, the demo's one bad image), with and without replacement, where it
// must cover the mean in >= 93 % of draws at every n from 10 up (the bar) while the normal
// interval it replaced does not.
#include "metrics/bounded_mean.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

// The same test as a plain grid: every m in {0, 1/G, ..., 1} checked with the capitals as products
// (long double, no logarithms, no bisection), rejected if either ever reaches its threshold. Returns
// the accepted m's.
std::vector<double> AcceptedOnGrid(const std::vector<double>& x, double population, int grid) {
  const long double alpha = 0.05L, theta = 0.5L, c = 0.75L;
  const size_t n = x.size();
  std::vector<long double> lambda(n);
  long double sum = 0, squares = 0.25L;
  for (size_t t = 0; t < n; ++t) {
    lambda[t] = std::sqrt(2 * std::log(2 / alpha) / (static_cast<long double>(n) * squares / (t + 1)));
    sum += x[t];
    const long double mu = (0.5L + sum) / (t + 2);
    squares += (x[t] - mu) * (x[t] - mu);
  }
  std::vector<double> accepted;
  for (int g = 0; g <= grid; ++g) {
    const long double m = static_cast<long double>(g) / grid;
    long double plus = 1, minus = 1, drawn = 0;
    bool impossible = false;
    for (size_t t = 0; t < n; ++t) {
      const long double mt = population > 0 ? (population * m - drawn) / (population - t) : m;
      drawn += x[t];
      if (mt < 0 || mt > 1 || (mt == 0 && x[t] > 0) || (mt == 1 && x[t] < 1)) {
        impossible = true;
        break;
      }
      if (mt > 0) plus *= 1 + std::min(lambda[t], c / mt) * (x[t] - mt);
      if (mt < 1) minus *= 1 - std::min(lambda[t], c / (1 - mt)) * (x[t] - mt);
      if (theta * plus >= 1 / alpha || (1 - theta) * minus >= 1 / alpha) {
        impossible = true;
        break;
      }
    }
    if (!impossible) {
      accepted.push_back(static_cast<double>(m));
    }
  }
  return accepted;
}

TEST(BettingIntervalTest, AgreesWithAGridEvaluationOfTheCapital) {
  std::mt19937_64 rng(48);
  std::uniform_real_distribution<double> u(0, 1);
  const int grid = 20000;
  for (int trial = 0; trial < 30; ++trial) {
    const int n = 10 + static_cast<int>(rng() % 60);
    std::vector<double> x(n);
    for (double& v : x) v = trial % 3 == 0 ? (u(rng) < 0.1 ? 0.2 * u(rng) : 0.9 + 0.1 * u(rng)) : u(rng);
    for (double population : {0.0, static_cast<double>(n + rng() % 200)}) {
      const std::pair<double, double> ci = BettingMeanCi95(x, population);
      const std::vector<double> ok = AcceptedOnGrid(x, population, grid);
      ASSERT_FALSE(ok.empty()) << trial;
      // The grid's accepted points lie inside the interval, and its ends within a grid step of them.
      EXPECT_LE(ci.first, ok.front() + 1e-9) << trial << " " << population;
      EXPECT_GE(ci.second, ok.back() - 1e-9) << trial << " " << population;
      EXPECT_GT(ci.first, ok.front() - 1.0 / grid - 1e-9) << trial << " " << population;
      EXPECT_LT(ci.second, ok.back() + 1.0 / grid + 1e-9) << trial << " " << population;
    }
  }
}

TEST(BettingIntervalTest, NoIntervalBelowTenValuesAndEdgeCases) {
  EXPECT_TRUE(std::isnan(BettingMeanCi95(std::vector<double>(9, 0.5)).first));
  const std::pair<double, double> ones = BettingMeanCi95(std::vector<double>(50, 1.0));
  EXPECT_EQ(ones.second, 1.0);
  EXPECT_LT(ones.first, 1.0);
  const std::pair<double, double> half = BettingMeanCi95(std::vector<double>(400, 0.5));
  EXPECT_LT(half.first, 0.5);
  EXPECT_GT(half.second, 0.5);
  // The whole population sampled: the interval shrinks to about its mean.
  std::vector<double> all(300);
  for (size_t i = 0; i < all.size(); ++i) all[i] = (i % 7) / 6.0;
  const double mean = std::accumulate(all.begin(), all.end(), 0.0) / all.size();
  const std::pair<double, double> full = BettingMeanCi95(all, 300);
  EXPECT_LE(full.first, mean);
  EXPECT_GE(full.second, mean);
  EXPECT_LT(full.second - full.first, 0.02);
}

// The values kept are fixed by the keys alone: any order or split keeps the same ones and gives
// the same interval; positions keep the first kMaxIntervalRows; hashed keys a fraction by the rows.
TEST(IntervalSampleTest, KeepsTheSameValuesWhateverTheOrderAndSplit) {
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t rows = 3 * kMaxIntervalRows;
  std::vector<std::pair<uint64_t, double>> hashed(rows);
  for (auto& e : hashed) e = {rng(), u(rng)};
  const uint64_t limit = IntervalSample::HashKeyLimit(static_cast<double>(rows));
  EXPECT_EQ(limit, uint64_t{1} << 62);  // 3x the bound: a quarter of the keys.
  EXPECT_EQ(IntervalSample::HashKeyLimit(static_cast<double>(kMaxIntervalRows)), ~uint64_t{0});
  IntervalSample whole(limit), a(limit), b(limit);
  for (const auto& e : hashed) whole.Add(e.first, e.second);
  std::shuffle(hashed.begin(), hashed.end(), rng);
  for (size_t i = 0; i < hashed.size(); ++i) (i % 3 ? a : b).Add(hashed[i].first, hashed[i].second);
  a.Merge(b);
  const int64_t expected = std::count_if(hashed.begin(), hashed.end(), [&](const auto& e) { return e.first < limit; });
  EXPECT_EQ(whole.kept(), expected);
  EXPECT_EQ(a.kept(), expected);
  EXPECT_LE(expected, kMaxIntervalRows);
  EXPECT_GT(expected, kMaxIntervalRows / 2);
  EXPECT_EQ(whole.Ci95(), a.Ci95());
  IntervalSample positions;
  for (int64_t p = rows - 1; p >= 0; --p) positions.Add(static_cast<uint64_t>(p), 0.5);
  EXPECT_EQ(positions.kept(), kMaxIntervalRows);
}

// Populations whose means a normal interval misses at small n.
std::vector<double> Population(int kind, int size, std::mt19937_64* rng) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> p(size);
  for (int i = 0; i < size; ++i) {
    switch (kind) {
      case 0: p[i] = i % 25 == 0 ? 0.2 + 0.4 * u(*rng) : 0.93 + 0.06 * u(*rng); break;  // A few outliers.
      case 1: p[i] = i % 2 ? 0.05 + 0.1 * u(*rng) : 0.85 + 0.1 * u(*rng); break;        // Bimodal.
      case 2: p[i] = i % 10 < 4 ? 0.0 : 0.7 + 0.3 * u(*rng); break;                     // Many zeros.
      default: p[i] = i == 0 ? 0.565 : 0.95 + 0.03 * u(*rng); break;                    // The demo's one bad image.
    }
  }
  return p;
}

// The normal interval with the finite-population correction, as Tally reported before.
std::pair<double, double> NormalCi95(const std::vector<double>& x, double population) {
  const double n = static_cast<double>(x.size());
  const double mean = std::accumulate(x.begin(), x.end(), 0.0) / n;
  double ss = 0;
  for (double v : x) ss += (v - mean) * (v - mean);
  const double fpc = population > 1 ? std::sqrt((population - n) / (population - 1)) : 1.0;
  const double half = 1.959963984540054 * std::sqrt(ss / (n - 1) / n) * fpc;
  return {mean - half, mean + half};
}

TEST(BettingIntervalTest, CoversSkewedPopulationsAtEveryNFromTen) {
  std::mt19937_64 rng(2026);
  const int trials = 400;
  double worst_normal = 1;
  for (int kind = 0; kind < 4; ++kind) {
    for (int size : {48, 200}) {
      const std::vector<double> p = Population(kind, size, &rng);
      const double mean = std::accumulate(p.begin(), p.end(), 0.0) / size;
      for (int n : {10, 15, 22, 30, 45}) {
        if (n >= size) continue;
        for (bool without_replacement : {true, false}) {
          int covered = 0, normal_covered = 0;
          std::vector<double> shuffled = p, x(n);
          for (int t = 0; t < trials; ++t) {
            if (without_replacement) {
              std::shuffle(shuffled.begin(), shuffled.end(), rng);
              std::copy(shuffled.begin(), shuffled.begin() + n, x.begin());
            } else {
              for (double& v : x) v = p[rng() % p.size()];
            }
            const double population = without_replacement ? size : 0;
            const std::pair<double, double> ci = BettingMeanCi95(x, population);
            covered += ci.first <= mean && mean <= ci.second;
            const std::pair<double, double> normal = NormalCi95(x, population);
            normal_covered += normal.first <= mean && mean <= normal.second;
          }
          EXPECT_GE(static_cast<double>(covered) / trials, 0.93)
              << "population " << kind << " of " << size << ", n " << n << (without_replacement ? " without" : " with")
              << " replacement";
          worst_normal = std::min(worst_normal, static_cast<double>(normal_covered) / trials);
        }
      }
    }
  }
  // The simulation can tell: the normal interval falls far short on these populations.
  EXPECT_LT(worst_normal, 0.8);
}

}  // namespace
}  // namespace tally
