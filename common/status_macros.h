#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Propagates a non-OK absl::Status to the caller.
#define BATON_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status baton_status_ = (expr);         \
    if (!baton_status_.ok()) return baton_status_; \
  } while (0)

#define BATON_STATUS_CONCAT_INNER_(a, b) a##b
#define BATON_STATUS_CONCAT_(a, b) BATON_STATUS_CONCAT_INNER_(a, b)

// `BATON_ASSIGN_OR_RETURN(auto x, Foo());` assigns the value of an
// absl::StatusOr or returns its status.
#define BATON_ASSIGN_OR_RETURN(lhs, expr) \
  BATON_ASSIGN_OR_RETURN_IMPL_(           \
      BATON_STATUS_CONCAT_(baton_statusor_, __LINE__), lhs, expr)

#define BATON_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
