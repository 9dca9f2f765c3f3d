// Statistics over per-image values that the aggregate and the comparison of two runs report:
// numpy-style percentiles, compensated sums, rows' keys, and the Wilcoxon signed-rank test of paired
// differences (intervals of means: metrics/bounded_mean.h).
//
//   PercentileLinear    numpy.percentile(values, 100 q) with its default linear interpolation
//                       (numpy's _lerp, exact at both ends).
//   CompensatedAdd      Neumaier's compensated running sum: means as exact as numpy's pairwise sum
//                       or more, depending only on the order of the values.
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

// A row's key: a 64-bit hash (FNV-1a, then SplitMix64's finaliser) of its identity. Intervals read
// a finished job's rows in this order (aggregator.h): fixed by the rows, not their values or order.
uint64_t RowKey(const std::string& identity);
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
  // The differences' 95% interval: for metrics in [0, 1] the betting interval (bounded_mean.h) of
  // (d + 1) / 2 mapped back, valid at any number of pairs; NaN for unbounded ones (surface
  // distances), whose mean no finite sample can bound.
  double ci_low = 0, ci_high = 0;
  double wilcoxon_p = 0;           // WilcoxonSignedRankP of the differences.
  int64_t higher = 0, lower = 0;   // Pairs where B is above / below A.
};
// `pairs` are (a, b) in a fixed order (the manifest's); plain sums, as the comparison reports them.
// `bounded`: both values lie in [0, 1].
PairedSummary SummarisePairs(const std::vector<std::pair<double, double>>& pairs, bool bounded);

}  // namespace tally

#endif  // TALLY_METRICS_STATISTICS_H_
