// Calibration over every pixel (docs/metrics.md "Calibration"): how well a model's probabilities
// match how often it is right.
//
// Definitions. A pixel's probabilities are the softmax of its logits (a single logit: the sigmoid p
// for class 1 and 1 - p for class 0), in float32 (on the GPU the softmax is the calibration kernel's
// own: metrics/gpu/calibration_kernel.h); pixels whose reference
// is ignored or outside [0, K) are left out. Each of K + 1 "histograms" h bins a value v of every
// pixel with a flag `correct`: h < K is class h (v = p_h, correct = reference is h: classwise), h =
// K the top label (v = the probability of the predicted class, the logits' argmax; correct =
// prediction equals reference). For 15 equal-width bins, bin b holds the v in [b/15, (b+1)/15)
// (v = 1 in bin 14); NaN counts as 0.
//   ECE_h = sum_b |correct_b - sum(v)_b| / N_h      (Guo et al. 2017; N_h: the pixels of h)
// The top label's is "ECE", the mean over classes of the classwise ones "classwise ECE" (Kull et al.
// 2019). Confidence sums are kept in units of 2^-32 (each v truncated: below 2.4e-10 of ECE).
// The adaptive (equal-mass) calibration error (Nixon et al. 2019) bins the pixels of h, sorted by
// v, into 15 bins of equal count: ACE_h = mean over bins of |accuracy - mean v|. It is computed from
// a histogram of 2^16 bins of width 1/65536 (counts and correct counts): an equal-mass bin takes
// whole fine bins while its share of pixels is not reached, and a pixel's v is its fine bin's
// centre: exact to 1/65536 in probability (CalibrationSummary's `ace`).
#ifndef TALLY_METRICS_CALIBRATION_H_
#define TALLY_METRICS_CALIBRATION_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "metrics/host_device.h"

