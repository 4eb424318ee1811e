#pragma once

#include "absl/status/status.h"
#include "baton/v1/coordinator.pb.h"

namespace baton {

// The outbound half of one agent session. The gRPC adapter implements it
// with a per-stream queue and one write in flight; tests implement it with a
// recording fake. Methods never block and may be called from any thread.
class AgentChannel {
 public:
  virtual ~AgentChannel() = default;

  // Queues `message`. Dropped once the channel is closed.
  virtual void Send(v1::CoordinatorMessage message) = 0;

  // Ends the session with `status` after the queued messages are written.
  // Later calls do nothing.
  virtual void Close(const absl::Status& status) = 0;
};

}  // namespace baton
