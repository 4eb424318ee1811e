#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "agent/scheduler/data_plane.h"
#include "baton/v1/coordinator.pb.h"

namespace baton::agent {

// What a job's operations (JobOperations) see of its generations: the
// sealed one, its data plane, and why generations ended. JobMembership
// publishes it; the operations' tests use a fake. Job thread only.
class JobGeneration {
 public:
  enum class State {
    kAttaching,  // waiting for every local rank
    kJoining,    // joined, waiting for the generation to be sealed
    kRunning,    // sealed generation
    kReforming,  // generation aborted, waiting for the next
    kDone,
  };

  virtual ~JobGeneration() = default;

  virtual State state() const = 0;
  // This node's view of the sealed generation (common/membership_view.h);
  // none before the first.
  virtual const std::optional<v1::Membership>& membership() const = 0;
  // The sealed generation; 0 before the first.
  int64_t generation() const {
    return membership() ? membership()->generation() : 0;
  }
  // The plan's partition size (0 before the plan).
  virtual int64_t partition_bytes() const = 0;
  // The current generation's data plane; null when none is connected.
  virtual DataPlane* data_plane() const = 0;
  // Why `generation` was aborted (it names the lost node); null if it was
  // not.
  virtual const absl::Status* aborted(int64_t generation) const = 0;
  // Set when the data plane stopped for good in this generation (a node
  // left, or the nodes disagree on the mode): enqueues fail with it at once.
  virtual const std::optional<absl::Status>& data_plane_stopped() const = 0;
  // Why this generation's GPU communicators could not be connected; null
  // when they were not tried or did not fail.
  virtual const absl::Status* devices_failed() const = 0;
  // Set while the data plane's own failure waits for an explanation (the
  // coordinator names a lost node, or the grace period ends): the failures
  // of its operations are held until then (JobOperations::ReleaseHeld).
  virtual bool holds_failures() const = 0;
};

}  // namespace baton::agent
