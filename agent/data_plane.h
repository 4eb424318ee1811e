#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "agent/launch_queue.h"
#include "agent/negotiation.h"
#include "agent/operation.h"
#include "agent/timeline_recorder.h"
#include "agent/transport/device_communicator.h"
#include "agent/transport/device_memory.h"
#include "agent/transport/transport.h"

namespace baton::agent {

struct DataPlaneOptions {
  std::string job;
  int64_t generation = 0;
  int32_t node_rank = 0;
  int32_t num_nodes = 1;
  int32_t world_size = 1;
  SchedulingMode mode = SchedulingMode::kPriority;
  // Bytes this node may have in flight (priority mode); one partition is
  // always admitted.
  int64_t credit_bytes = 16 << 20;
  // Bounds every collective, negotiation rounds included.
  std::chrono::milliseconds op_timeout{60000};
  // Node names by node rank, for errors that name the peers of a failed
  // collective.
  std::vector<std::string> node_names;
  // When set, every launch is appended here as one line (tests compare the
  // files of all nodes). Not owned; outlives the data plane.
  std::FILE* launch_trace = nullptr;
  // When set, every partition's phases are recorded here when it returns
  // (batonctl timeline). Not owned; outlives the data plane.
  TimelineRecorder* timeline = nullptr;
};

// The communicators of a job's CUDA tensors, for one generation. A data
// plane without them fails operations on CUDA tensors.
struct DeviceGroup {
  GpuCrossNode cross_node = GpuCrossNode::kNccl;
  // kNccl: every GPU of the job (rank = node rank x local devices + local
  // device). kGloo: this node's GPUs only.
  std::unique_ptr<DeviceCommunicator> comm;
  // kGloo with more than one node: between the agents, on host memory.
  std::unique_ptr<Communicator> host;
  // kGloo: the copies between device and host. Not owned; outlives the
  // data plane.
  DeviceMemory* memory = nullptr;
};

// The data plane of one job on this node for one sealed generation: the
// scheduler thread that agrees with the other nodes what to launch (the
// ordering contract) and applies priority and credit, and one worker thread
// per data communicator that runs the collectives on the tensors' shared
// memory.
//
// Launches of host tensors (one partition, or in priority mode a run of
// small whole tensors fused into one collective: FuseSmallTensors) are
// assigned to the data communicators round-robin by the launch sequence
// number of their first partition, which every node computes identically,
// so each communicator sees the same collectives in the same order on every
// node. Partitions of CUDA tensors all go to one more worker
// that owns the DeviceGroup, in launch order (NCCL needs one order per
// group); a tensor is in the same kind of memory on every node (the
// coordinator compares TensorSpec.memory).
//
// Thread-safe. Callbacks run on data-plane threads without its lock held.
class DataPlane {
 public:
  struct Callbacks {
    // Exactly once per submitted operation, when the data plane no longer
    // touches its buffers: OK, or why it failed.
    std::function<void(uint64_t op_id, absl::Status status)> op_done;
    // At most once, when the data plane stops on its own: a communicator
    // failed, nodes disagree on the scheduling mode, or a node left.
    std::function<void(absl::Status status)> stopped;
  };

  struct Stats {
    // Operations submitted and not finished, and partitions queued.
    int64_t queue_depth = 0;
    int64_t bytes_in_flight = 0;
    // Bytes of partitions completed since the data plane started.
    int64_t bytes_done = 0;
    // Negotiation rounds run (every node of the job runs the same ones).
    int64_t rounds = 0;
  };

  // `negotiation` carries the rounds; `data` (at least one) the collectives
  // of host tensors, `device` those of CUDA tensors (comm null: none here).
  // Starts the threads.
  DataPlane(DataPlaneOptions options,
            std::unique_ptr<NegotiationWire> negotiation,
            std::vector<std::unique_ptr<Communicator>> data,
            Callbacks callbacks, DeviceGroup device = {});
  // Aborts (CANCELLED) and joins the threads; a worker inside a collective
  // is waited for (bounded by op_timeout).
  ~DataPlane();

  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Gives the data plane its CUDA tensors' communicators once they are
  // connected (the agent connects them only for jobs with CUDA tensors).
  // At most once; Submit fails operations on CUDA tensors before it.
  void AttachDevices(DeviceGroup device);
  bool has_devices() const;

  // Hands over an operation whose inputs are ready. At most one per tensor
  // at a time: the next step of a tensor is submitted after op_done of the
  // previous one.
  void Submit(std::shared_ptr<const Operation> op);

  // The plan now covers tensor ids 0..count-1 on this node.
  void SetKnownTensors(int32_t count);

  // This node is leaving the job: announced in the next round, after which
  // every node stops scheduling; launched partitions still complete, the
  // rest fail with FAILED_PRECONDITION.
  void Leave();

  // Stops now: operations not launched fail with `status` at once; launched
  // partitions are not started if still queued, and operations with a
  // partition inside a collective fail when that collective returns (an
  // NCCL collective is aborted, so that is at once).
  void Abort(absl::Status status);

  Stats stats() const;
  // True once every thread has exited.
  bool finished() const;

