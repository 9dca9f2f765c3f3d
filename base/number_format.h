// Numbers in report files: the shortest text that reads back to the same double.
#ifndef TALLY_BASE_NUMBER_FORMAT_H_
#define TALLY_BASE_NUMBER_FORMAT_H_

#include <string>

namespace tally {

// Round-trip formatting of a double ("%.17g" shortened to the shortest exact form), with
// nan / inf / -inf for non-finite values (per_image.csv; JSON maps those itself).
std::string FormatDouble(double v);

}  // namespace tally

#endif  // TALLY_BASE_NUMBER_FORMAT_H_
