#include "metrics/paired_race.h"

#include <algorithm>
#include <cmath>

#include "metrics/bounded_mean.h"

namespace tally {
namespace {

constexpr double kAlpha = 0.05;
constexpr double kTheta = 0.5;        // As bounded_mean.cc: the two-sided interval's split.
constexpr double kTruncation = 0.75;

}  // namespace

PairedRace::PairedRace(int64_t rows, double margin)
    : population_(std::max<int64_t>(rows, 0)), margin_(std::max(margin, 0.0)), target_((1 - margin_) / 2) {}

void PairedRace::Add(double difference) {
  const double x = (std::clamp(difference, -1.0, 1.0) + 1) / 2;
  const int64_t t = static_cast<int64_t>(x_.size());  // Rows before this one.
  const double bet = SequenceBet(t + 1, squares_ / static_cast<double>(t + 1));
  // K-(m*) one row on, as bounded_mean.cc's Rejected (upper side) takes it.
  const bool finite = population_ > 0 && t < population_;
  const double drawn = sum_;
  const double mt = finite ? (static_cast<double>(population_) * target_ - drawn) / static_cast<double>(population_ - t)
                           : target_;
  x_.push_back(x);
  bets_.push_back(bet);
  sum_ += x;
  const double mu = (0.5 + sum_) / static_cast<double>(t + 2);
  squares_ += (x - mu) * (x - mu);
  if (decided_at_ > 0) return;
  if (mt >= 1) {
    if (mt > 1 || x < 1) decided_at_ = t + 1;  // The rows left cannot bring the mean up to m*.
    return;
  }
  log_capital_ += std::log1p(-std::min(bet, kTruncation / (1 - mt)) * (x - mt));
  if (log_capital_ >= std::log(1 / (kAlpha * (1 - kTheta)))) decided_at_ = t + 1;
}

double PairedRace::mean() const {
  if (x_.empty()) return 0;
  return 2 * sum_ / static_cast<double>(x_.size()) - 1;
}

std::pair<double, double> PairedRace::Interval() const {
  if (x_.empty()) return {-1, 1};
  const auto [lo, hi] = BettingInterval(x_, bets_, static_cast<double>(population_));
  return {2 * lo - 1, 2 * hi - 1};
}

}  // namespace tally
