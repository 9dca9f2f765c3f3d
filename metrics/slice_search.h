// Failing slices (tally slices): subsets of a job's rows, each named by one condition on a row's
// attribute (site = B, fg_fraction in its lowest quartile) or by two on different attributes,
// whose mean per-row value (Dice by default) is lower than the rest of the set's, found by testing
// every candidate and controlling the false discovery rate over all of them.
//
//   Candidates   every value of every attribute with at most `max_values` distinct values
//                (numeric attributes with more are binned first: quantile bins, `bins` of them, by
//                the caller), and every conjunction of two conditions on different attributes.
//                A candidate is tested when it has at least `min_rows` rows with a value and the
//                rest has at least 2; the others are counted as untested.
//   Test         one-sided (the slice lower): Welch's t-test on the values inside against outside
//                (scipy.stats.ttest_ind(inside, outside, equal_var=False, alternative="less")),
//                or, where the slice has fewer than `permutation_below` rows, a permutation test:
//                `permutations` seeded draws of as many rows from the whole set without replacement,
//                p = (1 + draws whose inside mean is at most the slice's) / (1 + permutations).
//   Correction   Benjamini-Hochberg over every candidate tested (p_(i) m / i, made monotone from
//                the largest down, at most 1); significant where the adjusted p-value <= q.
//   Folding      a significant two-condition slice is folded into a significant one-condition slice
//                it lies inside (the first, in the order below) unless its mean lies below that
//                slice's 95 % interval of its mean: no worse than the larger slice, it says nothing
//                the larger slice does not (site=B & size=small inside size=small).
//                Before that, a significant slice of exactly the rows of one ranked before it is
//                folded into that one (the same finding under two names).
//   Order        largest effect (most negative) first; among equal effects fewer conditions, then
//                the attributes given first, then the name: deterministic.
#ifndef TALLY_METRICS_SLICE_SEARCH_H_
#define TALLY_METRICS_SLICE_SEARCH_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tally {

// One attribute of every row (a manifest column, a binned property): its value per row, as text
// ("" where the row has none: never in a slice).
struct SliceAttribute {
  std::string name;
  std::vector<std::string> values;
};

struct SliceOptions {
  int max_values = 20;          // Attributes with more distinct values are left out (bin them first).
  int64_t min_rows = 5;         // Smaller slices are not tested.
  int64_t permutation_below = 30;  // Slices with fewer rows: the permutation test.
  int permutations = 9999;
  uint64_t seed = 1;            // The permutation test's draws.
  double q = 0.05;              // Benjamini-Hochberg's false discovery rate.
  bool pairs = true;            // Conjunctions of two conditions.
};

struct SliceCondition {
  std::string attribute;
  std::string value;
};

struct Slice {
  std::vector<SliceCondition> conditions;  // One or two.
  std::string name;                        // "site=B" or "site=B & scanner=X".
  int64_t rows = 0;                        // Rows inside with a value.
  double mean_inside = 0, mean_outside = 0;
  double inside_lo = 0, inside_hi = 0;     // 95 % t intervals of each mean.
  double outside_lo = 0, outside_hi = 0;
  double effect = 0;                       // mean_inside - mean_outside.
  double effect_lo = 0, effect_hi = 0;     // Welch's 95 % interval of the effect.
  std::string test;                        // "welch" or "permutation".
  double p = 0;                            // One-sided.
  double p_adjusted = 0;                   // Benjamini-Hochberg.
  std::vector<std::string> folded;         // Names of the slices folded into this one.
  std::vector<int64_t> worst_rows;         // Inside, lowest values first (at most 5).
};

struct SliceSearch {
  int64_t rows = 0;          // Rows with a finite value.
  int64_t candidates = 0;    // Every candidate considered.
  int64_t tested = 0;        // Those tested: the Benjamini-Hochberg m.
  int64_t significant = 0;   // Adjusted p <= q, before folding.
  std::vector<Slice> slices; // Significant, unfolded, in order.
  std::vector<std::string> attributes;  // Searched.
  std::vector<std::string> skipped;     // Left out, with why ("id: 1000 distinct values").
};

// `values[i]` is row i's value (NaN: not evaluated or undefined, left out); each attribute has one
// value per row.
SliceSearch FindSlices(const std::vector<double>& values, const std::vector<SliceAttribute>& attributes,
                       const SliceOptions& options);

// Student's t distribution's CDF at t with df degrees of freedom (df > 0, not necessarily whole).
double StudentTCdf(double t, double df);
// Its quantile: StudentTCdf(StudentTQuantile(p, df), df) == p for p in (0, 1).
double StudentTQuantile(double p, double df);
// Benjamini-Hochberg adjusted p-values, in the input's order.
std::vector<double> BenjaminiHochberg(const std::vector<double>& p);
// Quantile bins of a numeric attribute: each value's bin as "q1 [lo, hi]" .. "qK [lo, hi]" (numpy's
// linear quantiles as edges; a value on an inner edge goes to the lower bin), "" where the text
// is not a number. Fewer bins where edges coincide.
std::vector<std::string> QuantileBins(const std::vector<std::string>& values, int bins);
// The same of numbers (NaN and infinities: no bin).
std::vector<std::string> QuantileBins(const std::vector<double>& values, int bins);

// A numeric attribute: each value as text ("%.17g") where it has at most `max_values` distinct
// finite values, else in `bins` quantile bins (QuantileBins) and named "NAME (K quantile bins)";
// NaN and infinities are no value.
SliceAttribute NumericSliceAttribute(const std::string& name, const std::vector<double>& values, int bins,
                                     int max_values);

}  // namespace tally

#endif  // TALLY_METRICS_SLICE_SEARCH_H_
