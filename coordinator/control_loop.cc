#include "coordinator/control_loop.h"

#include <utility>

namespace baton::coordinator {

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
    size_t backlog = 0;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || !tasks_.empty();
      };
      // Wake for the next task or the next tick, whichever comes first.
      mu_.AwaitWithDeadline(absl::Condition(&ready), next_tick);
      if (stopped_) return;
      if (clock->Now() >= next_tick) {
        backlog = tasks_.size();
      } else if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    if (task) {
      task();
      continue;
    }
    if (backlog == 0 && clock->Now() < next_tick) continue;  // Woke early.
    // The tick judges deadlines (liveness above all) on what has arrived:
    // first run every task that was queued when the tick came due, so a
    // busy loop does not mistake its own backlog for silent agents.
    for (size_t i = 0; i < backlog; ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (stopped_ || tasks_.empty()) break;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
    tick();
    next_tick = clock->Now() + tick_interval;
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

}  // namespace baton::coordinator
