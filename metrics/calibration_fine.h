// A batch's fine calibration histogram (metrics/calibration.h) as it travels with its rows: the
// sparse CalibrationFine message, to and from the dense [K + 1][65536][2] counts.
#ifndef TALLY_METRICS_CALIBRATION_FINE_H_
#define TALLY_METRICS_CALIBRATION_FINE_H_

#include <cstdint>
#include <vector>

#include "proto/tally.pb.h"

namespace tally {

// `out`'s classes and cells from dense counts of `k` classes (its covers are the caller's).
void SetSparseFine(const int64_t* fine, int k, v1::CalibrationFine* out);
// Adds `f`'s cells to dense counts (sized CalibrationFineSize(f.classes()) when empty); cells past
// the end are left out (tallyd refuses such histograms before they are counted).
void AddSparseFine(const v1::CalibrationFine& f, std::vector<int64_t>* dense);

}  // namespace tally

#endif  // TALLY_METRICS_CALIBRATION_FINE_H_
