// A race of a new checkpoint against the best one so far (tally follow --race): the new checkpoint's
// rows are scored in a seeded random order, each paired with the best checkpoint's value on the
// same row, and the race stops as soon as the new one is decided worse: the 95 % confidence
// sequence of the mean paired difference lies entirely below -margin.
//
// The difference d = new - best of a row's Dice lies in [-1, 1]; x = (d + 1) / 2 in [0, 1] goes into
// the betting construction of metrics/bounded_mean.h, with bets for a sequence of unknown length
// (SequenceBet) and, since the rows are drawn without replacement from the N rows both checkpoints
// share, the finite-population hypothesis m_t = (N m - sum_{i<t} x_i) / (N - t + 1). "Worse" is K-'s
// rejection of m* = (1 - margin) / 2, i.e. of every mean difference >= -margin (K- rises with m):
// (1 - theta) K-(m*) reaching 1 / alpha at any row. Under a true mean difference >= -margin, K-(m*)
// is a nonnegative supermartingale, so by Ville's inequality the race decides "worse" with
// probability at most alpha (1 - theta) = 2.5 % <= 5 %, whenever it stops: the guarantee holds for
// the decision taken after every row, not only at a planned end (checked by simulation in
// tests/metrics/paired_race_test.cc). Interval() is the same construction's two-sided interval, so a
// decided race's interval lies below -margin.
#ifndef TALLY_METRICS_PAIRED_RACE_H_
#define TALLY_METRICS_PAIRED_RACE_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace tally {

class PairedRace {
 public:
  // `rows`: the rows both checkpoints share (N; 0: treat them as independent draws). `margin` >= 0.
  PairedRace(int64_t rows, double margin);

  // The next row's difference (new - best), in [-1, 1] (clamped), in the race's order. NaN pairs
  // (a row where either checkpoint has no value) are left out by the caller.
  void Add(double difference);

  // Decided worse: at some row so far, and from then on.
  bool decided_worse() const { return decided_at_ > 0; }
  // The rows added when it was decided (0: not decided).
  int64_t decided_at() const { return decided_at_; }
  int64_t rows_added() const { return static_cast<int64_t>(x_.size()); }
  // The mean difference of the rows added.
  double mean() const;
  // The 95 % confidence sequence of the mean difference (of the N rows' when N was given), in
  // [-1, 1], after the rows added.
  std::pair<double, double> Interval() const;

 private:
  int64_t population_;
  double margin_;
  double target_;  // m* = (1 - margin) / 2.
  std::vector<double> x_, bets_;
  double sum_ = 0, squares_ = 0.25;  // For the next bet: sums of x and of (x - mu)^2.
  double log_capital_ = 0;           // log K-(m*).
  int64_t decided_at_ = 0;
};

}  // namespace tally

#endif  // TALLY_METRICS_PAIRED_RACE_H_
