// LoadRecorder: everything the simulated agents observe (progress towards
// the seal, heartbeat round trips, counters, the first error texts), for the
// load generator's summary.

#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.pb.h"

namespace baton::bench {

// Error and stream texts kept for the summary; the rest are only counted.
inline constexpr size_t kKeptTexts = 5;

inline int64_t NowUnixMicros() { return absl::GetCurrentTimeNanos() / 1000; }

// Everything the agents observe, for the summary. Thread-safe.
class LoadRecorder {
 public:
  struct Progress {
    int count = 0;
    absl::Time first = absl::InfiniteFuture();
    absl::Time last = absl::InfinitePast();
  };
  struct Counters {
    int64_t errors = 0;
    int64_t stream_failures = 0;
    int64_t clean_closes = 0;
    int64_t heartbeats = 0;
    int64_t reports = 0;
    int64_t window_heartbeats = 0;
    int64_t aborted_generations = 0;
    int64_t plans = 0;
    int64_t job_ended = 0;
    int64_t shutdowns = 0;
    // Streams that ended while the coordinator restarted (expected).
    int64_t restart_ends = 0;
  };
  void SessionAccepted() { Bump(&accepted_, absl::Now()); }
  void JoinAccepted() { Bump(&joins_accepted_, absl::Now()); }
  void MembershipReceived() { Bump(&memberships_, absl::Now()); }
  // After a coordinator restart: a session accepted again, a RejoinJob
  // accepted.
  void SessionReaccepted() { Bump(&reaccepted_, absl::Now()); }
  void Rejoined() { Bump(&rejoined_, absl::Now()); }

  // The coordinator is about to be killed: streams that end from now on are
  // counted as restart_ends, not failures.
  void ExpectRestart() {
    absl::MutexLock lock(&mu_);
    expect_restart_ = true;
  }
  // Every old stream ended: count the new streams' ends from 0, as
  // failures again.
  void RestartOver() {
    absl::MutexLock lock(&mu_);
    expect_restart_ = false;
    ended_ = 0;
  }
  void Count(int64_t LoadRecorder::Counters::*counter) {
    absl::MutexLock lock(&mu_);
    ++(counters_.*counter);
  }

  void ErrorReceived(const std::string& node, const v1::Error& error) {
    absl::MutexLock lock(&mu_);
    ++counters_.errors;
    if (error_texts_.size() < kKeptTexts) {
      error_texts_.push_back(absl::StrFormat(
          "%s: %s (job %s gen %d): %s", node,
          absl::StatusCodeToString(static_cast<absl::StatusCode>(error.code())),
          error.job(), error.generation(), error.message()));
    }
  }

  // `leaving`: the agent had sent its LeaveJob, so an OK end is expected.
  void StreamEnded(const std::string& node, const grpc::Status& status,
                   bool leaving) {
    absl::MutexLock lock(&mu_);
    ++ended_;
    if (status.ok() && leaving) {
      ++counters_.clean_closes;
      return;
    }
    if (expect_restart_) {
      ++counters_.restart_ends;
      return;
    }
    ++counters_.stream_failures;
    if (stream_texts_.size() < kKeptTexts) {
      stream_texts_.push_back(absl::StrFormat(
          "%s: stream ended %s: %s", node,
          absl::StatusCodeToString(
              static_cast<absl::StatusCode>(status.error_code())),
          status.ok() ? "before the agent left" : status.error_message()));
    }
  }

  // Round trips count only for heartbeats stamped inside the window, which
  // opens now and lasts `length`. Returns when it ends.
  absl::Time OpenWindow(absl::Duration length) {
    absl::MutexLock lock(&mu_);
    window_begin_us_ = NowUnixMicros();
    window_end_us_ = window_begin_us_ + absl::ToInt64Microseconds(length);
    return absl::FromUnixMicros(window_end_us_);
  }
  // The send time for a heartbeat, taken under the same lock as the window
  // so that every heartbeat counted here is also one whose answer counts.
  int64_t StampHeartbeat() {
    absl::MutexLock lock(&mu_);
    const int64_t now_us = NowUnixMicros();
    ++counters_.heartbeats;
    if (now_us >= window_begin_us_ && now_us <= window_end_us_) {
      ++counters_.window_heartbeats;
    }
    return now_us;
  }
  void HeartbeatAcked(int64_t sent_us, int64_t now_us) {
    absl::MutexLock lock(&mu_);
    if (sent_us >= window_begin_us_ && sent_us <= window_end_us_) {
      round_trips_us_.push_back(now_us - sent_us);
    }
  }

  // Waits until `count` sessions were accepted / joins accepted /
  // memberships received / streams ended; false at `deadline`.
  bool AwaitAccepted(int count, absl::Time deadline) {
    return Await(&accepted_, count, deadline);
  }
  bool AwaitMemberships(int count, absl::Time deadline) {
    return Await(&memberships_, count, deadline);
  }
  bool AwaitJoinsAccepted(int count, absl::Time deadline) {
    return Await(&joins_accepted_, count, deadline);
  }
  bool AwaitRejoined(int count, absl::Time deadline) {
    return Await(&rejoined_, count, deadline);
  }
  bool AwaitEnded(int count, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ >= count;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&reached), deadline);
  }

  struct Snapshot {
    Progress accepted, joins_accepted, memberships, reaccepted, rejoined;
    Counters counters;
    std::vector<int64_t> round_trips_us;
    std::vector<std::string> error_texts, stream_texts;
  };
  Snapshot Take() const {
    absl::MutexLock lock(&mu_);
    return {accepted_, joins_accepted_, memberships_, reaccepted_,  rejoined_,
            counters_, round_trips_us_, error_texts_, stream_texts_};
  }

 private:
  void Bump(Progress* progress, absl::Time now) {
    absl::MutexLock lock(&mu_);
    ++progress->count;
    progress->first = std::min(progress->first, now);
    progress->last = std::max(progress->last, now);
  }
  bool Await(const Progress* progress, int count, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return progress->count >= count;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&reached), deadline);
  }

  mutable absl::Mutex mu_;
  Progress accepted_ ABSL_GUARDED_BY(mu_);
  Progress joins_accepted_ ABSL_GUARDED_BY(mu_);
  Progress memberships_ ABSL_GUARDED_BY(mu_);
  Progress reaccepted_ ABSL_GUARDED_BY(mu_);
  Progress rejoined_ ABSL_GUARDED_BY(mu_);
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  bool expect_restart_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  int64_t window_begin_us_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  int64_t window_end_us_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  std::vector<int64_t> round_trips_us_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> error_texts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> stream_texts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::bench
