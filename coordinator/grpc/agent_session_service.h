#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "common/clock.h"
#include "common/completion_queue_pool.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"

namespace baton::coordinator {

// The gRPC edge of the agent sessions: one Call per AgentSession stream that
// translates stream events into Coordinator calls posted to the control
// loop, with an AgentChannel per stream that queues outbound messages with
// one write in flight.
//
// The streams run on gRPC's async API, spread over `queues` completion
// queues each drained by a thread of its own (CompletionQueuePool says why:
// with one stream per agent, the callback API's single queue made every
// completion cost O(agents) in Debian's libgrpc). A stream stays on the
// queue its call arrived on, so its completions run on one thread, in order.
//
// The method is served raw (byte buffers) so that a message broadcast to many
// agents is serialized once and its bytes shared by every stream (see
// Outgoing); inbound messages are parsed here, and a malformed one ends the
// stream with INVALID_ARGUMENT. The service stays registered under its name,
// so reflection and clients see baton.v1.Coordinator as usual.
//
// Use: register it, AddQueues to the builder, build the server, Start; at
// the end the server's Shutdown, then Shutdown here. `loop` and
// `coordinator` must outlive Shutdown; the coordinator is only ever touched
// by tasks posted to `loop`. Thread-safe.
class AgentSessionService final
    : public v1::Coordinator::WithRawMethod_AgentSession<
          v1::Coordinator::Service> {
 public:
  // `clock` stamps each message's arrival (Coordinator::MessageHandled);
  // it must outlive Shutdown.
  AgentSessionService(ControlLoop* loop, Coordinator* coordinator, Clock* clock,
                      size_t queues);
  // Shuts down the queues if Shutdown was not called.
  ~AgentSessionService() override;

  // Before the server is built.
  void AddQueues(grpc::ServerBuilder& builder);
  // Once the server started: awaits the first stream on every queue.
  void Start();
  // After the server's Shutdown returned (which ended every stream): waits
  // until each stream's last completion was handled. Idempotent.
  void Shutdown();

 private:
  // One stream; defined in the .cc.
  class Call;

  // Streams requested ahead on each queue.
  static constexpr int kRequestsPerQueue = 16;

  // Requests the next stream on `queue`, unless Shutdown began.
  void AwaitNextCall(grpc::ServerCompletionQueue* queue)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  ControlLoop* const loop_;
  Coordinator* const coordinator_;
  Clock* const clock_;
  const size_t queue_count_;

  // Set by AddQueues, before the server starts.
  std::unique_ptr<CompletionQueuePool> queues_;

  // Session ids are unique per process and never reused.
  std::atomic<uint64_t> next_session_id_{1};

  absl::Mutex mu_;
  // Between Start and Shutdown.
  bool accepting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::coordinator
