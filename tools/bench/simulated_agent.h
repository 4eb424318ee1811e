// SimulatedAgent: one simulated agent of the load generator, an
// AgentSession stream driven on gRPC's async API over a completion queue of
// a CompletionQueuePool.

#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "common/completion_queue_pool.h"
#include "tools/bench/load_recorder.h"
#include "tools/bench/membership_store.h"
#include "tools/bench/ticker.h"

namespace baton::bench {

// One simulated agent: Hello, JoinJob, then heartbeats and step reports
// until Leave. As a real agent (agent/coordinator_client.cc), it sends a
// heartbeat only when it sent nothing else for the coordinator's heartbeat
// interval, so a sealed agent reporting every second sends none; a
// `probe` heartbeats at every interval regardless, to time the round trip.
// After a coordinator restart (Reconnect) it opens a new stream and, as a real
// agent does (agent/job_membership.cc), re-reports the generation it runs in a
// RejoinJob: the membership it received, its completed step. Owned by main; it
// must outlive the end of its stream (the recorder's StreamEnded, awaited by
// AwaitEnded).
//
// Why the async API and not a callback reactor: the callback API puts every
// stream of the process on one completion queue, whose outstanding-tag
// search in Debian's libgrpc (built without NDEBUG) is linear in the number
// of streams (common/completion_queue_pool.h). The agents are spread over
// the queues of a CompletionQueuePool instead.
//
// The stream's operations and their rules (gRPC's): StartCall and then the
// writes share one slot, so at most one of them is in flight (StartCall,
// Write, WritesDone); one Read is in flight from StartCall until a Read
// fails (the coordinator ended the stream, or the call failed); Finish is
// started once, after that failed Read, when no write is in flight and none
// can start any more. The stream has ended (StreamEnded reported) when
// Finish and every other operation completed. Every completion of one agent
// runs on its queue's one thread.
//
// Thread-safety: Join, Leave, Cancel and OnTimer may be called from any
// thread. Operations are started outside mu_ (a completion may run at once
// on the queue's thread and take mu_); the decision to start one is made
// under mu_.
class SimulatedAgent final {
 public:
  // Agent `index` of `nodes`, named "sim-<index>", joining `job`; its
  // streams' operations complete on `queue` (a CompletionQueuePool's, whose
  // thread calls the tags). Reports to `recorder` and schedules its timers
  // on `ticker`; all three must outlive it. With `memberships` (which must
  // outlive it too) it keeps the membership it receives, to rejoin after a
  // coordinator restart.
  SimulatedAgent(int32_t index, int32_t nodes, std::string job,
                 grpc::CompletionQueue* queue, LoadRecorder* recorder,
                 Ticker* ticker, bool probe,
                 MembershipStore* memberships = nullptr);

  SimulatedAgent(const SimulatedAgent&) = delete;
  SimulatedAgent& operator=(const SimulatedAgent&) = delete;

  // Opens the stream (ending at `deadline`) and sends Hello. Called once,
  // from the main thread.
  void Start(v1::Coordinator::Stub* stub, absl::Time deadline);
  // After the stream ended (StreamEnded reported): opens a new one that
  // waits for the channel to connect, says Hello again (the same agent
  // instance) and, once accepted, rejoins with the kept membership. From
  // the main thread.
  void Reconnect(v1::Coordinator::Stub* stub, absl::Time deadline);
  void Join();
  // Sends LeaveJob{finished} and then ends the stream's writes.
  void Leave();
  // From the main thread.
  void Cancel() { context_->TryCancel(); }
  // Sends a heartbeat (a probe's always, another's only when nothing was
  // sent for the heartbeat interval), or a step report once the agent has a
  // rank.
  void OnTimer(TimerKind kind);

 private:
  // What Advance decided to start: a write carries its message.
  struct NextOperation {
    enum class Kind { kNone, kWrite, kWritesDone, kFinish };
    Kind kind = Kind::kNone;
    v1::AgentMessage message;
  };

  // Completions, on the queue's thread. StartCall's completes as a write.
  void OnReadDone(bool ok);
  void OnWriteDone(bool ok);
  void OnFinishDone(bool ok);

  v1::CoordinatorMessage* NewInbound();
  // Starts a new AgentSession stream on `context_`: StartCall, the first
  // Read, and Hello queued behind StartCall.
  void OpenStream(v1::Coordinator::Stub* stub, bool reconnect);
  void Handle(const v1::CoordinatorMessage& message);
  void HandleSessionAccepted(const v1::SessionAccepted& accepted);
  void HandleMembership(const v1::Membership& membership);
  void Send(v1::AgentMessage message);
  // Decides the next operation and books it as started: the next write,
  // or WritesDone once the LeaveJob is written, or Finish once the stream
  // is over, its Read has failed and no write is in flight.
  NextOperation Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts what Advance decided, outside mu_: its completion may run at
  // once on the queue's thread and take mu_.
  void StartOperation(NextOperation next) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const int32_t index_;
  const int32_t nodes_;
  const std::string job_;  // the job it joins
  const std::string node_name_;
  // Kept across reconnects, as a real agent keeps its own.
  const std::string instance_;
  grpc::CompletionQueue* const queue_;
  LoadRecorder* const recorder_;
  Ticker* const ticker_;
  MembershipStore* const memberships_;
  const bool probe_;
  MethodTag<SimulatedAgent> read_tag_;
  MethodTag<SimulatedAgent> write_tag_;
  MethodTag<SimulatedAgent> finish_tag_;

  // The current stream's; replaced (main thread) only between streams. The
  // stream lives in the context's call: declared after it, destroyed first.
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<
      grpc::ClientAsyncReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>>
      stream_;
  // Written by Finish, read when it completed.
  grpc::Status status_;

  // Only touched by the Read in flight and its completion, which starts
  // the next.
  google::protobuf::Arena arena_;
  v1::CoordinatorMessage* inbound_;

  absl::Mutex mu_;
  std::deque<v1::AgentMessage> outbound_ ABSL_GUARDED_BY(mu_);
  // StartCall, a Write or WritesDone is in flight.
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  // Operations started and not completed yet (StartCall, the Read, writes,
  // Finish).
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  // The coordinator's, from SessionAccepted; when a message was last queued.
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
  absl::Time last_sent_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  // A Read failed: the coordinator ended the stream or the call failed.
  bool read_over_ ABSL_GUARDED_BY(mu_) = false;
  // That, or a write failed: nothing more to write.
  bool stream_over_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  // From the latest membership; rank_ is -1 while not sealed, and from a
  // coordinator restart until the rejoin is accepted (sealed_rank_ keeps
  // it).
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t rank_ ABSL_GUARDED_BY(mu_) = -1;
  int32_t sealed_rank_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t completed_step_ ABSL_GUARDED_BY(mu_) = 0;
  // With memberships_: the membership received, the latest plan.
  std::shared_ptr<const v1::Membership> membership_ ABSL_GUARDED_BY(mu_);
  v1::TensorPlan plan_ ABSL_GUARDED_BY(mu_);
  bool timers_started_ ABSL_GUARDED_BY(mu_) = false;
  // The current stream is a reconnect; a RejoinJob awaits its answer.
  bool reconnected_ ABSL_GUARDED_BY(mu_) = false;
  bool rejoin_pending_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::bench
