// Small helpers for absl::Status flow (our abseil, 20220623, has no macros).
#ifndef GPUCOMPUTE_SERVER_COMMON_STATUS_MACROS_H_
#define GPUCOMPUTE_SERVER_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GC_STATUS_CONCAT_INNER_(a, b) a##b
#define GC_STATUS_CONCAT_(a, b) GC_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status gc_status_ = (expr);          \
    if (!gc_status_.ok()) return gc_status_;     \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on
// error returns its status, otherwise assigns the value to `lhs` (which may be
// a declaration such as `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  GC_ASSIGN_OR_RETURN_IMPL_(GC_STATUS_CONCAT_(gc_statusor_, __LINE__), lhs, expr)
#define GC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // GPUCOMPUTE_SERVER_COMMON_STATUS_MACROS_H_
