#include "base/number_format.h"

#include <charconv>
#include <cmath>

namespace tally {

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest of printf's %.15g, %.16g and %.17g that parses back to the same double (to_chars'
  // general format with a precision is specified to print as printf does, and does it without
  // printf's multiple-precision arithmetic).
  char buf[40];
  char* end = buf;
  for (int precision = 15; precision <= 17; ++precision) {
    end = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general, precision).ptr;
    double back = 0;
    std::from_chars(buf, end, back);
    if (back == v) break;
  }
  return std::string(buf, end);
}

}  // namespace tally
