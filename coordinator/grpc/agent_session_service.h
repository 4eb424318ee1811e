#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>

#include "baton/v1/coordinator.grpc.pb.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"

namespace baton::coordinator {

// The gRPC edge of the agent sessions: one reactor per AgentSession stream
// that translates stream events into Coordinator calls posted to the control
// loop, and an AgentChannel per stream that queues outbound messages with one
// write in flight.
//
// Thread-safe. `loop` and `coordinator` must outlive the server this service
// is registered with; the coordinator is only ever touched by tasks posted to
// `loop`.
//
// The method is served raw (byte buffers) so that a message broadcast to many
// agents is serialized once and its bytes shared by every stream (see
// Outgoing); inbound messages are parsed here, and a malformed one ends the
// stream with INVALID_ARGUMENT. The service stays registered under its name,
// so reflection and clients see baton.v1.Coordinator as usual.
class AgentSessionService final
    : public v1::Coordinator::WithRawCallbackMethod_AgentSession<
          v1::Coordinator::Service> {
 public:
  AgentSessionService(ControlLoop* loop, Coordinator* coordinator);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AgentSession(
      grpc::CallbackServerContext* context) override;

 private:
  // One stream; defined in the .cc.
  class Reactor;

  // Constant after construction.
  ControlLoop* const loop_;
  Coordinator* const coordinator_;

  // Session ids are unique per process and never reused.
  std::atomic<uint64_t> next_session_id_{1};
};

}  // namespace baton::coordinator
