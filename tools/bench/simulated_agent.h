// SimulatedAgent: one simulated agent of the load generator, an
// AgentSession stream driven as a gRPC callback reactor.

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
#include "tools/bench/load_recorder.h"
#include "tools/bench/membership_store.h"
#include "tools/bench/ticker.h"

namespace baton::bench {

// One simulated agent: Hello, JoinJob, then heartbeats and step reports
// until Leave. After a coordinator restart (Reconnect) it opens a new
// stream and, as a real agent does (agent/job_membership.cc), re-reports
// the generation it runs in a RejoinJob: the membership it received, its
// completed step. Owned by main; it must outlive OnDone (the recorder's
// AwaitEnded).
//
// The reactor serves one stream at a time: Reconnect binds it to the next
// stream only after the previous one's OnDone.
//
// Thread-safety: Join, Leave, Cancel and OnTimer may be called from any
// thread. gRPC operations are started outside mu_ (a reaction may run at
// once on another thread and take mu_); the decision to start one is made
// under mu_, so there is at most one write in flight, WritesDone follows the
// last write, and the hold that keeps the stream alive for writes from
// outside reactions is removed exactly once, after the last operation was
// started.
class SimulatedAgent final
    : public grpc::ClientBidiReactor<v1::AgentMessage, v1::CoordinatorMessage> {
 public:
  // Agent `index` of `nodes`, named "sim-<index>", joining `job`; reports
  // to `recorder` and schedules its timers on `ticker`, which must outlive
  // it. With `memberships` (which must outlive it too) it keeps the
  // membership it receives, to rejoin after a coordinator restart.
  SimulatedAgent(int32_t index, int32_t nodes, std::string job,
                 LoadRecorder* recorder, Ticker* ticker,
                 MembershipStore* memberships = nullptr);

  // Opens the stream (ending at `deadline`) and sends Hello. Called once,
  // from the main thread.
  void Start(v1::Coordinator::Stub* stub, absl::Time deadline);
  // After the stream ended (OnDone ran): opens a new one that waits for the
  // channel to connect, says Hello again (the same agent instance) and, once
  // accepted, rejoins with the kept membership. From the main thread.
  void Reconnect(v1::Coordinator::Stub* stub, absl::Time deadline);
  void Join();
  // Sends LeaveJob{finished} and then ends the stream's writes.
  void Leave();
  // From the main thread.
  void Cancel() { context_->TryCancel(); }
  // Sends a heartbeat, or a step report once the agent has a rank.
  void OnTimer(TimerKind kind);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  v1::CoordinatorMessage* NewInbound();
  // Binds the reactor to a new AgentSession stream on `context_` and sends
  // Hello; the stream starts.
  void OpenStream(v1::Coordinator::Stub* stub);
  void Handle(const v1::CoordinatorMessage& message);
  void HandleSessionAccepted(const v1::SessionAccepted& accepted);
  void HandleMembership(const v1::Membership& membership);
  void Send(v1::AgentMessage message);
  // Starts the next write, or WritesDone once the LeaveJob is written, or
  // gives up the hold once no more writes can happen. Releases `lock`.
  void Advance(absl::ReleasableMutexLock& lock)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const int32_t index_;
  const int32_t nodes_;
  const std::string job_;  // the job it joins
  const std::string node_name_;
  // Kept across reconnects, as a real agent keeps its own.
  const std::string instance_;
  LoadRecorder* const recorder_;
  Ticker* const ticker_;
  MembershipStore* const memberships_;
  // The current stream's; replaced (main thread) only between streams.
  std::unique_ptr<grpc::ClientContext> context_;

  // Only touched by StartRead and OnReadDone, which never overlap.
  google::protobuf::Arena arena_;
  v1::CoordinatorMessage* inbound_;

  absl::Mutex mu_;
  std::deque<v1::AgentMessage> outbound_ ABSL_GUARDED_BY(mu_);
  // Untouched between its StartWrite and OnWriteDone.
  v1::AgentMessage in_flight_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  // The stream failed or the coordinator ended it: nothing more to write.
  bool stream_over_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
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
