#include "metrics/statistics.h"

#include "metrics/bounded_mean.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Lerp(double a, double b, double t) {
  // numpy's _lerp: symmetric form that is exact at both ends.
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1.0 - t) : a + diff * t;
}

}  // namespace

void CompensatedAdd(double x, double* sum, double* c) {
  const double t = *sum + x;
  if (std::fabs(*sum) >= std::fabs(x)) {
    *c += (*sum - t) + x;
  } else {
    *c += (x - t) + *sum;
  }
  *sum = t;
}

size_t PercentileRank(size_t n, double q) { return static_cast<size_t>(std::floor(q * static_cast<double>(n - 1))); }

double PercentileFromRanks(double at, double next, size_t n, double q) {
  const double pos = q * static_cast<double>(n - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const double t = pos - static_cast<double>(lo);
  if (lo + 1 >= n || t == 0) return at;
  if (std::isinf(at) || std::isinf(next)) return at == next ? at : (t > 0 ? next : at);
  return Lerp(at, next, t);
}

double PercentileLinear(std::vector<double>* values, double q) {
  const size_t n = values->size();
  if (n == 0) return kNaN;
  const size_t lo = PercentileRank(n, q);
  std::nth_element(values->begin(), values->begin() + lo, values->end());
  const double a = (*values)[lo];
  const double b = lo + 1 < n ? *std::min_element(values->begin() + lo + 1, values->end()) : a;
  return PercentileFromRanks(a, b, n, q);
}

uint64_t RowKey(const std::string& identity) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64.
  for (unsigned char ch : identity) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return SplitMix64(&h);
}

double WilcoxonSignedRankP(std::vector<double> diffs) {
  diffs.erase(std::remove(diffs.begin(), diffs.end(), 0.0), diffs.end());
  const size_t n = diffs.size();
  if (n == 0) return kNaN;
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return std::fabs(diffs[x]) < std::fabs(diffs[y]); });
  double w_plus = 0, tie_term = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && std::fabs(diffs[order[j + 1]]) == std::fabs(diffs[order[i]])) ++j;
    const double rank = (static_cast<double>(i + 1) + static_cast<double>(j + 1)) / 2.0;  // Average rank.
    const double t = static_cast<double>(j - i + 1);
    tie_term += t * t * t - t;
    for (size_t k = i; k <= j; ++k) {
      if (diffs[order[k]] > 0) w_plus += rank;
    }
    i = j + 1;
  }
  const double nn = static_cast<double>(n);
  const double mean = nn * (nn + 1) / 4.0;
  const double var = nn * (nn + 1) * (2 * nn + 1) / 24.0 - tie_term / 48.0;
  if (var <= 0) return 1.0;
  const double z = (w_plus - mean) / std::sqrt(var);
  return std::erfc(std::fabs(z) / std::sqrt(2.0));
}

PairedSummary SummarisePairs(const std::vector<std::pair<double, double>>& pairs, bool bounded) {
  PairedSummary s;
  s.pairs = static_cast<int64_t>(pairs.size());
  std::vector<double> diffs;
  double sa = 0, sb = 0, sd = 0;
  for (const auto& [x, y] : pairs) {
    sa += x;
    sb += y;
    diffs.push_back(y - x);
    sd += diffs.back();
    s.higher += y > x;
    s.lower += y < x;
  }
  const double n = static_cast<double>(pairs.size());
  s.mean_a = pairs.empty() ? kNaN : sa / n;
  s.mean_b = pairs.empty() ? kNaN : sb / n;
  s.mean_diff = pairs.empty() ? kNaN : sd / n;
  s.ci_low = s.ci_high = kNaN;
  if (bounded) {
    std::vector<double> unit(diffs.size());
    for (size_t i = 0; i < diffs.size(); ++i) unit[i] = std::clamp((diffs[i] + 1) / 2, 0.0, 1.0);
    const std::pair<double, double> ci = BettingMeanCi95(unit);
    if (!std::isnan(ci.first)) {
      s.ci_low = 2 * ci.first - 1;
      s.ci_high = 2 * ci.second - 1;
    }
  }
  s.wilcoxon_p = WilcoxonSignedRankP(diffs);
  return s;
}

}  // namespace tally
