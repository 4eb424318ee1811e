#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>

#include "baton/v1/coordinator.grpc.pb.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"

namespace baton {

// The gRPC edge of the agent sessions: one reactor per AgentSession stream
// that translates stream events into Coordinator calls posted to the control
// loop, and an AgentChannel per stream that queues outbound messages with one
// write in flight.
//
// Thread-safe. `loop` and `coordinator` must outlive the server this service
// is registered with; the coordinator is only ever touched by tasks posted to
// `loop`.
class AgentSessionService final : public v1::Coordinator::CallbackService {
 public:
  AgentSessionService(ControlLoop* loop, Coordinator* coordinator);

  grpc::ServerBidiReactor<v1::AgentMessage, v1::CoordinatorMessage>*
  AgentSession(grpc::CallbackServerContext* context) override;

 private:
  // One stream; defined in the .cc.
  class Reactor;

  // Constant after construction.
  ControlLoop* const loop_;
  Coordinator* const coordinator_;

  // Session ids are unique per process and never reused.
  std::atomic<uint64_t> next_session_id_{1};
};

}  // namespace baton
