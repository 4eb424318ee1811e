#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/scheduler/data_plane.h"
#include "agent/scheduler/executor.h"
#include "agent/scheduler/launch_queue.h"
#include "agent/scheduler/negotiation.h"
#include "agent/scheduler/operation.h"
#include "agent/scheduler/partition_tuner.h"
#include "agent/scheduler/timeline_recorder.h"
#include "agent/transport/negotiation_wire.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// What the executor needs (the generation, its nodes, the timeout, the
// timeline, the clock), and what scheduling adds.
struct SchedulerOptions : ExecutorOptions {
  SchedulingMode mode = SchedulingMode::kPriority;
  // Priority mode: bytes per partition of operations that do not ask for a
  // size (Operation::partition_bytes 0; 0 here: whole tensors), and bytes
  // this node may have in flight (one partition is always admitted). With
  // tuning these are where it starts.
  int64_t partition_bytes = 0;
  int64_t credit_bytes = 16 << 20;
  // Priority mode with more than one node: baton chooses the partition size
  // and the credit from this node's collective timings (PartitionTuner);
  // the nodes agree on them in the negotiation rounds.
  bool tune_partition_bytes = false;
  bool tune_credit_bytes = false;
  // When set, every launch is appended here as one line (tests compare the
  // files of all nodes). Not owned; outlives the scheduler.
  std::FILE* launch_trace = nullptr;
};

// The data plane of one job on this node for one sealed generation. The
// scheduler thread agrees with the other nodes what to launch (the ordering
// contract: negotiation rounds over a NegotiationWire) and applies priority,
// partitioning, fusion and the credit window; its Executor runs the
// launches, one worker per data communicator, on the tensors' shared memory.
//
// Launches of host tensors (one partition, or in priority mode a run of
// small whole tensors fused into one collective: FuseSmallTensors) are
// assigned to the data communicators round-robin by the launch sequence
// number of their first partition, which every node computes identically,
// so each communicator sees the same collectives in the same order on every
// node. Partitions of CUDA tensors all go to the executor's device worker,
// in launch order (NCCL needs one order per group); a tensor is in the same
// kind of memory on every node (the coordinator compares TensorSpec.memory).
//
// Thread-safe. Callbacks run on data-plane threads without its lock held.
class Scheduler : public DataPlane {
 public:
  struct Callbacks {
    // Exactly once per submitted operation, when the data plane no longer
    // touches its buffers: OK, or why it failed. The one path by which an
    // operation ends.
    std::function<void(uint64_t op_id, absl::Status status)> op_done;
    // At most once, when the data plane stops on its own: a communicator
    // failed, nodes disagree on the scheduling mode, or a node left. Runs
    // before the op_done of the operations that stop fails.
    std::function<void(absl::Status status)> stopped;
    // Optional, after every round across nodes: how long this node's
    // NegotiationWire::ExchangeMin took, and whether this node had news of
    // its own (it started the round, or started it with others) rather
    // than joining a round a peer started. Runs on the scheduler thread.
    std::function<void(absl::Duration exchange, bool started)> round_exchanged;
    // Optional, after a host collective that left bytes out (blocks of
    // zeros: Communicator::skipped_bytes): how many. Runs on a data thread.
    std::function<void(int64_t bytes)> bytes_skipped;
  };

  struct Stats {
    // Operations submitted and not finished, and partitions queued.
    int64_t queue_depth = 0;
    int64_t bytes_in_flight = 0;
    // Bytes of partitions completed since the data plane started.
    int64_t bytes_done = 0;
    // Negotiation rounds run (every node of the job runs the same ones).
    int64_t rounds = 0;
    // In force now (the same on every node), and whether baton chose them.
    int64_t partition_bytes = 0;
    int64_t credit_bytes = 0;
    bool partition_tuned = false;
    bool credit_tuned = false;
    // Times the agreed values changed.
    int64_t retunes = 0;
  };

  // `negotiation` carries the rounds; `data` (at least one) the collectives
  // of host tensors, `device` those of CUDA tensors (comm null: none here).
  // Starts the threads.
  Scheduler(SchedulerOptions options,
            std::unique_ptr<NegotiationWire> negotiation,
            std::vector<std::unique_ptr<Communicator>> data,
            Callbacks callbacks, DeviceGroup device = {});
  // Aborts (CANCELLED) and joins the threads; a worker inside a collective
  // is waited for (bounded by op_timeout).
  ~Scheduler() override;

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Gives the data plane its CUDA tensors' communicators once they are
  // connected (the agent connects them only for jobs with CUDA tensors).
  // At most once; Submit fails operations on CUDA tensors before it.
  void AttachDevices(DeviceGroup device);
  bool has_devices() const override;

  // Hands over an operation whose inputs are ready. At most one per tensor
  // at a time: the next step of a tensor is submitted after op_done of the
  // previous one.
  void Submit(std::shared_ptr<const Operation> op) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // The plan now covers tensor ids 0..count-1 on this node.
  void SetKnownTensors(int32_t count) ABSL_LOCKS_EXCLUDED(mu_);

