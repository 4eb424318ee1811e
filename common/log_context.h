#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace baton {

// Where a log line belongs: the job, its generation, the node and the global
// rank of a trainer. Every line about a job starts with it, in the
// coordinator's and the agents' logs alike, so that one grep
// (`grep 'job=J '`) follows one job across processes.
struct LogContext {
  std::string job;
  // 0: before the job's first generation was sealed.
  int64_t generation = 0;
  std::string node;
  // -1: no trainer rank applies (or the rank is not known yet).
  int32_t rank = -1;
};

// "job=J gen=G node=N rank=R " (with the trailing space), leaving out what
// does not apply: an empty job or node, a generation below 1, a rank below
// 0. Empty when nothing applies.
std::string LogPrefix(const LogContext& context);

}  // namespace baton
