#pragma once

// The re-forms of one job, for the status API (JobStatus.reforms) and the
// metrics (baton_reform_seconds).

#include <array>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/time/time.h"
#include "baton/v1/status.pb.h"
#include "coordinator/bucket_histogram.h"

namespace baton::coordinator {

// What aborted a running generation.
enum class ReformCause {
  // The node's session ended or went silent, or it was not back after a
  // coordinator restart.
  kLost,
  // The node left the job with work unfinished.
  kLeft,
  // A node joined a job running below expected_nodes.
  kJoined,
};

// "lost", "left", "joined": Reform.cause.
const char* ReformCauseName(ReformCause cause);

// How long the re-forms that ended sealed took: ReformHistogram
// (bucket_histogram.h).

// A job's re-form records: the last kKept, the last of them open while the
// job re-forms. JobManager starts a record when it aborts a running
// generation and closes it at the next seal or when the job ends.
//
// Soft state like the rest of the job: a coordinator restart rebuilds the
// job from its agents' reports with no records, and counting starts again.
//
// Not thread-safe: owned by the job, on the control loop.
class ReformLog {
 public:
  static constexpr int kKept = 32;

  // The running generation `aborted` was aborted for `cause` (`node_name`,
  // `reason` as the job's events word it); the next seal will be
  // `new_generation`. `nodes_before`: the aborted generation's nodes. A
  // record still open (which JobManager never leaves) is closed as
  // superseded.
  void Start(absl::Time now, int64_t aborted, int64_t new_generation,
             ReformCause cause, const std::string& node_name,
             const std::string& reason, int32_t nodes_before);
  // The open re-form ended with a seal of `nodes` nodes; observed in the
  // histogram. No-op without an open record (the job's first seal).
  void Sealed(absl::Time now, int32_t nodes);
  // The job ended while re-forming: `outcome` is "failed: <reason>" or
  // "finished: <reason>"; `nodes` the members it had then. No-op without an
  // open record.
  void Ended(absl::Time now, int32_t nodes, const std::string& outcome);

  bool open() const { return open_; }

  // Appends the records, oldest first, to status->reforms; an open one with
  // its duration so far and `nodes_now` as nodes_after.
  void Fill(absl::Time now, int32_t nodes_now, v1::JobStatus* status) const;

  const ReformHistogram& sealed_seconds() const { return sealed_seconds_; }

 private:
  void Close(absl::Time now, int32_t nodes, const std::string& outcome);

  std::deque<v1::Reform> records_;
  // The last record is in progress; it started at `started_`.
  bool open_ = false;
  absl::Time started_;
  ReformHistogram sealed_seconds_;
};

}  // namespace baton::coordinator
