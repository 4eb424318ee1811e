#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/channel_mapping.h"
#include "agent/job_environment.h"
#include "agent/job_generation.h"
#include "agent/job_trainers.h"
#include "agent/links.h"
#include "agent/op_completion.h"
#include "agent/scheduler/operation.h"
#include "agent/tensor_enqueue.h"
#include "baton/v1/trainer.pb.h"
#include "common/clock.h"
#include "common/shm_channel.h"

namespace baton::agent {

// The operations of one job on this node. Each local rank's enqueue is
// validated and matched with the other local ranks' enqueues of the same
// step into one `PendingOp`, whose end is its OpCompletion: finished exactly
// once, by whichever comes first (the data plane's success, on the thread
// that ran it; or, on the job thread, a failure the job explained, a
// generation abort, a lost node, a stop), which tells the trainers. Once
// every local rank enqueued, the operation is submitted to the current
// generation's data plane (JobGeneration::data_plane). The job thread then
// concludes it (Conclude: metrics, each rank's progress) and forgets it once
// the data plane let go of its buffers (the lease: the tensor's next
// operation waits for that).
//
// A data plane's failure is explained before the trainers hear of it: with
// the generation's abort when the coordinator named a lost node, or held
// while the generation holds failures (JobGeneration::holds_failures) until
// ReleaseHeld.
//
// Job thread only, except OpDone (any data-plane thread).
class JobOperations {
 public:
  // One local rank's enqueue of a tensor, waiting for the other local ranks.
  struct Enqueued {
    bool present = false;
    TensorEnqueue enqueue;
  };
  struct PendingOp {
    uint64_t id = 0;
    int32_t index = 0;
    int64_t step = 0;
    int64_t generation = 0;
    absl::Time first_enqueued;
    std::vector<Enqueued> ranks;
    // Its end; whom to tell, the lease on the buffers. Never null.
    std::shared_ptr<OpCompletion> completion;
    // Built once every local rank enqueued.
    // Completed with the plan's fields when submitted; not changed after.
    std::shared_ptr<Operation> op;
    // Submitted to a data plane.
    bool submitted = false;
    // The data plane failed it and the explanation is awaited (ReleaseHeld).
    std::optional<absl::Status> held;
    // Conclude ran.
    bool concluded = false;
  };
  // Per tensor id since the last report: operations, total and max
  // latency, and the highest step completed.
  struct Latency {
    int64_t count = 0;
    int64_t total_us = 0;
    int64_t max_us = 0;
    int64_t last_step = -1;
  };

  // `env`, `trainers` and `generation` outlive it. `post` runs a task on
  // the job thread, from any thread (AgentJob::Post).
  JobOperations(std::string job, const JobEnvironment& env,
                JobTrainers* trainers, const JobGeneration* generation,
                std::function<void(std::function<void()>)> post);

  JobOperations(const JobOperations&) = delete;
  JobOperations& operator=(const JobOperations&) = delete;

  // The trainers declared new tensors.
  void TensorsDeclared();
  // Local rank `rank`'s enqueue: refused at once (OperationFailed to that
  // rank), or recorded, and the operation built once every local rank
  // enqueued it.
  void Enqueue(int32_t rank, const TensorEnqueue& enqueue);
  // Submits what waits for a data plane, its GPU communicators, the plan
  // or the lease of its tensor, in enqueue order.
  void SubmitWaiting();

  // Scheduler::Callbacks::op_done, on a data-plane thread: the data plane
  // let go of operation `id`. A success finishes it here, so that the
  // trainers hear of it one thread hand-over sooner; the rest is the job
  // thread's (OnOpDone).
  void OpDone(uint64_t id, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(in_flight_mu_);
  // The job thread's side of OpDone: explains a failure (or holds it),
  // concludes the operation and frees its tensor.
  void OnOpDone(uint64_t id, const absl::Status& status);
  // The generation's failure was explained (or its grace period ended):
  // every held failure is reported, with the generation's abort when there
  // was one.
  void ReleaseHeld();
  // The operation of tensor `index`, unless a data plane holds it, fails
  // with `status`.
  void FailUnsubmitted(int32_t index, const absl::Status& status);
  // Fails every unfinished operation of `generation` now, including those
  // still waiting for some local ranks; `only_waiting`: only those no data
  // plane holds. One a data plane holds keeps its tensor leased until the
  // data plane lets go.
  void FailGeneration(int64_t generation, const absl::Status& status,
                      bool only_waiting = false);
  // Fails every unfinished operation now: the job ended, or a local
  // trainer is gone.
  void FailAll(const absl::Status& status);
  // The step the local ranks are at on tensor `index`: that of the
  // operation waiting for more of them, else the one after the last
  // enqueued (a failed step counts as not enqueued).
  int64_t NextStep(int32_t index) const;
  // Local rank `rank` detached or is gone: it is told nothing more.
  void DropDeliveries(int32_t rank);

  // Operations by id, for the step report.
  const absl::flat_hash_map<uint64_t, PendingOp>& ops() const { return ops_; }
  // The latencies since the last call, by tensor id.
  absl::flat_hash_map<uint32_t, Latency> TakeLatencies();

 private:
  // agent::ValidateEnqueue with the tensor's waiting operation and the
  // generation's world size.
  absl::Status ValidateEnqueue(int32_t rank, const TensorEnqueue& e) const;
  void MakeReady(PendingOp& pending);
  void TrySubmit(PendingOp& pending) ABSL_LOCKS_EXCLUDED(in_flight_mu_);
  // If the operation of tensor `index` was finished by its data plane and
  // not concluded yet, concludes it now, so that the next step's enqueue
  // finds the tensor free (the trainer may hear of a success before this
  // thread does).
  void ConcludeFinished(int32_t index);
  // Finishes `pending` with `status` unless it is finished already (by a
  // success), then concludes it.
  void Fail(PendingOp& pending, const absl::Status& status);
  // After its completion finished: its latency or failure in the metrics,
  // each rank's progress, the tensor free for its next operation; once the
  // data plane let go, the record goes. Once per operation.
  void Conclude(PendingOp& pending);
  // `status`, a failure the data plane saw, with the generation's abort if
  // it was aborted (which names the lost node).
  absl::Status Explained(const PendingOp& pending,
                         const absl::Status& status) const;
  // Forgets `pending` if it is concluded and its data plane let go.
  void MaybeForget(PendingOp& pending);
  // Refuses local rank `rank`'s enqueue before it became an operation.
  void FailOp(int32_t rank, const TensorEnqueue& enqueue,
              const absl::Status& status);

  // Constant after construction.
  const std::string job_;
  const JobEnvironment& env_;
  const AgentConfig& config_;
  Clock& clock_;
  JobTrainers& trainers_;
  const JobGeneration& generation_;
  const std::function<void(std::function<void()>)> post_;

  // Owned by the job thread.
  // Operations by id, and each tensor's operation that takes enqueues (at
  // most one at a time; 0: none).
  absl::flat_hash_map<uint64_t, PendingOp> ops_;
  std::vector<uint64_t> op_of_tensor_;
  // Each tensor's last submitted operation's completion: the next waits
  // until it is released (OpCompletion::released).
  std::vector<std::shared_ptr<const OpCompletion>> submitted_of_tensor_;
  absl::flat_hash_map<uint32_t, Latency> latencies_;

  // The completions the data planes hold, for OpDone on their threads.
  absl::Mutex in_flight_mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<OpCompletion>> in_flight_
      ABSL_GUARDED_BY(in_flight_mu_);
};

}  // namespace baton::agent
