// Intervals for the mean of per-image values in [0, 1] (Dice) that hold their coverage at every
// sample size and for every population, skewed ones included (docs/metrics.md "Intervals"). A normal interval
// does not: when a few images score far below the rest, a small sample usually holds none of them,
// its spread is tiny, and the interval misses the mean (simulated: 38 % coverage at n = 15). Any
// interval that covers there must use that the values lie in [0, 1]; this one is the betting
// interval of Waudby-Smith & Ramdas (2023), "Estimating means of bounded random variables by
// betting", JRSS-B 86(1):1-27, which is valid for any n and as narrow as a normal interval once the
// sample is large:
//
//   With alpha = 0.05, theta = 1/2 and c = 3/4, for values x_1..x_n taken in a data-independent order:
//     mu_t  = (1/2 + sum_{i<=t} x_i) / (t + 1),  var_t = (1/4 + sum_{i<=t} (x_i - mu_i)^2) / (t + 1)
//     lambda_t = sqrt(2 log(2 / alpha) / (n var_{t-1}))          (the predictable plug-in bet)
//     m_t(m) = m                                                 (an infinite population: iid rows)
//     m_t(m) = (N m - sum_{i<t} x_i) / (N - t + 1)               (a uniform random sample without
//                                                                 replacement of a population of N:
//                                                                 the mean of the values not yet
//                                                                 drawn if the population's is m)
//     K+(m) = prod_t (1 + min(lambda_t, c / m_t) (x_t - m_t))
//     K-(m) = prod_t (1 - min(lambda_t, c / (1 - m_t)) (x_t - m_t))
//   The interval is every m for which neither theta K+(m) nor (1 - theta) K-(m) ever reaches 1/alpha
//   as the rows come (a hypothesis m_t outside [0, 1] is impossible and rejected). Both are
//   nonnegative martingales under the hypothesis, so by Ville's inequality the true mean is rejected
//   with probability at most alpha, at any n. K+ falls and K- rises with m (so do their running
//   maxima), so the set is an interval [lo, hi], found by bisection to within 1e-10.
//
// The order matters to the bits but not to the coverage: callers pass the rows in the order the job
// drew them (positions of --order random) or by a key of the rows alone (RowKey), never by value.
// Below kMinIntervalRows rows no interval is given (the tests' simulation holds >= 93 % coverage from
// 10 rows on skewed populations; docs/metrics.md "Intervals" says why none is shown below).
#ifndef TALLY_METRICS_BOUNDED_MEAN_H_
#define TALLY_METRICS_BOUNDED_MEAN_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace tally {

inline constexpr int64_t kMinIntervalRows = 10;

// At most about this many values enter an interval: past it, a subsample fixed by the rows (below).
// At 65536 rows the interval is about +/- 0.001 wide for a typical spread of Dice; the bound keeps
// tallyd's memory at about 1 MiB a class whatever the manifest's size.
inline constexpr int64_t kMaxIntervalRows = int64_t{1} << 16;

// The values an interval is computed from, each with the key that orders them (a row's position in
// the job's order, or a key of the row alone: never its value), kept as rows arrive in any order
// and mergeable. Only values whose key lies below `key_limit`, fixed when the sample is made, are
// kept, so any order or split of the rows keeps the same values:
//   positions (the default): the first kMaxIntervalRows positions, a random sample of a random sample;
//   row keys (uniform 64-bit hashes): HashKeyLimit(rows) keeps a fraction 2^-k of them, the largest
//   that leaves at most kMaxIntervalRows of `rows` rows on average: a uniform subsample.
class IntervalSample {
 public:
  explicit IntervalSample(uint64_t key_limit = static_cast<uint64_t>(kMaxIntervalRows)) : limit_(key_limit) {}
  static uint64_t HashKeyLimit(double rows);
  void Add(uint64_t key, double value);
  // Both must have the same key limit (the same job's parts).
  void Merge(const IntervalSample& other);
  int64_t kept() const { return static_cast<int64_t>(values_.size()); }
  // BettingMeanCi95 of the kept values in key order (equal keys: by value).
  std::pair<double, double> Ci95(double population = 0) const;

 private:
  std::vector<std::pair<uint64_t, double>> values_;
  uint64_t limit_;  // Values with keys at or above it are not kept.
};

// The 95% betting interval of the mean of `values` (each in [0, 1], NaN-free, in their draw order).
// `population` > 0: they are a uniform random sample without replacement of that many values
// (finite-population interval); 0: independent draws. With fewer than kMinIntervalRows values,
// {NaN, NaN}.
std::pair<double, double> BettingMeanCi95(const std::vector<double>& values, double population = 0);

// The same interval for bets chosen by the caller (each lambda_t from the values before t only):
// every m that neither theta K+(m) nor (1 - theta) K-(m) ever takes to 1/alpha. No minimum count.
std::pair<double, double> BettingInterval(const std::vector<double>& values, const std::vector<double>& bets,
                                          double population = 0);

// Bets for a confidence sequence, where the number of values is not fixed in advance (a race stopped
// once decided, metrics/paired_race.h): lambda_t = sqrt(2 log(2 / alpha) / (var_{t-1} t log(1 + t)))
// (Waudby-Smith & Ramdas's predictable plug-in for confidence sequences), var as above.
double SequenceBet(int64_t t, double var_before);

}  // namespace tally

#endif  // TALLY_METRICS_BOUNDED_MEAN_H_
