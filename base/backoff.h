// Exponential backoff with jitter, for retrying calls to the coordinator. Delays start at
// `initial` seconds, double on each failure up to `max`, and each is drawn uniformly from
// [delay/2, delay] so that many workers that lost the coordinator at once do not retry in step.
// Thread-compatible.
#ifndef TALLY_BASE_BACKOFF_H_
#define TALLY_BASE_BACKOFF_H_

#include <algorithm>
#include <random>

namespace tally {

class Backoff {
 public:
  Backoff(double initial, double max) : initial_(initial), max_(max), delay_(initial), rng_(std::random_device{}()) {}
  // The next delay in seconds.
  double Next() {
    const double d = std::uniform_real_distribution<double>(delay_ / 2, delay_)(rng_);
    delay_ = std::min(delay_ * 2, max_);
    return d;
  }
  void Reset() { delay_ = initial_; }
  void set_max(double max) { max_ = std::max(initial_, max); }

 private:
  double initial_;
  double max_;
  double delay_;
  std::mt19937 rng_;
};

}  // namespace tally

#endif  // TALLY_BASE_BACKOFF_H_
