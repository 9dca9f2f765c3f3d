#include "metrics/slice_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "metrics/statistics.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz),
// on the side of x where it converges fast.
double IncompleteBeta(double x, double a, double b) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
                                b * std::log1p(-x));
  if (x > (a + 1) / (a + b + 2)) return 1 - IncompleteBeta(1 - x, b, a);
  constexpr double kTiny = 1e-300;
  double f = 1, c = 1, d = 0;
  for (int i = 0; i <= 400; ++i) {
    const int m = i / 2;
    double numerator;
    if (i == 0) {
      numerator = 1;
    } else if (i % 2 == 0) {
      numerator = (m * (b - m) * x) / ((a + 2.0 * m - 1) * (a + 2.0 * m));
    } else {
      numerator = -((a + m) * (a + b + m) * x) / ((a + 2.0 * m) * (a + 2.0 * m + 1));
    }
    d = 1 + numerator * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    d = 1 / d;
    c = 1 + numerator / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    const double cd = c * d;
    f *= cd;
    if (std::fabs(1 - cd) < 1e-16) break;
  }
  return front * (f - 1) / a;
}

// Sums of one group's values (long double: the variance from sums keeps its digits).
struct Moments {
  int64_t n = 0;
  long double sum = 0, sum_sq = 0;
  void Add(double v) {
    ++n;
    sum += v;
    sum_sq += static_cast<long double>(v) * v;
  }
  double Mean() const { return n > 0 ? static_cast<double>(sum / n) : kNaN; }
  double Variance() const {  // Sample variance (n - 1).
    if (n < 2) return kNaN;
    const long double m = sum / n;
    return static_cast<double>(std::max<long double>(0, (sum_sq - n * m * m) / (n - 1)));
  }
};

Moments Minus(const Moments& all, const Moments& part) {
  Moments out;
  out.n = all.n - part.n;
  out.sum = all.sum - part.sum;
  out.sum_sq = all.sum_sq - part.sum_sq;
  return out;
}

void MeanInterval(const Moments& m, double* lo, double* hi) {
  if (m.n < 2) {
    *lo = *hi = kNaN;
    return;
  }
  const double half = StudentTQuantile(0.975, static_cast<double>(m.n - 1)) * std::sqrt(m.Variance() / m.n);
  *lo = m.Mean() - half;
  *hi = m.Mean() + half;
}

// Welch's test of inside < outside, and the effect's 95 % interval.
void Welch(const Moments& in, const Moments& out, Slice* s) {
  const double a = in.Variance() / in.n, b = out.Variance() / out.n;
  const double se = std::sqrt(a + b);
  s->test = "welch";
  if (!(se > 0)) {  // Both constant: the difference is what it is.
    s->p = s->effect < 0 ? 0 : 1;
    s->effect_lo = s->effect_hi = s->effect;
    return;
  }
  const double df = (a + b) * (a + b) / (a * a / (in.n - 1) + b * b / (out.n - 1));
  s->p = StudentTCdf(s->effect / se, df);
  const double half = StudentTQuantile(0.975, df) * se;
  s->effect_lo = s->effect - half;
  s->effect_hi = s->effect + half;
}

uint64_t NameSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Uniform in [0, n): rejection, so the draws are the generator's, not a library's distribution.
uint64_t Below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t r;
  do {
    r = rng();
  } while (r >= limit);
  return r % n;
}

// The permutation test: draws of `n` rows without replacement (Floyd's sampling), p = (1 + draws
// whose mean is at most the slice's) / (1 + draws).
double PermutationP(const std::vector<double>& values, int64_t n, double mean_inside, const SliceOptions& o,
                    const std::string& name) {
  std::mt19937_64 rng(NameSeed(o.seed, name));
  const int64_t total = static_cast<int64_t>(values.size());
  int64_t at_most = 0;
  std::vector<int64_t> drawn;
  // Compared as sums, with the slice's own sum recomputed as a draw's is (no rounding apart).
  const double target = mean_inside * static_cast<double>(n) * (1 + 1e-12) + 1e-12;
  for (int k = 0; k < o.permutations; ++k) {
    drawn.clear();
    double sum = 0;
    for (int64_t j = total - n; j < total; ++j) {
      int64_t t = static_cast<int64_t>(Below(rng, static_cast<uint64_t>(j + 1)));
      if (std::find(drawn.begin(), drawn.end(), t) != drawn.end()) t = j;
      drawn.push_back(t);
      sum += values[static_cast<size_t>(t)];
    }
    if (sum <= target) ++at_most;
  }
  return (1.0 + static_cast<double>(at_most)) / (1.0 + o.permutations);
}