namespace tally {

inline constexpr int kCalibrationBins = 15;
inline constexpr int kCalibrationFineBins = 65536;
// A row's per-histogram values: per bin (pixels, correct pixels, sum of v in 2^-32 units).
inline constexpr int kCalibrationValues = 3;
inline constexpr double kConfidenceUnit = 4294967296.0;  // 2^32.
// The most rows one fine histogram may cover (a model batch's; tallyd refuses more).
inline constexpr int kMaxCalibrationCovers = 65536;

// Per row: [K + 1][kCalibrationBins][kCalibrationValues] values (int64).
TALLY_HD int64_t CalibrationRowSize(int k) { return int64_t{k + 1} * kCalibrationBins * kCalibrationValues; }
// Where histogram h's bin b starts among a row's values: (pixels, correct, v-sum) from there.
TALLY_HD int64_t CalibrationCell(int h, int b) { return (int64_t{h} * kCalibrationBins + b) * kCalibrationValues; }
// Per batch: [K + 1][kCalibrationFineBins][2] (pixels, correct pixels).
TALLY_HD int64_t CalibrationFineSize(int k) { return int64_t{k + 1} * kCalibrationFineBins * 2; }

TALLY_HD float CalibrationValue(float v) { return v == v ? v : 0.f; }  // NaN as 0.
TALLY_HD int CalibrationBin(float v) {
  const double x = static_cast<double>(CalibrationValue(v)) * kCalibrationBins;
  const int b = x <= 0 ? 0 : static_cast<int>(x);
  return b >= kCalibrationBins ? kCalibrationBins - 1 : b;
}
TALLY_HD int CalibrationFineBin(float v) {
  const double x = static_cast<double>(CalibrationValue(v)) * kCalibrationFineBins;
  const int b = x <= 0 ? 0 : static_cast<int>(x);
  return b >= kCalibrationFineBins ? kCalibrationFineBins - 1 : b;
}
TALLY_HD uint64_t ConfidenceUnits(float v) {
  const double x = static_cast<double>(CalibrationValue(v)) * kConfidenceUnit;
  return x <= 0 ? 0 : (x >= kConfidenceUnit ? static_cast<uint64_t>(kConfidenceUnit) : static_cast<uint64_t>(x));
}

// Class 1's probability of a stored 16-bit score v (the prediction store's and a 16-bit PNG
// probability map's precision): v / 65535 in float32.
inline float ScoreProbability(uint16_t v) { return static_cast<float>(v) / 65535.0f; }

// The CPU's count: probabilities [n, K, hw] float32 (contiguous), reference [n, hw] int16 (< 0:
// ignored), predicted labels [n, hw] int16. Adds to `rows` ([n] x CalibrationRowSize(K), zeroed by
// the caller) and `fine` (CalibrationFineSize(K)).
// Only the first `fine_images` images (-1: all) count in `fine`.
void CountCalibration(const float* probs, const int16_t* ref, const int16_t* pred, int64_t n, int k, int64_t hw,
                      int64_t* rows, int64_t* fine, int64_t fine_images = -1);

// Two classes from class 1's probability `one` of each of `hw` pixels (class 0's: 1 - it, in
// float32, as a single logit's): CountCalibration of one image whose reference and predicted labels
// are uint16 maps (kIgnoredPixel: ignored). Sets `row` (CalibrationRowSize(2), zeroed by the caller)
// and adds to `fine` (CalibrationFineSize(2)).
void CountTwoClassCalibration(const float* one, const uint16_t* ref, const uint16_t* pred, int64_t hw, int64_t* row,
                              int64_t* fine);

// Exact totals over rows: per histogram and coarse bin, 128-bit sums.
class CalibrationTotals {
 public:
  // A row's CalibrationRowSize(k) values; false (nothing added) when the size does not match the
  // class count this holds (the first row sets it).
  bool AddRow(const int64_t* values, int64_t size, int k);
  // A batch's fine histogram: sparse (histogram, bin, pixels, correct) entries.
  bool AddFine(int h, int bin, int64_t pixels, int64_t correct);
  int classes() const { return k_; }
  bool empty() const { return k_ == 0; }
  // Pixels, correct pixels and v-sum (2^-32 units) of histogram h's coarse bin b.
  unsigned __int128 pixels(int h, int b) const { return coarse_[Cell(h, b) + 0]; }
  unsigned __int128 correct(int h, int b) const { return coarse_[Cell(h, b) + 1]; }
  unsigned __int128 units(int h, int b) const { return coarse_[Cell(h, b) + 2]; }
  const std::vector<uint64_t>& fine() const { return fine_; }  // [K + 1][65536][2].
  void Merge(const CalibrationTotals& other);

 private:
  size_t Cell(int h, int b) const { return static_cast<size_t>(CalibrationCell(h, b)); }
  int k_ = 0;
  std::vector<unsigned __int128> coarse_;
  std::vector<uint64_t> fine_;
};

struct ReliabilityBin {
  double lo = 0, hi = 0;
  int64_t pixels = 0;
  double accuracy = NAN;    // correct / pixels.
  double confidence = NAN;  // mean v.
};

struct CalibrationFigures {
  int64_t pixels = 0;
  double ece = NAN;  // 15 equal-width bins.
  double ace = NAN;  // 15 equal-mass bins, from the fine histogram (NaN without one).
  std::vector<ReliabilityBin> bins;
};

struct CalibrationSummary {
  CalibrationFigures top;                   // The top label: ECE, ACE, the reliability diagram.
  std::vector<CalibrationFigures> classes;  // Classwise, by class.
  double classwise_ece = NAN;               // Mean over classes with pixels.
  double classwise_ace = NAN;
  bool fine = false;                        // The fine histogram was there (ACE computed).
};

CalibrationSummary SummarizeCalibration(const CalibrationTotals& totals, bool with_fine);

// One row's top-label ECE and mean confidence from its CalibrationRowSize(k) values (NaN: no pixels).
double RowEce(const int64_t* values, int k);
double RowConfidence(const int64_t* values, int k);

}  // namespace tally

#endif  // TALLY_METRICS_CALIBRATION_H_
