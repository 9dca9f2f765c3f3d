// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status code (Debian's Abseil 20220623 has none).
#ifndef TALLY_BASE_STATUS_MACROS_H_
#define TALLY_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TALLY_CONCAT_INNER_(a, b) a##b
#define TALLY_CONCAT_(a, b) TALLY_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::absl::Status _tally_status = (expr);    \
    if (!_tally_status.ok()) return _tally_status; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                           \
  if (!tmp.ok()) return tmp.status();           \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(TALLY_CONCAT_(_tally_statusor_, __LINE__), lhs, rexpr)

#endif  // TALLY_BASE_STATUS_MACROS_H_
