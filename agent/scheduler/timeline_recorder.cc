#include "agent/scheduler/timeline_recorder.h"

#include <algorithm>
#include <utility>

namespace baton::agent {

void TimelineRecorder::Add(v1::PartitionTrace trace) {
  absl::MutexLock lock(&mu_);
  if (capacity_ == 0) return;
  if (records_.size() == capacity_) {
    dropped_through_step_ =
        std::max(dropped_through_step_, records_.front().step());
    records_.pop_front();
  }
  records_.push_back(std::move(trace));
}

std::vector<v1::PartitionTrace> TimelineRecorder::Query(int64_t first_step,
                                                        int64_t last_step,
                                                        bool* truncated) const {
  absl::MutexLock lock(&mu_);
  *truncated = first_step <= dropped_through_step_;
  std::vector<v1::PartitionTrace> out;
  for (const v1::PartitionTrace& trace : records_) {
    if (trace.step() >= first_step && trace.step() <= last_step) {
      out.push_back(trace);
    }
  }
  return out;
}

}  // namespace baton::agent
