#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "baton/v1/coordinator.pb.h"

namespace baton::agent {

// The partition phases of a job's recent collectives on this node, for
// batonctl timeline: a bounded buffer that drops the oldest records.
//
// Thread-safe: the data plane's threads add, the job answers queries.
class TimelineRecorder {
 public:
  explicit TimelineRecorder(size_t capacity) : capacity_(capacity) {}

  void Add(v1::PartitionTrace trace) ABSL_LOCKS_EXCLUDED(mu_);

  // The records of steps first_step..last_step, oldest first;
  // `*truncated` is set when records of those steps were dropped.
  std::vector<v1::PartitionTrace> Query(int64_t first_step, int64_t last_step,
                                        bool* truncated) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<v1::PartitionTrace> records_ ABSL_GUARDED_BY(mu_);
  // The highest step of a dropped record; -1 while nothing was dropped.
  int64_t dropped_through_step_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace baton::agent
