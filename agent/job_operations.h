#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/channel_mapping.h"
#include "agent/job_environment.h"
#include "agent/job_membership.h"
#include "agent/job_trainers.h"
#include "agent/links.h"
#include "agent/scheduler/operation.h"
#include "agent/scheduler/scheduler.h"
#include "agent/tensor_enqueue.h"
#include "baton/v1/trainer.pb.h"
#include "common/clock.h"
#include "common/shm_channel.h"

namespace baton::agent {

// The operations of one job on this node. Each local rank's enqueue is
// validated and matched with the other local ranks' enqueues of the same
// step into one `Operation`, which is submitted to the current generation's
// data plane (JobMembership). Every submitted operation ends through one
// path: OpDone, on the data-plane thread that finished it, tells the
// trainers of a success at once; the job thread then retires it (OnOpDone,
// or RetireFinished when the trainer's next enqueue comes first) and tells
// them of a failure (FinishOp; FailNow when a data plane still holds the
// buffers, which then stay leased until it lets go).
//
// Job thread only, except OpDone, which takes only the state guarded by
// deliveries_mu_ and the trainers' completion rings.
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
    // Built once every local rank enqueued.
    // Completed with the plan's fields when submitted; not changed after.
    std::shared_ptr<Operation> op;
    // Submitted to this data plane (nullptr: waiting for one).
    Scheduler* data_plane = nullptr;
    // The trainers were told it failed while a data plane still held it: the
    // record stays, as a lease on the tensor's buffers, until op_done.
    bool notified = false;
  };
  // Per tensor id since the last report: operations, total and max
  // latency, and the highest step completed.
  struct Latency {
    int64_t count = 0;
    int64_t total_us = 0;
    int64_t max_us = 0;
    int64_t last_step = -1;
  };

  // `env`, `trainers` and `membership` outlive it. `post` runs a task on the
  // job thread, from any thread (AgentJob::Post).
  JobOperations(std::string job, const JobEnvironment& env,
                JobTrainers* trainers, JobMembership* membership,
                std::function<void(std::function<void()>)> post);

  JobOperations(const JobOperations&) = delete;
  JobOperations& operator=(const JobOperations&) = delete;

  // The trainers declared new tensors.
  void TensorsDeclared();
  // Local rank `rank`'s enqueue: refused at once (OperationFailed to that
  // rank), or recorded, and the operation built once every local rank
  // enqueued it.
  void Enqueue(int32_t rank, const TensorEnqueue& enqueue)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Submits what waits for a data plane, its GPU communicators or the plan,
  // in enqueue order.
  void SubmitWaiting() ABSL_LOCKS_EXCLUDED(deliveries_mu_);

  // Scheduler::Callbacks::op_done, on a data-plane thread: the one path by
  // which a submitted operation ends. A success frees the tensor for its
  // next step (finished_) and tells the trainers at once, one thread
  // hand-over sooner than through the job thread; the job thread then
  // retires the record (OnOpDone). A failure goes to the job thread, which
  // knows why (a lost node, a held failure) and tells them (FinishOp).
  void OpDone(uint64_t id, absl::Status status)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // The job thread's side of OpDone; also reports a held failure.
  void OnOpDone(uint64_t id, absl::Status status)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Operation `id`, if it is still there, fails with `status` as it is.
  void Finish(uint64_t id, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // The operation of tensor `index`, unless a data plane holds it, fails
  // with `status`.
  void FailUnsubmitted(int32_t index, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Fails every operation of `generation` now (FailNow), including those
  // still waiting for some local ranks; `only_waiting`: only those no data
  // plane holds.
  void FailGeneration(int64_t generation, const absl::Status& status,
                      bool only_waiting = false)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Fails every operation now (FailNow): the job ended, or a local trainer
  // is gone.
  void FailAll(const absl::Status& status) ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // The step the local ranks are at on tensor `index`: that of the
  // operation waiting for more of them, else the one after the last
  // enqueued (a failed step counts as not enqueued).
  int64_t NextStep(int32_t index) const;
  // Local rank `rank` detached or is gone: it is told nothing more.
  void DropDeliveries(int32_t rank) ABSL_LOCKS_EXCLUDED(deliveries_mu_);

  // Operations by id, for the step report.
  const absl::flat_hash_map<uint64_t, PendingOp>& ops() const { return ops_; }
  // The latencies since the last call, by tensor id.
  absl::flat_hash_map<uint32_t, Latency> TakeLatencies();

 private:
  // Whom to tell of a submitted operation's outcome. Taken once: by OpDone
  // on a success, by the job thread on a failure (FailNow, Notify).
  struct Delivery {
    struct Target {
      int32_t rank = 0;
      std::shared_ptr<TrainerSink> sink;
      // Enqueued over the trainer's channel: completed there (the stream
      // when its ring is full).
      std::shared_ptr<ChannelMapping> mapping;
    };
    std::vector<Target> targets;
    ChannelEntry entry = {};
    // The tensor's name, for a completion over the stream (built only
    // then). Points into the job's LocalTensor, which outlives the record.
    const std::string* tensor = nullptr;
  };

  // agent::ValidateEnqueue with the tensor's waiting operation and the
  // generation's world size.
  absl::Status ValidateEnqueue(int32_t rank, const TensorEnqueue& e) const;
  void MakeReady(PendingOp& pending);
  void TrySubmit(PendingOp& pending) ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Records whom to tell of `pending`'s outcome: every local rank that
  // enqueued it, over its channel or its stream.
  void PrepareDelivery(const PendingOp& pending)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Takes `id`'s delivery record; false when it is gone (OpDone told the
  // trainers of a success already, or there was none).
  bool TakeDelivery(uint64_t id) ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // If the operation of tensor `index` ended in OpDone and its OnOpDone has
  // not run yet, retires it now, so that the next step's enqueue finds the
  // tensor free.
  void RetireFinished(int32_t index) ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Tells the trainers the outcome and forgets the operation (a success:
  // OpDone told them; only the bookkeeping is left). `ended`: when it
  // ended, for its latency.
  void FinishOp(PendingOp& pending, const absl::Status& status,
                absl::Time ended) ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  void FinishOp(PendingOp& pending, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Fails it now even if a data plane still holds its buffers (then the
  // tensor stays leased until that data plane lets go).
  void FailNow(PendingOp& pending, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  void Notify(PendingOp& pending, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(deliveries_mu_);
  // Refuses local rank `rank`'s enqueue before it became an operation.
  void FailOp(int32_t rank, const TensorEnqueue& enqueue,
              const absl::Status& status);

  // Constant after construction.
  const std::string job_;
  const JobEnvironment& env_;
  const AgentConfig& config_;
  Clock& clock_;
  JobTrainers& trainers_;
  JobMembership& membership_;
  const std::function<void(std::function<void()>)> post_;

  // Owned by the job thread.
  // Operations by id, and each tensor's operation (at most one at a time).
  absl::flat_hash_map<uint64_t, PendingOp> ops_;
  std::vector<uint64_t> op_of_tensor_;
  // Per tensor: a failed operation still inside an old data plane (0: none);
  // the tensor's next operation waits for it.
  std::vector<uint64_t> lease_of_tensor_;
  absl::flat_hash_map<uint32_t, Latency> latencies_;

  // Shared with the data-plane threads (OpDone).
  absl::Mutex deliveries_mu_;
  absl::flat_hash_map<uint64_t, Delivery> deliveries_
      ABSL_GUARDED_BY(deliveries_mu_);
  // Told of a success by OpDone, OnOpDone not run yet: when they finished.
  absl::flat_hash_map<uint64_t, absl::Time> finished_
      ABSL_GUARDED_BY(deliveries_mu_);
};

}  // namespace baton::agent
