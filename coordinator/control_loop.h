#pragma once

#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace baton::coordinator {

// The one thread that owns all coordinator state. gRPC reactors Post() tasks;
// the loop runs them in order, and calls a tick function periodically so
// managers can check their deadlines. Tests do not start the thread: they
// call RunUntilIdle() and Tick() by hand on a FakeClock, which keeps them
// deterministic.
class ControlLoop {
 public:
  using Task = std::function<void()>;

  ControlLoop() = default;
  ControlLoop(const ControlLoop&) = delete;
  ControlLoop& operator=(const ControlLoop&) = delete;

  // Thread-safe. Tasks posted after Stop() are dropped.
  void Post(Task task) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs queued tasks (including ones they post) until none is left; returns
  // how many ran. For tests and for draining at shutdown.
  size_t RunUntilIdle() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs tasks as they arrive and `tick` every `tick_interval` (by `clock`)
  // until Stop(). Before each tick it runs the tasks already queued, so the
  // tick sees every message that arrived before it. Call from the loop's own
  // thread.
  void Run(Clock* clock, absl::Duration tick_interval,
           const std::function<void()>& tick) ABSL_LOCKS_EXCLUDED(mu_);

  // Thread-safe. Makes Run() return after the task it is running.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Tasks waiting to run (for load reporting).
  size_t Pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::coordinator
