#include "metrics/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
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

// Unbiased integer in [0, n) (Lemire's multiply-and-reject).
uint64_t Bounded(uint64_t* state, uint64_t n) {
  uint64_t x = SplitMix64(state);
  __uint128_t m = static_cast<__uint128_t>(x) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      x = SplitMix64(state);
      m = static_cast<__uint128_t>(x) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
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

std::pair<double, double> BootstrapMeanCi95(const std::vector<double>& values, int resamples, uint64_t seed,
                                            int threads) {
  const size_t n = values.size();
  if (n == 0 || resamples <= 0) return {kNaN, kNaN};
  std::vector<double> means(resamples);
  auto run = [&](int from, int to) {
    for (int r = from; r < to; ++r) {
      uint64_t state = seed ^ (0xA24BAED4963EE407ull * static_cast<uint64_t>(r + 1));
      double sum = 0, c = 0;
      for (size_t i = 0; i < n; ++i) CompensatedAdd(values[Bounded(&state, n)], &sum, &c);
      means[r] = (sum + c) / static_cast<double>(n);
    }
  };
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, resamples);
  if (n * static_cast<size_t>(resamples) < 2000000) threads = 1;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(run, resamples * t / threads, resamples * (t + 1) / threads);
  }
  for (auto& th : pool) th.join();
  std::vector<double> copy = means;
  double low = PercentileLinear(&copy, 0.025);
  copy = means;
  double high = PercentileLinear(&copy, 0.975);
  return {low, high};
}

uint64_t RowKey(const std::string& identity) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64.
  for (unsigned char ch : identity) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return SplitMix64(&h);
}

namespace {

// P(Poisson(1) <= k) * 2^64, k = 0..19 (the rest, under 1e-19, is 20).
struct PoissonTable {
  uint64_t cdf[20];
  PoissonTable() {
    long double p = std::exp(-1.0L), total = 0;
    for (int k = 0; k < 20; ++k) {
      total += p;
      const long double scaled = std::ldexp(total, 64);
      cdf[k] = scaled >= std::ldexp(1.0L, 64) ? ~uint64_t{0} : static_cast<uint64_t>(scaled);
      p /= (k + 1);
    }
  }
};

int PoissonFromUniform(uint64_t u) {
  static const PoissonTable table;
  // The first k with u < cdf[k]: the number of cdf entries at or below u. The first six without
  // branches (a random weight would mispredict every other one); beyond them (p = 6e-4) the loop.
  int k = (u >= table.cdf[0]) + (u >= table.cdf[1]) + (u >= table.cdf[2]) + (u >= table.cdf[3]) +
          (u >= table.cdf[4]) + (u >= table.cdf[5]);
  if (k == 6) {
    while (k < 20 && u >= table.cdf[k]) ++k;
  }
  return k;
}

uint64_t ReplicateBase(uint64_t seed, uint64_t key) {
  uint64_t s = seed ^ (key * 0xD1B54A32D192ED03ull);
  return SplitMix64(&s);
}

uint64_t ReplicateUniform(uint64_t base, int r) {
  uint64_t s = base + 0xA24BAED4963EE407ull * static_cast<uint64_t>(r + 1);
  return SplitMix64(&s);
}

}  // namespace

int PoissonWeight(uint64_t seed, uint64_t key, int r) {
  return PoissonFromUniform(ReplicateUniform(ReplicateBase(seed, key), r));
}

std::pair<double, double> PoissonBootstrapMeanCi95(const std::vector<double>& values,
                                                   const std::vector<uint64_t>& keys, int resamples, uint64_t seed) {
  PoissonBootstrapMean mean(resamples);
  std::vector<uint8_t> weights(std::max(0, resamples));
  for (size_t i = 0; i < values.size() && i < keys.size(); ++i) {
    PoissonBootstrapMean::RowWeights(seed, keys[i], resamples, weights.data());
    mean.Add(values[i], weights.data());
  }
  return mean.Ci95();
}

PoissonBootstrapMean::PoissonBootstrapMean(int resamples)
    : sum_(std::max(0, resamples), 0), weight_(std::max(0, resamples), 0), partial_(std::max(0, resamples), 0) {}

void PoissonBootstrapMean::RowWeights(uint64_t seed, uint64_t key, int resamples, uint8_t* out) {
  const uint64_t base = ReplicateBase(seed, key);
  for (int r = 0; r < resamples; ++r) out[r] = static_cast<uint8_t>(PoissonFromUniform(ReplicateUniform(base, r)));
}

void PoissonBootstrapMean::Flush() {
  for (size_t r = 0; r < sum_.size(); ++r) sum_[r] += partial_[r];
  std::fill(partial_.begin(), partial_.end(), 0);
  pending_ = 0;
}

void PoissonBootstrapMean::Add(double value, const uint8_t* weights) {
  // Values as integers of 2^-53: sums of weight x value are exact (and so the same in any order).
  const double v = std::isnan(value) ? 0.0 : std::clamp(value, 0.0, 1.0);
  const uint64_t fixed = static_cast<uint64_t>(std::llround(std::ldexp(v, 53)));
  const size_t n = sum_.size();
  uint64_t* partial = partial_.data();
  int64_t* weight = weight_.data();
  for (size_t r = 0; r < n; ++r) {  // Weights are at most 20 (PoissonFromUniform).
    partial[r] += fixed * weights[r];
    weight[r] += weights[r];
  }
  if (++pending_ == kPending) Flush();
  ++n_;
}

void PoissonBootstrapMean::Merge(const PoissonBootstrapMean& other) {
  Flush();
  for (size_t r = 0; r < sum_.size() && r < other.sum_.size(); ++r) {
    sum_[r] += other.sum_[r];
    sum_[r] += other.partial_[r];
    weight_[r] += other.weight_[r];
  }
  n_ += other.n_;
}

std::pair<double, double> PoissonBootstrapMean::Ci95() const {
  if (n_ == 0 || sum_.empty()) return {kNaN, kNaN};  // Replicates whose weights are all 0 are left out.
  std::vector<double> means;
  for (size_t r = 0; r < sum_.size(); ++r) {
    const __int128 sum = sum_[r] + partial_[r];
    if (weight_[r] > 0) means.push_back(std::ldexp(static_cast<double>(sum), -53) / static_cast<double>(weight_[r]));
  }
  if (means.empty()) return {kNaN, kNaN};
  std::vector<double> copy = means;
  const double low = PercentileLinear(&copy, 0.025);
  copy = means;
  return {low, PercentileLinear(&copy, 0.975)};
}

double SamplingHalfWidth95(int64_t n, double m2, double population) {
  if (n < 2) return std::numeric_limits<double>::infinity();
  const double nn = static_cast<double>(n);
  const double variance = std::max(0.0, m2) / (nn - 1);
  double fpc = 1;
  if (population > 1) fpc = std::sqrt(std::max(0.0, (population - nn) / (population - 1)));
  return 1.959963984540054 * std::sqrt(variance / nn) * fpc;
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

PairedSummary SummarisePairs(const std::vector<std::pair<double, double>>& pairs, int resamples, uint64_t seed) {
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
  std::tie(s.ci_low, s.ci_high) = BootstrapMeanCi95(diffs, resamples, seed, 0);
  s.wilcoxon_p = WilcoxonSignedRankP(diffs);
  return s;
}

}  // namespace tally
