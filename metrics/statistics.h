// Statistics over per-image values that the aggregate and the comparison of two runs report:
// numpy-style percentiles, compensated sums, the percentile bootstrap of a mean, and the Wilcoxon
// signed-rank test of paired differences.
//
//   PercentileLinear    numpy.percentile(values, 100 q) with its default linear interpolation
//                       (numpy's _lerp, exact at both ends).
//   CompensatedAdd      Neumaier's compensated running sum: means as exact as numpy's pairwise sum
//                       or more, depending only on the order of the values.
//   BootstrapMeanCi95   the percentile bootstrap (Efron & Tibshirani 1993, ch. 13): `resamples` means
//                       of n values drawn with replacement (SplitMix64 streams, Lemire's unbiased
//                       bounded draws, one stream per resample), their 2.5th and 97.5th percentiles.
//   PoissonBootstrapMeanCi95  the Poisson bootstrap (Hanley & MacGibbon 2006; Chamandy et al. 2012,
//                       "Estimating uncertainty for massive data streams"): in each of `resamples`
//                       replicates every value gets a Poisson(1) weight drawn from (seed, its row's
//                       key, replicate) alone, the replicate's mean is sum(w x) / sum(w), and the
//                       interval is the 2.5th and 97.5th percentiles of those means. The weights
//                       depend on the rows, not on their order, and the sums are exact (fixed
//                       point), so any order or split of the rows gives the same interval to the bit.
//   WilcoxonSignedRankP scipy.stats.wilcoxon(d, method="approx"): zero differences dropped, average
//                       ranks for ties, normal approximation with the tie correction and without
//                       continuity correction; two-sided.
#ifndef TALLY_METRICS_STATISTICS_H_
#define TALLY_METRICS_STATISTICS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tally {

// Percentile with linear interpolation between closest ranks, as numpy.percentile's default.
// q in [0, 1]. Reorders `values`. NaN for an empty vector.
double PercentileLinear(std::vector<double>* values, double q);
// The same from order statistics, for values sorted elsewhere (the GPU's surface distances): of n
// values (n > 0), PercentileRank(n, q) is the rank (0-based) of the smaller value q's position
// falls between; `at` is the value of that rank and `next` of the one after (any value where
// there is none).
size_t PercentileRank(size_t n, double q);
double PercentileFromRanks(double at, double next, size_t n, double q);

// Neumaier-compensated running sum: the result depends only on the order of the values.
void CompensatedAdd(double x, double* sum, double* c);

// Percentile bootstrap of the mean: `resamples` means of n values drawn with replacement; returns
// the 2.5th and 97.5th percentiles (linear interpolation). Deterministic for a given seed,
// whatever `threads` is. NaN, NaN for an empty input.
std::pair<double, double> BootstrapMeanCi95(const std::vector<double>& values, int resamples, uint64_t seed,
                                            int threads);

// A row's bootstrap key: a 64-bit hash (FNV-1a, then SplitMix64's finaliser) of its identity.
uint64_t RowKey(const std::string& identity);
// The Poisson(1) weight of the row with `key` in replicate `r` of `seed`'s bootstrap.
int PoissonWeight(uint64_t seed, uint64_t key, int r);
// The Poisson bootstrap interval of the mean of `values` (each in [0, 1]; values outside are
// clamped) whose rows have `keys` (same length). Replicates whose weights are all 0 are left out;
// NaN, NaN for an empty input. Deterministic for a given seed and set of (key, value) pairs,
// whatever their order: PoissonBootstrapMean below, fed these rows.
std::pair<double, double> PoissonBootstrapMeanCi95(const std::vector<double>& values,
                                                   const std::vector<uint64_t>& keys, int resamples, uint64_t seed);

// The same interval kept as rows arrive (Add), in any order and split (Merge), so that a job's
// interval is ready when its last row is: per replicate the exact sum of weight x value and of the
// weights (aggregator_test holds it to an independent replicate-by-replicate computation).
class PoissonBootstrapMean {
 public:
  explicit PoissonBootstrapMean(int resamples);
  // The Poisson(1) weights of the row with `key` in every replicate (`out`: resamples entries).
  // Computed once per row and shared by every class's accumulator.
  static void RowWeights(uint64_t seed, uint64_t key, int resamples, uint8_t* out);
  void Add(double value, const uint8_t* weights);
  void Merge(const PoissonBootstrapMean& other);
  std::pair<double, double> Ci95() const;

 private:
  void Flush();
  std::vector<__int128> sum_;
  std::vector<int64_t> weight_;
  // Sums of the last rows, below 2^63 for up to kPending of them (values <= 2^53, weights <= 20),
  // added into sum_ every kPending rows: 64-bit adds instead of 128-bit ones.
  static constexpr int kPending = 32;
  std::vector<uint64_t> partial_;
  int pending_ = 0;
  int64_t n_ = 0;
};

// Half-width of the 95% interval of a mean over a simple random sample without replacement: n
// values with sum of squared deviations m2 (Welford), drawn from `population` values (<= 1: an
// infinite population, no correction): 1.96 * s / sqrt(n) * sqrt((N - n) / (N - 1)) (the normal
// interval with the finite-population correction, Cochran 1977, 2.15). Infinity for n < 2.
double SamplingHalfWidth95(int64_t n, double m2, double population);

// Two-sided p-value of the Wilcoxon signed-rank test of `diffs` against 0: zero differences
// dropped (Wilcoxon's method), average ranks for ties, normal approximation with the tie
// correction and without continuity correction (scipy.stats.wilcoxon(..., method="approx")).
// NaN with no non-zero difference.
double WilcoxonSignedRankP(std::vector<double> diffs);

// Two runs' values of one metric over the images where both are finite, paired.
struct PairedSummary {
  int64_t pairs = 0;
  double mean_a = 0, mean_b = 0;   // Over the pairs (NaN without any).
  double mean_diff = 0;            // mean(B - A).
  double ci_low = 0, ci_high = 0;  // BootstrapMeanCi95 of the differences.
  double wilcoxon_p = 0;           // WilcoxonSignedRankP of the differences.
  int64_t higher = 0, lower = 0;   // Pairs where B is above / below A.
};
// `pairs` are (a, b) in a fixed order (the manifest's); plain sums, as the comparison reports them.
PairedSummary SummarisePairs(const std::vector<std::pair<double, double>>& pairs, int resamples, uint64_t seed);

}  // namespace tally

#endif  // TALLY_METRICS_STATISTICS_H_