 private:
  struct OpState {
    std::shared_ptr<const Operation> op;
    int32_t launched = 0;
    int32_t returned = 0;
    absl::Status status;
    // For the timeline (unix microseconds).
    int64_t submitted_us = 0;
    int64_t agreed_us = 0;
  };
  struct Worker {
    // Host tensors' worker: its communicator. The device worker: the
    // DeviceGroup's host communicator (may be null) and its device one.
    // StopLocked aborts both, so the worker resets them under mu_.
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<DeviceCommunicator> device;
    std::deque<Launch> queue;
    // The packed buffer of fused launches (grows to the largest one).
    std::vector<uint8_t> fused;
    std::condition_variable cv;
    std::thread thread;
  };
  using Done = std::vector<std::pair<uint64_t, absl::Status>>;

  void AttachDevicesLocked(DeviceGroup device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulerLoop();
  void WorkerLoop(Worker* worker);
  // Runs one partition: the local reduction, then the collective.
  // `*reduced_us` is when the local reduction finished.
  absl::Status Execute(Worker& worker, const PartitionTask& task,
                       int64_t* reduced_us);
  // Runs a fused launch: each tensor's local reduction into the packed
  // buffer, one allreduce over it, each result copied out.
  absl::Status ExecuteFused(Worker& worker, const Launch& launch,
                            int64_t* reduced_us);
  // The hierarchical path's gloo step ended after an Abort: the trainers
  // were told the operation failed and may be writing their next input, so
  // the result is not copied into their buffers (the abort's status).
  absl::Status AbortedBeforeWriteBack() const;
  // The same for a CUDA tensor, on the device worker.
  absl::Status ExecuteOnDevice(Worker& worker, const PartitionTask& task,
                               int64_t* reduced_us);
  // Hands a returned partition's phases to options_.timeline.
  void Record(const PartitionTask& task, int64_t submitted_us,
              int64_t agreed_us, int64_t started_us, int64_t reduced_us,
              int64_t done_us, bool ok) const;
  // Runs one round; false when the scheduler must exit.
  bool Round(std::vector<int64_t>& vec, int32_t& body);
  // Waits until this node has news or a peer starts a round; false when
  // the scheduler must exit. `lock` holds mu_.
  bool AwaitNews(std::unique_lock<std::mutex>& lock, int32_t body);
  // Stops scheduling because the negotiation failed with `status`.
  void NegotiationFailed(absl::Status status);
  // Something the next round must see happened here: starts a round now,
  // on this node and (through the negotiation) on every other.
  void WakeSchedulerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `launch` (one partition, or fused small tensors) on one worker.
  void LaunchLocked(Launch launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LaunchTrace(const PartitionTask& task, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops scheduling with `status`. `drain`: workers still run the queued
  // partitions (every node launched them); otherwise queued ones are
  // dropped.
  void StopLocked(absl::Status status, bool drain, Done& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reports `state` when its last launched partition returned.
  void MaybeFinishLocked(uint64_t op_id, Done& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Report(Done& done);
  std::string Describe(const PartitionTask& task) const;
  // A transport error with the collective's peers named.
  absl::Status TransportError(const absl::Status& status,
                              const std::string& what) const;
  // `status` as the failure of `op` ("push_pull of tensor "w" step 3: ...").
  static absl::Status OpFailure(const Operation& op,
                                const absl::Status& status);

  // Single-node operations up to this size run on the submitting thread.
  static constexpr int64_t kInlineBytes = 64 << 10;
  // Priority mode, more than one node: consecutive admitted push-pulls of
  // whole tensors up to kFuseTensorBytes fuse into launches of up to
  // kFuseLaunchBytes (FuseSmallTensors): one collective instead of one per
  // tensor (ResNet-50 has 161 parameter tensors, MobileNetV2 158, most of
  // them a few KiB).
  static constexpr int64_t kFuseTensorBytes = 256 << 10;
  static constexpr int64_t kFuseLaunchBytes = 1 << 20;
  std::string DescribeFused(const Launch& launch) const;

  // Constant after construction.
  const DataPlaneOptions options_;
  const Callbacks callbacks_;
  // The host tensors' workers (host_workers_ of them, constant), then the
  // device worker once devices are attached: set once under mu_, read by
  // that worker without it.
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  size_t host_workers_ = 0;
  Worker* device_worker_ ABSL_GUARDED_BY(mu_) = nullptr;
  GpuCrossNode cross_node_ = GpuCrossNode::kNccl;
  DeviceMemory* device_memory_ = nullptr;
  // Used by the scheduler thread, which resets it under mu_ when it exits;
  // other threads only Interrupt() it, under mu_. (A worker's comm is used
  // and reset by that worker only.)
  std::unique_ptr<NegotiationWire> negotiation_;

  mutable std::mutex mu_;
  std::condition_variable scheduler_cv_;
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
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  // Set once scheduling stopped; why.
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stop_status_ ABSL_GUARDED_BY(mu_);
  // Queued partitions are dropped rather than run.
  bool drop_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool exit_workers_ ABSL_GUARDED_BY(mu_) = false;
  int threads_running_ ABSL_GUARDED_BY(mu_) = 0;

  std::thread scheduler_;
};

}  // namespace baton::agent
