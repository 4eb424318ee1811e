#include "coordinator/control_loop.h"

#include <utility>

namespace baton {

void ControlLoop::Post(Task task) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  tasks_.push_back(std::move(task));
}

size_t ControlLoop::RunUntilIdle() {
  size_t ran = 0;
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      if (tasks_.empty()) return ran;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
    ++ran;
  }
}

void ControlLoop::Run(Clock* clock, absl::Duration tick_interval,
                      const std::function<void()>& tick) {
  absl::Time next_tick = clock->Now() + tick_interval;
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || !tasks_.empty();
      };
      // Wake for the next task or the next tick, whichever comes first.
      mu_.AwaitWithDeadline(absl::Condition(&ready), next_tick);
      if (stopped_) return;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    if (task) task();
    if (clock->Now() >= next_tick) {
      tick();
      next_tick = clock->Now() + tick_interval;
    }
  }
}

void ControlLoop::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

size_t ControlLoop::Pending() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size();
}

}  // namespace baton
