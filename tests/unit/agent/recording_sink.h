#pragma once

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/links.h"

namespace baton::agent {

// A trainer's stream as the agent's tests see it: what was sent and how it
// was closed. Thread-safe (data-plane threads tell trainers too).
class RecordingSink : public TrainerSink {
 public:
  void Send(v1::TrainerEvent event) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  void Close(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    closes_.push_back(std::move(status));
  }
  std::vector<v1::TrainerEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  // The events since the last call.
  std::vector<v1::TrainerEvent> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(events_, {});
  }
  std::vector<absl::Status> closes() const {
    absl::MutexLock lock(&mu_);
    return closes_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::TrainerEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> closes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::agent