// Candidate slices' rows with a value, keyed by their conditions.
using Key = std::vector<SliceCondition>;
struct KeyLess {
  bool operator()(const Key& a, const Key& b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
      return std::tie(x.attribute, x.value) < std::tie(y.attribute, y.value);
    });
  }
};

std::string NameOf(const Key& key) {
  std::string out;
  for (const SliceCondition& c : key) absl::StrAppend(&out, out.empty() ? "" : " & ", c.attribute, "=", c.value);
  return out;
}

bool Matches(const Key& key, const std::vector<const SliceAttribute*>& by_name_order,
             const std::map<std::string, size_t>& index_of, size_t row) {
  for (const SliceCondition& c : key) {
    if (by_name_order[index_of.at(c.attribute)]->values[row] != c.value) return false;
  }
  return true;
}

}  // namespace

double StudentTCdf(double t, double df) {
  if (std::isnan(t) || !(df > 0)) return kNaN;
  if (std::isinf(t)) return t > 0 ? 1 : 0;
  const double tail = 0.5 * IncompleteBeta(df / (df + t * t), df / 2, 0.5);
  return t > 0 ? 1 - tail : tail;
}

double StudentTQuantile(double p, double df) {
  if (!(p > 0 && p < 1) || !(df > 0)) return kNaN;
  double lo = -1, hi = 1;
  while (StudentTCdf(lo, df) > p) lo *= 2;
  while (StudentTCdf(hi, df) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-15 * std::max(1.0, std::fabs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (StudentTCdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<double> BenjaminiHochberg(const std::vector<double>& p) {
  const size_t m = p.size();
  std::vector<size_t> order(m);
  for (size_t i = 0; i < m; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<double> adjusted(m);
  double running = 1;
  for (size_t k = m; k-- > 0;) {
    running = std::min(running, p[order[k]] * static_cast<double>(m) / static_cast<double>(k + 1));
    adjusted[order[k]] = std::min(1.0, running);
  }
  return adjusted;
}

std::vector<std::string> QuantileBins(const std::vector<std::string>& values, int bins) {
  std::vector<double> parsed(values.size(), kNaN);
  for (size_t i = 0; i < values.size(); ++i) {
    double v;
    if (absl::SimpleAtod(values[i], &v)) parsed[i] = v;
  }
  return QuantileBins(parsed, bins);
}

std::vector<std::string> QuantileBins(const std::vector<double>& values, int bins) {
  std::vector<double> numbers;
  for (double v : values) {
    if (std::isfinite(v)) numbers.push_back(v);
  }
  std::vector<std::string> out(values.size());
  if (numbers.empty() || bins < 1) return out;
  std::vector<double> edges;  // numpy.quantile(numbers, k / bins), k = 0..bins, distinct.
  for (int k = 0; k <= bins; ++k) {
    const double e = PercentileLinear(&numbers, static_cast<double>(k) / bins);
    if (edges.empty() || e > edges.back()) edges.push_back(e);
  }
  if (edges.size() == 1) edges.push_back(edges[0]);
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    size_t b = 1;
    while (b + 1 < edges.size() && values[i] > edges[b]) ++b;
    out[i] = absl::StrFormat("q%d [%.6g, %.6g]", b, edges[b - 1], edges[b]);
  }
  return out;
}

namespace {

// The attributes worth searching (2 to max_values distinct values among `rows`); the others into
// result->skipped with why.
std::vector<const SliceAttribute*> ChooseAttributes(const std::vector<SliceAttribute>& attributes,
                                                    const std::vector<size_t>& rows, size_t n,
                                                    const SliceOptions& options, SliceSearch* result) {
  std::vector<const SliceAttribute*> used;
  for (const SliceAttribute& a : attributes) {
    std::set<std::string> distinct;
    for (size_t i : rows) {
      if (i < a.values.size() && !a.values[i].empty()) distinct.insert(a.values[i]);
    }
    if (a.values.size() != n) {
      result->skipped.push_back(absl::StrCat(a.name, ": not one value per row"));
    } else if (distinct.size() < 2) {
      result->skipped.push_back(absl::StrCat(a.name, ": ", distinct.size(), " distinct value(s)"));
    } else if (static_cast<int>(distinct.size()) > options.max_values) {
      result->skipped.push_back(absl::StrCat(a.name, ": ", distinct.size(), " distinct values (more than ",
                                             options.max_values, "; bin it)"));
    } else {
      used.push_back(&a);
      result->attributes.push_back(a.name);
    }
  }
  return used;
}

// Every candidate's moments, in one pass over the rows: each attribute's values as small codes, the
// moments in arrays (a value each, a pair of values each), then the non-empty ones by their conditions.
std::map<Key, Moments, KeyLess> CandidateGroups(const std::vector<double>& values, const std::vector<size_t>& rows,
                                                const std::vector<const SliceAttribute*>& used, bool pairs) {
  const size_t n = used.size();
  std::vector<std::vector<std::string>> names(n);
  std::vector<std::vector<int>> codes(n);
  for (size_t a = 0; a < n; ++a) {
    std::map<std::string, int> code;
    for (size_t i : rows) {
      if (!used[a]->values[i].empty()) code.emplace(used[a]->values[i], 0);
    }
    for (auto& [value, c] : code) {
      c = static_cast<int>(names[a].size());
      names[a].push_back(value);
    }
    codes[a].assign(values.size(), -1);
    for (size_t i : rows) {
      if (!used[a]->values[i].empty()) codes[a][i] = code[used[a]->values[i]];
    }
  }
  std::vector<std::vector<Moments>> single(n);
  std::vector<std::vector<std::vector<Moments>>> pair(n, std::vector<std::vector<Moments>>(n));
  for (size_t a = 0; a < n; ++a) {
    single[a].resize(names[a].size());
    for (size_t b = a + 1; pairs && b < n; ++b) pair[a][b].resize(names[a].size() * names[b].size());
  }
  for (size_t i : rows) {
    for (size_t a = 0; a < n; ++a) {
      const int ca = codes[a][i];
      if (ca < 0) continue;
      single[a][ca].Add(values[i]);
      for (size_t b = a + 1; pairs && b < n; ++b) {
        if (codes[b][i] >= 0) pair[a][b][ca * names[b].size() + codes[b][i]].Add(values[i]);
      }
    }
  }
  std::map<Key, Moments, KeyLess> groups;
  for (size_t a = 0; a < n; ++a) {
    for (size_t va = 0; va < names[a].size(); ++va) {
      const SliceCondition ca{used[a]->name, names[a][va]};
      if (single[a][va].n > 0) groups[{ca}] = single[a][va];
      for (size_t b = a + 1; pairs && b < n; ++b) {
        for (size_t vb = 0; vb < names[b].size(); ++vb) {
          const Moments& m = pair[a][b][va * names[b].size() + vb];
          if (m.n > 0) groups[{ca, SliceCondition{used[b]->name, names[b][vb]}}] = m;
        }
      }
    }
  }
  return groups;
}

// One candidate's figures and test.
Slice TestCandidate(const Key& key, const Moments& in, const Moments& all, const std::vector<double>& column,
                    const SliceOptions& options) {
  const Moments out = Minus(all, in);
  Slice s;
  s.conditions = key;
  s.name = NameOf(key);
  s.rows = in.n;
  s.mean_inside = in.Mean();
  s.mean_outside = out.Mean();
  s.effect = s.mean_inside - s.mean_outside;
  MeanInterval(in, &s.inside_lo, &s.inside_hi);
  MeanInterval(out, &s.outside_lo, &s.outside_hi);
  Welch(in, out, &s);
  if (in.n < options.permutation_below) {
    s.test = "permutation";
    s.p = PermutationP(column, in.n, s.mean_inside, options, s.name);
  }
  return s;
}

// Slices of exactly the rows of one before them (in their order) folded into it: one finding, two
// names ("site=C & size=small" and "site=C & derived:fg_fraction=0.0625"). True for each folded one.
std::vector<bool> FoldSameRows(std::vector<Slice>* significant, const std::vector<size_t>& rows, const std::vector<const SliceAttribute*>& used,
                               const std::map<std::string, size_t>& index_of) {
  // Only slices with a twin in rows and effect (the same rows give the same sums, bit for bit) are
  // read row by row.
  std::map<std::pair<int64_t, double>, int> twins;
  for (const Slice& x : *significant) ++twins[{x.rows, x.effect}];
  std::vector<uint64_t> print(significant->size(), 1469598103934665603ull);
  for (size_t k = 0; k < significant->size(); ++k) {
    if (twins[{(*significant)[k].rows, (*significant)[k].effect}] < 2) continue;
    for (size_t i : rows) {
      if (Matches((*significant)[k].conditions, used, index_of, i)) print[k] = (print[k] ^ i) * 1099511628211ull;
    }
  }
  std::vector<bool> folded(significant->size(), false);
  for (size_t k = 0; k < significant->size(); ++k) {
    for (size_t j = 0; j < k; ++j) {
      const Slice &a = (*significant)[j], &b = (*significant)[k];
      if (!folded[j] && a.rows == b.rows && a.effect == b.effect && print[j] == print[k]) {
        (*significant)[j].folded.push_back((*significant)[k].name);
        folded[k] = true;
        break;
      }
    }
  }
  return folded;
}

// Two-condition slices folded into a significant one-condition slice of either condition whose
// mean's interval does not lie above theirs (they are no worse than it): true for each folded one.
std::vector<bool> Fold(std::vector<Slice>* significant, const std::vector<bool>& already) {
  std::vector<bool> folded = already;
  for (size_t k = 0; k < significant->size(); ++k) {
    const Slice& small = (*significant)[k];
    if (small.conditions.size() != 2 || folded[k]) continue;
    for (size_t j = 0; j < significant->size(); ++j) {
      Slice& big = (*significant)[j];
      if (big.conditions.size() != 1 || folded[j]) continue;
      const SliceCondition& c = big.conditions[0];
      const bool inside = std::any_of(small.conditions.begin(), small.conditions.end(), [&](const SliceCondition& x) {
        return x.attribute == c.attribute && x.value == c.value;
      });
      if (inside && small.mean_inside >= big.inside_lo) {
        big.folded.push_back(small.name);
        folded[k] = true;
        break;
      }
    }
  }
  return folded;
}

}  // namespace

SliceSearch FindSlices(const std::vector<double>& values, const std::vector<SliceAttribute>& attributes,
                       const SliceOptions& options) {
  SliceSearch result;
  std::vector<size_t> rows;  // Rows with a finite value.
  std::vector<double> column;
  Moments all;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) {
      rows.push_back(i);
      column.push_back(values[i]);
      all.Add(values[i]);
    }
  }
  result.rows = all.n;
  const std::vector<const SliceAttribute*> used = ChooseAttributes(attributes, rows, values.size(), options, &result);
  std::map<std::string, size_t> index_of;
  for (size_t k = 0; k < used.size(); ++k) index_of[used[k]->name] = k;
  const std::map<Key, Moments, KeyLess> groups = CandidateGroups(values, rows, used, options.pairs);
  result.candidates = static_cast<int64_t>(groups.size());
  std::vector<Slice> tested;
  for (const auto& [key, in] : groups) {
    if (in.n >= options.min_rows && all.n - in.n >= 2) tested.push_back(TestCandidate(key, in, all, column, options));
  }
  result.tested = static_cast<int64_t>(tested.size());
  std::vector<double> p;
  for (const Slice& s : tested) p.push_back(s.p);
  const std::vector<double> adjusted = BenjaminiHochberg(p);
  std::vector<Slice> significant;
  for (size_t k = 0; k < tested.size(); ++k) {
    tested[k].p_adjusted = adjusted[k];
    if (adjusted[k] <= options.q && tested[k].effect < 0) significant.push_back(std::move(tested[k]));
  }
  result.significant = static_cast<int64_t>(significant.size());
  // Largest drop first; among equal drops (the same rows, named twice) fewer conditions, then the
  // attributes given first (a manifest's columns before derived ones), then the name.
  const auto rank = [&](const Slice& x) {
    size_t r = 0;
    for (const SliceCondition& c : x.conditions) r = std::max(r, index_of.at(c.attribute));
    return std::make_tuple(x.effect, x.conditions.size(), r, x.name);
  };
  std::sort(significant.begin(), significant.end(), [&](const Slice& a, const Slice& b) { return rank(a) < rank(b); });
  std::vector<bool> folded = FoldSameRows(&significant, rows, used, index_of);
  const std::vector<bool> inside_larger = Fold(&significant, folded);
  for (size_t k = 0; k < significant.size(); ++k) folded[k] = folded[k] || inside_larger[k];
  for (size_t k = 0; k < significant.size(); ++k) {
    if (folded[k]) continue;
    Slice& s = significant[k];
    std::vector<std::pair<double, int64_t>> inside;
    for (size_t i : rows) {
      if (Matches(s.conditions, used, index_of, i)) inside.emplace_back(values[i], static_cast<int64_t>(i));
    }
    std::sort(inside.begin(), inside.end());
    for (size_t j = 0; j < inside.size() && j < 5; ++j) s.worst_rows.push_back(inside[j].second);
    result.slices.push_back(std::move(s));
  }
  return result;
}

SliceAttribute NumericSliceAttribute(const std::string& name, const std::vector<double>& values, int bins,
                                     int max_values) {
  std::set<double> distinct;
  for (double v : values) {
    if (std::isfinite(v)) distinct.insert(v);
  }
  if (static_cast<int>(distinct.size()) > max_values) {
    return SliceAttribute{absl::StrCat(name, " (", bins, " quantile bins)"), QuantileBins(values, bins)};
  }
  SliceAttribute a{name, {}};
  for (double v : values) a.values.push_back(std::isfinite(v) ? absl::StrFormat("%.17g", v) : std::string());
  return a;
}

}  // namespace tally
