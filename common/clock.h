#pragma once

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton {

// Every reading of time in baton goes through a Clock so tests can run on a
// FakeClock instead of sleeping. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock.
  static Clock* Real();
};

// When an operation given `timeout` at construction must end, on `clock`.
// Clock is the wall clock: a step of the system clock moves the end. Left()
// never exceeds the timeout, so a wait for the time left stays bounded all
// the same. `clock` must outlive the deadline.
class Deadline {
 public:
  Deadline(Clock& clock, absl::Duration timeout)
      : clock_(&clock), timeout_(timeout), at_(clock.Now() + timeout) {}

  absl::Time at() const { return at_; }
  // The time left: at most the timeout, negative once the deadline passed.
  absl::Duration Left() const {
    return std::min(at_ - clock_->Now(), timeout_);
  }

 private:
  Clock* const clock_;
  const absl::Duration timeout_;
  const absl::Time at_;
};

// A clock that moves only when a test advances it.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000))
      : now_(start) {}

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton
