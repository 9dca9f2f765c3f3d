// The wall clock, in one place.
#ifndef TALLY_BASE_CLOCK_H_
#define TALLY_BASE_CLOCK_H_

namespace tally {

// Unix time in seconds (wall clock).
double NowUnix();

}  // namespace tally

#endif  // TALLY_BASE_CLOCK_H_
