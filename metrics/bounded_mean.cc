#include "metrics/bounded_mean.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tally {
namespace {

constexpr double kAlpha = 0.05;
constexpr double kTheta = 0.5;
constexpr double kTruncation = 0.75;

// The bets lambda_t, which depend on the values only (not on m).
std::vector<double> Bets(const std::vector<double>& x) {
  const double n = static_cast<double>(x.size());
  const double numerator = 2 * std::log(2 / kAlpha);
  std::vector<double> lambda(x.size());
  double sum = 0, squares = 0.25;
  for (size_t t = 0; t < x.size(); ++t) {
    const double var = squares / static_cast<double>(t + 1);  // var_{t-1}: (1/4 + ...) / t, t from 1.
    lambda[t] = std::sqrt(numerator / (n * var));
    sum += x[t];
    const double mu = (0.5 + sum) / static_cast<double>(t + 2);
    squares += (x[t] - mu) * (x[t] - mu);
  }
  return lambda;
}

// Whether m is rejected by K+ (`upper` false: the interval's low side) or by K- (`upper` true).
bool Rejected(const std::vector<double>& x, const std::vector<double>& lambda, double population, double m,
              bool upper) {
  const double threshold = std::log(1 / (kAlpha * (upper ? 1 - kTheta : kTheta)));
  double log_capital = 0, drawn = 0;
  for (size_t t = 0; t < x.size(); ++t) {
    double mt = m;
    if (population > 0) mt = (population * m - drawn) / (population - static_cast<double>(t));
    drawn += x[t];
    if (!upper) {
      if (mt <= 0) {
        if (mt < 0 || x[t] > 0) return true;  // The values left cannot have that mean.
        continue;
      }
      log_capital += std::log1p(std::min(lambda[t], kTruncation / mt) * (x[t] - mt));
    } else {
      if (mt >= 1) {
        if (mt > 1 || x[t] < 1) return true;
        continue;
      }
      log_capital += std::log1p(-std::min(lambda[t], kTruncation / (1 - mt)) * (x[t] - mt));
    }
    if (log_capital >= threshold) return true;
  }
  return false;
}

}  // namespace

double SequenceBet(int64_t t, double var_before) {
  const double td = static_cast<double>(std::max<int64_t>(t, 1));
  return std::sqrt(2 * std::log(2 / kAlpha) / (var_before * td * std::log1p(td)));
}

std::pair<double, double> BettingMeanCi95(const std::vector<double>& values, double population) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (static_cast<int64_t>(values.size()) < kMinIntervalRows) return {nan, nan};
  return BettingInterval(values, Bets(values), population);
}

std::pair<double, double> BettingInterval(const std::vector<double>& values, const std::vector<double>& lambda,
                                          double population) {
  if (population > 0 && population < static_cast<double>(values.size())) population = 0;
  // Low end: the smallest m that K+ does not reject (K+ falls with m); high end likewise with K-.
  double lo = 0, hi = 1;
  if (Rejected(values, lambda, population, 0, false)) {
    double a = 0, b = 1;  // Rejected at a, not at b (or b is 1).
    while (b - a > 1e-10) {
      const double mid = 0.5 * (a + b);
      (Rejected(values, lambda, population, mid, false) ? a : b) = mid;
    }
    lo = a;
  }
  if (Rejected(values, lambda, population, 1, true)) {
    double a = 0, b = 1;  // Not rejected at a (or a is 0), rejected at b.
    while (b - a > 1e-10) {
      const double mid = 0.5 * (a + b);
      (Rejected(values, lambda, population, mid, true) ? b : a) = mid;
    }
    hi = b;
  }
  return {lo, std::max(lo, hi)};
}

uint64_t IntervalSample::HashKeyLimit(double rows) {
  int shift = 0;
  while (shift < 63 && rows > static_cast<double>(kMaxIntervalRows) * std::ldexp(1.0, shift)) ++shift;
  return shift == 0 ? ~uint64_t{0} : uint64_t{1} << (64 - shift);
}

void IntervalSample::Add(uint64_t key, double value) {
  if (key < limit_) values_.emplace_back(key, value);
}

void IntervalSample::Merge(const IntervalSample& other) {
  for (const auto& e : other.values_) Add(e.first, e.second);
}

std::pair<double, double> IntervalSample::Ci95(double population) const {
  std::vector<std::pair<uint64_t, double>> sorted = values_;
  std::sort(sorted.begin(), sorted.end());
  std::vector<double> v;
  v.reserve(sorted.size());
  for (const auto& e : sorted) v.push_back(e.second);
  return BettingMeanCi95(v, population);
}

}  // namespace tally
