#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/gpu_support.h"
#include "agent/job_environment.h"
#include "agent/job_membership.h"
#include "agent/job_operations.h"
#include "agent/job_trainers.h"
#include "agent/links.h"
#include "agent/step_reporter.h"
#include "agent/tensor_enqueue.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/trainer.pb.h"
#include "common/clock.h"
#include "common/shm.h"
#include "common/shm_channel.h"

namespace baton::agent {

// One job on this node: its attached trainers, declared tensors, the
// coordinator's membership and plan, the operations the trainers enqueue,
// and the data plane of the current generation.
//
// Every public method posts to the job's own thread, which owns all state,
// so none of them blocks on the network. Life of a job: trainers attach ->
// all local ranks present: join -> membership: connect the data plane,
// answer `attached` -> declarations, plan, enqueues, completions -> a lost
// node: abort the generation, fail its operations, wait for the next
// membership -> every trainer detached: leave.
//
// AgentJob owns the job thread (its task queue, the doorbell it sleeps on,
// the timers) and wires the parts that hold the state together, in
// dependency order: JobTrainers (attach, declarations, the trainers'
// channels), JobMembership (the coordinator's side and each generation's
// data plane), JobOperations (enqueues to completions) and StepReporter.
class AgentJob {
 public:
  using Environment = JobEnvironment;

  AgentJob(std::string name, Environment env);
  // Fails what is left (CANCELLED) and joins the threads.
  ~AgentJob();

  AgentJob(const AgentJob&) = delete;
  AgentJob& operator=(const AgentJob&) = delete;

  const std::string& name() const { return name_; }
  // True once the job ended on this node (it only waits to be destroyed).
  bool ended() const { return ended_.load(); }
  // True once local rank `local_rank` detached as finished: its next attach
  // under the name is for the name's next run. Thread-safe.
  bool finished(int32_t local_rank) const ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer requests. `sink` identifies the trainer's stream.
  void Attach(std::shared_ptr<TrainerSink> sink, uint64_t seq,
              v1::AttachRequest request);
  void Declare(TrainerSink* sink, uint64_t seq, v1::DeclareRequest request);
  void Enqueue(TrainerSink* sink, uint64_t seq, v1::EnqueueRequest request);
  void Detach(TrainerSink* sink, uint64_t seq, v1::DetachRequest request);
  // A trainer reached a commit while nodes wait to join `generation`.
  void AdmitJoins(int64_t generation);
  // The trainer's stream closed without a detach.
  void TrainerGone(TrainerSink* sink);

  // Coordinator messages about this job.
  void OnCoordinatorMessage(v1::CoordinatorMessage message);
  // A coordinator session (re)opened; `restarted`: a new coordinator
  // process, which must be told the job's state.
  void OnCoordinatorSession(bool restarted);

 private:
  // How the membership reaches the job and its operations.
  JobMembership::Callbacks MembershipCallbacks();

  // The job thread.
  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  void OnTimer(absl::Time now);

  void HandleAttach(const std::shared_ptr<TrainerSink>& sink,
                    const v1::AttachRequest& request);
  void HandleDeclare(TrainerSink* sink, uint64_t seq,
                     const v1::DeclareRequest& request);
  void HandleEnqueue(TrainerSink* sink, const TensorEnqueue& enqueue);
  void HandleDetach(TrainerSink* sink, const v1::DetachRequest& request);
  void HandleTrainerGone(TrainerSink* sink);
  // Ends the job on this node: fails every operation, closes every stream.
  void End(const absl::Status& status);
  void LeaveAndEnd(const absl::Status& status, bool finished);
  // "trainer local rank r (pid p) of job "j" on node n", for messages.
  std::string TrainerText(int32_t rank) const;
  // Local rank `rank` is gone for good (`reason`): the node leaves the job.
  void LeaveForTrainer(int32_t rank, const std::string& reason);
  // Samples the gauges of env_.metrics: data plane and trainers.
  void SampleMetrics();

  // Constant after construction.
  const std::string name_;
  const Environment env_;  // env_.clock is never null
  const AgentConfig& config_;
  Clock& clock_;
  // "/baton.<agent pid>.<instance>.<job>.": names of this job's shared memory.
  const std::string shm_prefix_;

  // The job's doorbell: trainers ring it after pushing into their request
  // rings, Post after queueing a task; the job thread sleeps on it.
  // doorbell_memory_ is empty when it could not be created: then
  // doorbell_ is local_doorbell_.
  SharedMemory doorbell_memory_;
  Doorbell local_doorbell_;
  Doorbell* const doorbell_;

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Local ranks that detached as finished.
  absl::flat_hash_set<int32_t> finished_ranks_ ABSL_GUARDED_BY(mu_);

  // Owned by the job thread (JobOperations::OpDone excepted, see there).
  JobTrainers trainers_;
  JobMembership membership_;
  JobOperations operations_;
  StepReporter reporter_;
  absl::Time next_report_;
  // While a lost local trainer's place waits for a trainer to attach again:
  // when the job gives up on this node.
  std::optional<absl::Time> restart_deadline_;
  bool done_reported_ = false;
  std::atomic<bool> ended_{false};

  std::thread thread_;
};

}  // namespace baton::agent
