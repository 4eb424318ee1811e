// SimulatedAgent: one simulated agent of the load generator, an
// AgentSession stream driven as a gRPC callback reactor.

#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "tools/bench/load_recorder.h"
#include "tools/bench/ticker.h"

namespace baton::bench {

// One simulated agent: Hello, JoinJob, then heartbeats and step reports
// until Leave. Owned by main; it must outlive OnDone (the recorder's
// AwaitEnded).
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
  // it.
  SimulatedAgent(int32_t index, int32_t nodes, std::string job,
                 LoadRecorder* recorder, Ticker* ticker);

  // Opens the stream (ending at `deadline`) and sends Hello. Called once,
  // from the main thread.
  void Start(v1::Coordinator::Stub* stub, absl::Time deadline);
  void Join();
  // Sends LeaveJob{finished} and then ends the stream's writes.
  void Leave();
  void Cancel() { context_.TryCancel(); }
  // Sends a heartbeat, or a step report once the agent has a rank.
  void OnTimer(TimerKind kind);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  v1::CoordinatorMessage* NewInbound();
  void Handle(const v1::CoordinatorMessage& message);
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
  LoadRecorder* const recorder_;
  Ticker* const ticker_;
  grpc::ClientContext context_;

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
  // From the latest membership; rank_ is -1 while not sealed.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t rank_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t completed_step_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton::bench
