// Ticker: one thread firing every simulated agent's periodic timers
// (heartbeats and step reports) at a fixed rate.

#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace baton::bench {

enum class TimerKind : uint8_t { kHeartbeat, kReport };

// One thread firing every agent's periodic timers at a fixed rate (due times
// do not drift when a firing is late). Thread-safe.
class Ticker {
 public:
  using FireFn = std::function<void(int32_t agent, TimerKind kind)>;

  explicit Ticker(FireFn fire)
      : fire_(std::move(fire)), thread_([this] { Run(); }) {}
  ~Ticker() {
    Stop();
    thread_.join();
  }

  void Add(int32_t agent, TimerKind kind, absl::Time first,
           absl::Duration interval) {
    absl::MutexLock lock(&mu_);
    heap_.push({first, interval, agent, kind});
    ++version_;
  }

  // Ends the firing; a batch the thread already took is still fired.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  // The latest any timer fired after its due time.
  absl::Duration max_lag() const {
    absl::MutexLock lock(&mu_);
    return max_lag_;
  }

 private:
  struct Entry {
    absl::Time due;
    absl::Duration interval;
    int32_t agent;
    TimerKind kind;
    bool operator>(const Entry& other) const { return due > other.due; }
  };

  void Run() {
    std::vector<Entry> due;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        for (Entry& entry : due) {
          entry.due += entry.interval;
          heap_.push(entry);
        }
        due.clear();
        absl::Time now;
        for (;;) {
          if (stopped_) return;
          now = absl::Now();
          if (!heap_.empty() && heap_.top().due <= now) break;
          const uint64_t seen = version_;
          const auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stopped_ || version_ != seen;
          };
          mu_.AwaitWithDeadline(
              absl::Condition(&changed),
              heap_.empty() ? absl::InfiniteFuture() : heap_.top().due);
        }
        while (!heap_.empty() && heap_.top().due <= now) {
          max_lag_ = std::max(max_lag_, now - heap_.top().due);
          due.push_back(heap_.top());
          heap_.pop();
        }
      }
      for (const Entry& entry : due) fire_(entry.agent, entry.kind);
    }
  }

  const FireFn fire_;
  mutable absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_
      ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration max_lag_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace baton::bench
