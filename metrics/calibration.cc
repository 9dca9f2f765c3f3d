#include "metrics/calibration.h"

#include <algorithm>
#include <vector>

namespace tally {

void CountCalibration(const float* probs, const int16_t* ref, const int16_t* pred, int64_t n, int k, int64_t hw,
                      int64_t* rows, int64_t* fine, int64_t fine_images) {
  const int64_t row_size = CalibrationRowSize(k);
  for (int64_t i = 0; i < n; ++i) {
    const bool in_fine = fine_images < 0 || i < fine_images;
    const float* p = probs + i * k * hw;
    const int16_t* r = ref + i * hw;
    const int16_t* l = pred + i * hw;
    int64_t* row = rows + i * row_size;
    for (int64_t x = 0; x < hw; ++x) {
      const int gt = r[x];
      if (gt < 0 || gt >= k) continue;
      const auto add = [&](int h, float v, bool correct) {
        int64_t* cell = row + CalibrationCell(h, CalibrationBin(v));
        cell[0] += 1;
        cell[1] += correct;
        cell[2] += static_cast<int64_t>(ConfidenceUnits(v));
        if (!in_fine) return;
        int64_t* f = fine + (static_cast<int64_t>(h) * kCalibrationFineBins + CalibrationFineBin(v)) * 2;
        f[0] += 1;
        f[1] += correct;
      };
      for (int c = 0; c < k; ++c) add(c, p[c * hw + x], gt == c);
      const int label = std::clamp<int>(l[x], 0, k - 1);
      add(k, p[label * hw + x], label == gt);
    }
  }
}

void CountTwoClassCalibration(const float* one, const uint16_t* ref, const uint16_t* pred, int64_t hw, int64_t* row,
                              int64_t* fine) {
  std::vector<float> probs(2 * static_cast<size_t>(hw));
  std::vector<int16_t> r(static_cast<size_t>(hw)), p(static_cast<size_t>(hw));
  for (int64_t x = 0; x < hw; ++x) {
    probs[hw + x] = one[x];
    probs[x] = 1.0f - one[x];
    r[x] = static_cast<int16_t>(ref[x]);  // kIgnoredPixel (0xFFFF) is -1: left out.
    p[x] = static_cast<int16_t>(pred[x]);
  }
  CountCalibration(probs.data(), r.data(), p.data(), 1, 2, hw, row, fine);
}

bool CalibrationTotals::AddRow(const int64_t* values, int64_t size, int k) {
  if (k <= 0 || size != CalibrationRowSize(k) || (k_ != 0 && k != k_)) return false;
  if (k_ == 0) {
    k_ = k;
    coarse_.assign(static_cast<size_t>(size), 0);
    fine_.assign(static_cast<size_t>(CalibrationFineSize(k)), 0);
  }
  for (int64_t i = 0; i < size; ++i) coarse_[i] += static_cast<uint64_t>(values[i]);
  return true;
}

bool CalibrationTotals::AddFine(int h, int bin, int64_t pixels, int64_t correct) {
  if (k_ == 0 || h < 0 || h > k_ || bin < 0 || bin >= kCalibrationFineBins || pixels < 0 || correct < 0) return false;
  const size_t at = (static_cast<size_t>(h) * kCalibrationFineBins + bin) * 2;
  fine_[at] += static_cast<uint64_t>(pixels);
  fine_[at + 1] += static_cast<uint64_t>(correct);
  return true;
}

void CalibrationTotals::Merge(const CalibrationTotals& other) {
  if (other.k_ == 0) return;
  if (k_ == 0) {
    *this = other;
    return;
  }
  if (other.k_ != k_) return;
  for (size_t i = 0; i < coarse_.size(); ++i) coarse_[i] += other.coarse_[i];
  for (size_t i = 0; i < fine_.size(); ++i) fine_[i] += other.fine_[i];
}

namespace {

double Ratio(unsigned __int128 a, unsigned __int128 b) { return static_cast<double>(a) / static_cast<double>(b); }

// A bin's |correct - sum of v|, in 2^-32 units, exactly.
unsigned __int128 GapUnits(unsigned __int128 correct, unsigned __int128 units) {
  const unsigned __int128 correct_units = correct << 32;
  return correct_units > units ? correct_units - units : units - correct_units;
}

// ECE and the reliability bins of histogram h: sum_b |correct_b - vsum_b| / N, with the difference
// taken exactly in 2^-32 units before it becomes a double.
CalibrationFigures EqualWidth(const CalibrationTotals& t, int h) {
  CalibrationFigures f;
  unsigned __int128 n = 0, gap = 0;
  for (int b = 0; b < kCalibrationBins; ++b) {
    ReliabilityBin bin;
    bin.lo = static_cast<double>(b) / kCalibrationBins;
    bin.hi = static_cast<double>(b + 1) / kCalibrationBins;
    const unsigned __int128 pixels = t.pixels(h, b);
    bin.pixels = static_cast<int64_t>(pixels);
    if (pixels > 0) {
      bin.accuracy = Ratio(t.correct(h, b), pixels);
      bin.confidence = Ratio(t.units(h, b), pixels) / kConfidenceUnit;
      gap += GapUnits(t.correct(h, b), t.units(h, b));
    }
    n += pixels;
    f.bins.push_back(bin);
  }
  f.pixels = static_cast<int64_t>(n);
  if (n > 0) f.ece = Ratio(gap, n) / kConfidenceUnit;
  return f;
}

// Equal-mass bins over the fine histogram of h (see the header): the mean over non-empty bins of
// |accuracy - mean v|, v a fine bin's centre.
double EqualMass(const CalibrationTotals& t, int h) {
  const uint64_t* fine = t.fine().data() + static_cast<size_t>(h) * kCalibrationFineBins * 2;
  unsigned __int128 n = 0;
  for (int b = 0; b < kCalibrationFineBins; ++b) n += fine[2 * b];
  if (n == 0) return NAN;
  double sum = 0;
  int bins = 0;
  unsigned __int128 cum = 0, pixels = 0, correct = 0, centres = 0;  // centres: sum of (2f + 1), in 2^-17.
  int r = 0;
  for (int b = 0; b < kCalibrationFineBins; ++b) {
    const uint64_t c = fine[2 * b];
    if (c == 0) continue;
    cum += c;
    pixels += c;
    correct += fine[2 * b + 1];
    centres += static_cast<unsigned __int128>(c) * (2 * static_cast<uint64_t>(b) + 1);
    if (cum * kCalibrationBins >= n * static_cast<unsigned>(r + 1) || b == kCalibrationFineBins - 1) {
      const double accuracy = Ratio(correct, pixels);
      const double confidence = Ratio(centres, pixels) / (2.0 * kCalibrationFineBins);
      sum += std::fabs(accuracy - confidence);
      ++bins;
      pixels = correct = centres = 0;
      while (r < kCalibrationBins && cum * kCalibrationBins >= n * static_cast<unsigned>(r + 1)) ++r;
    }
  }
  if (pixels > 0) {  // Not reached: the last non-empty fine bin closes its bin.
    sum += std::fabs(Ratio(correct, pixels) - Ratio(centres, pixels) / (2.0 * kCalibrationFineBins));
    ++bins;
  }
  return sum / bins;
}

}  // namespace

CalibrationSummary SummarizeCalibration(const CalibrationTotals& totals, bool with_fine) {
  CalibrationSummary s;
  const int k = totals.classes();
  if (k == 0) return s;
  s.fine = with_fine;
  s.top = EqualWidth(totals, k);
  if (with_fine) s.top.ace = EqualMass(totals, k);
  double ece = 0, ace = 0;
  int with_pixels = 0;
  for (int c = 0; c < k; ++c) {
    CalibrationFigures f = EqualWidth(totals, c);
    if (with_fine) f.ace = EqualMass(totals, c);
    if (f.pixels > 0) {
      ece += f.ece;
      ace += f.ace;
      ++with_pixels;
    }
    s.classes.push_back(std::move(f));
  }
  if (with_pixels > 0) {
    s.classwise_ece = ece / with_pixels;
    if (with_fine) s.classwise_ace = ace / with_pixels;
  }
  return s;
}

double RowEce(const int64_t* values, int k) {
  int64_t n = 0;
  unsigned __int128 gap = 0;
  for (int b = 0; b < kCalibrationBins; ++b) {
    const int64_t* cell = values + CalibrationCell(k, b);
    n += cell[0];
    gap += GapUnits(static_cast<uint64_t>(cell[1]), static_cast<uint64_t>(cell[2]));
  }
  return n > 0 ? Ratio(gap, static_cast<unsigned __int128>(n)) / kConfidenceUnit : NAN;
}

double RowConfidence(const int64_t* values, int k) {
  int64_t n = 0;
  unsigned __int128 units = 0;
  for (int b = 0; b < kCalibrationBins; ++b) {
    n += values[CalibrationCell(k, b)];
    units += static_cast<uint64_t>(values[CalibrationCell(k, b) + 2]);
  }
  return n > 0 ? Ratio(units, static_cast<unsigned __int128>(n)) / kConfidenceUnit : NAN;
}

}  // namespace tally
