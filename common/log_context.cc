#include "common/log_context.h"

#include "absl/strings/str_cat.h"

namespace baton {

std::string LogPrefix(const LogContext& context) {
  std::string prefix;
  if (!context.job.empty()) absl::StrAppend(&prefix, "job=", context.job, " ");
  if (context.generation > 0) {
    absl::StrAppend(&prefix, "gen=", context.generation, " ");
  }
  if (!context.node.empty()) {
    absl::StrAppend(&prefix, "node=", context.node, " ");
  }
  if (context.rank >= 0) absl::StrAppend(&prefix, "rank=", context.rank, " ");
  return prefix;
}

}  // namespace baton
