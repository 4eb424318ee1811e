#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "baton/v1/coordinator.pb.h"

namespace baton::coordinator {

// A message on its way to agents. Immutable and shared, so a broadcast is one
// object and one serialization however many sessions it goes to: the
// membership of a 5,000-node job is ~200 KB, sent to 5,000 agents.
// Thread-safe.
class Outgoing {
 public:
  explicit Outgoing(v1::CoordinatorMessage message)
      : message_(std::move(message)) {}

  const v1::CoordinatorMessage& message() const { return message_; }

  // The wire bytes, serialized on first use.
  const std::string& Serialized() const {
    absl::call_once(once_, [this] { message_.SerializeToString(&bytes_); });
    return bytes_;
  }

 private:
  const v1::CoordinatorMessage message_;
  mutable absl::once_flag once_;
  mutable std::string bytes_;
};

using OutboundMessage = std::shared_ptr<const Outgoing>;

inline OutboundMessage Outbound(v1::CoordinatorMessage message) {
  return std::make_shared<const Outgoing>(std::move(message));
}

// The outbound half of one agent session. The gRPC adapter implements it
// with a per-stream queue and one write in flight; tests implement it with a
// recording fake. Methods never block and may be called from any thread.
class AgentChannel {
 public:
  virtual ~AgentChannel() = default;

  // Queues `message`. Dropped once the channel is closed.
  virtual void Send(OutboundMessage message) = 0;

  // Ends the session with `status` after the queued messages are written.
  // Later calls do nothing.
  virtual void Close(const absl::Status& status) = 0;
};

}  // namespace baton::coordinator