  // This node is leaving the job: announced in the next round, after which
  // every node stops scheduling; launched partitions still complete, the
  // rest fail with FAILED_PRECONDITION.
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops now: operations not launched fail with `status` at once; launched
  // partitions are not started if still queued, and operations with a
  // partition inside a collective fail when that collective returns (an
  // NCCL collective or a TCP ring is aborted, so that is at once).
  void Abort(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // True once every thread has exited.
  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct OpState {
    std::shared_ptr<const Operation> op;
    int32_t launched = 0;
    int32_t returned = 0;
    absl::Status status;
    // For the timeline (unix microseconds).
    int64_t submitted_us = 0;
    int64_t agreed_us = 0;
    // Set when agreed.
    int32_t partitions = 1;
  };
  using Done = std::vector<std::pair<uint64_t, absl::Status>>;

  void SchedulerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs one round; false when the scheduler must exit.
  bool Round(std::vector<int64_t>& vec, int32_t& body) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until this node has news or a peer starts a round; false when
  // the scheduler must exit.
  bool AwaitNews(int32_t body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops scheduling because the negotiation failed with `status`.
  void NegotiationFailed(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // Something the next round must see happened here: starts a round now,
  // on this node and (through the negotiation) on every other.
  void WakeSchedulerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `launch` (one partition, or fused small tensors) to the executor.
  void LaunchLocked(Launch launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LaunchTrace(const PartitionTask& task, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Executor::Returned: accounts a returned launch.
  void OnReturned(Launch launch, absl::Status status, bool dropped)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops scheduling with `status`. `drain`: the executor still runs the
  // queued partitions (every node launched them); otherwise queued ones are
  // dropped.
  void StopLocked(absl::Status status, bool drain, Done& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reports `state` when its last launched partition returned.
  void MaybeFinishLocked(uint64_t op_id, Done& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells op_done of `done`; while a stop is not yet reported (the thread
  // that stopped has not called callbacks_.stopped), keeps them for it, so
  // that the owner hears why the data plane stopped before the operations
  // the stop failed, whichever thread finished them.
  void Report(Done& done) ABSL_LOCKS_EXCLUDED(mu_);
  // The thread that stopped: callbacks_.stopped(status), then what Report
  // kept meanwhile goes into `done`.
  void ReportStop(const absl::Status& status, Done& done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // This node's proposal for the next round (Negotiation::LocalState).
  PartitionTuner::Proposal ProposalLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the round's agreed partition size and credit.
  void ApplyLocked(int64_t partition_bytes, int64_t credit_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t NowUs() const;

  // Single-node operations up to this size run on the submitting thread.
  static constexpr int64_t kInlineBytes = 64 << 10;
  // Priority mode, more than one node: consecutive admitted push-pulls of
  // whole tensors up to kFuseTensorBytes fuse into launches of up to
  // kFuseLaunchBytes (FuseSmallTensors): one collective instead of one per
  // tensor (ResNet-50 has 161 parameter tensors, MobileNetV2 158, most of
  // them a few KiB).
  static constexpr int64_t kFuseTensorBytes = 256 << 10;
  static constexpr int64_t kFuseLaunchBytes = 1 << 20;

  // Constant after construction.
  const SchedulerOptions options_;
  const Callbacks callbacks_;
  // Null unless something is tuned; thread-safe (the workers add to it).
  const std::unique_ptr<PartitionTuner> tuner_;

  mutable absl::Mutex mu_;
  absl::CondVar news_;
  // Used by the scheduler thread, which resets it under mu_ when it exits;
  // other threads only Interrupt() it, under mu_.
  std::unique_ptr<NegotiationWire> negotiation_ ABSL_PT_GUARDED_BY(mu_);
  // Submitted, not yet agreed; keyed by tensor id.
  absl::flat_hash_map<uint32_t, std::shared_ptr<const Operation>> submitted_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, OpState> ops_ ABSL_GUARDED_BY(mu_);
  LaunchQueue queue_ ABSL_GUARDED_BY(mu_);
  int32_t known_tensors_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t launch_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
  // Agreed in the negotiation (options_ until the first round).
  int64_t partition_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t credit_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retunes_ ABSL_GUARDED_BY(mu_) = 0;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  // Set once scheduling stopped; why.
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_status_ ABSL_GUARDED_BY(mu_);
  // Set by StopLocked when its caller will report the stop (ReportStop),
  // until it has; what finishes meanwhile waits in stop_unreported_done_.
  bool stop_unreported_ ABSL_GUARDED_BY(mu_) = false;
  Done stop_unreported_done_ ABSL_GUARDED_BY(mu_);
  // The stop let the executor run what was launched.
  bool drain_ ABSL_GUARDED_BY(mu_) = false;
  bool scheduler_running_ ABSL_GUARDED_BY(mu_) = true;

  // Declared last: destroyed first, its workers report into the state
  // above until they exit.
  std::unique_ptr<Executor> executor_;
  std::thread scheduler_;
};

}  // namespace baton::agent
