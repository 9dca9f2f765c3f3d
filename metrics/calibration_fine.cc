#include "metrics/calibration_fine.h"

#include "metrics/calibration.h"

namespace tally {

void SetSparseFine(const int64_t* fine, int k, v1::CalibrationFine* out) {
  out->set_classes(k);
  for (int64_t cell = 0; cell < CalibrationFineSize(k) / 2; ++cell) {
    if (fine[2 * cell] == 0) continue;
    out->add_cells(static_cast<int32_t>(cell));
    out->add_pixels(fine[2 * cell]);
    out->add_correct(fine[2 * cell + 1]);
  }
}

void AddSparseFine(const v1::CalibrationFine& f, std::vector<int64_t>* dense) {
  if (dense->empty()) dense->assign(static_cast<size_t>(CalibrationFineSize(f.classes())), 0);
  for (int i = 0; i < f.cells_size() && i < f.pixels_size() && i < f.correct_size(); ++i) {
    const size_t at = 2 * static_cast<size_t>(f.cells(i));
    if (f.cells(i) < 0 || at + 1 >= dense->size()) continue;
    (*dense)[at] += f.pixels(i);
    (*dense)[at + 1] += f.correct(i);
  }
}

}  // namespace tally
