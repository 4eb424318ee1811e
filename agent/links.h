#pragma once

#include <chrono>
#include <cstdint>

#include "absl/status/status.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/trainer.pb.h"

namespace baton::agent {

// The agent's side of one trainer's stream. Thread-safe; events are queued
// and written in order, never dropped while the stream is open.
class TrainerSink {
 public:
  virtual ~TrainerSink() = default;
  virtual void Send(v1::TrainerEvent event) = 0;
  // Ends the stream with `status` after the queued events.
  virtual void Close(absl::Status status) = 0;
};

// The agent's session with the coordinator, as jobs see it. Thread-safe.
class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  // Sends `message` with a fresh seq, which it returns. While the session is
  // down the message is dropped: jobs re-report their state when it is back
  // (OnCoordinatorSession).
  virtual uint64_t Send(v1::AgentMessage message) = 0;
  // From the coordinator's SessionAccepted (defaults until the first one).
  virtual std::chrono::milliseconds liveness_timeout() const = 0;
  virtual std::chrono::milliseconds report_interval() const = 0;
};

}  // namespace baton::agent
