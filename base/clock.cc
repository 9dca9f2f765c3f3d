#include "base/clock.h"

#include <chrono>

namespace tally {

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace tally
