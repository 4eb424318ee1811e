#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/scheduler/launch_queue.h"
#include "agent/scheduler/operation.h"
#include "agent/scheduler/partition_tuner.h"
#include "agent/scheduler/timeline_recorder.h"
#include "agent/transport/device_communicator.h"
#include "agent/transport/device_memory.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// The communicators of a job's CUDA tensors, for one generation. An
// executor without them cannot run operations on CUDA tensors.
struct DeviceGroup {
  GpuCrossNode cross_node = GpuCrossNode::kNccl;
  // kNccl: every GPU of the job (rank = node rank x local devices + local
  // device). kGloo: this node's GPUs only.
  std::unique_ptr<DeviceCommunicator> comm;
  // kGloo with more than one node: between the agents, on host memory.
  std::unique_ptr<Communicator> host;
  // kGloo: the copies between device and host. Not owned; outlives the
  // executor.
  DeviceMemory* memory = nullptr;
};

struct ExecutorOptions {
  std::string job;
  int64_t generation = 0;
  int32_t node_rank = 0;
  int32_t num_nodes = 1;
  int32_t world_size = 1;
  // Trainers per node, by node rank: where each node's ranks sit in an
  // allgather's result. Empty: world_size / num_nodes on every node.
  std::vector<int32_t> local_sizes;
  // Bounds every collective (and the scheduler's negotiation rounds).
  std::chrono::milliseconds op_timeout{60000};
  // Node names by node rank, for errors that name the peers of a failed
  // collective.
  std::vector<std::string> node_names;
  // When set, every launch's phases are recorded here when it returns
  // (batonctl timeline). Not owned; outlives the executor.
  TimelineRecorder* timeline = nullptr;
  // Every reading of time (the timeline's phases). Not owned.
  Clock* clock = Clock::Real();
  // When set, each host collective that succeeded across nodes is added
  // here: the collective's own time, and the bytes it sent (less any it
  // left out) times the host collectives that shared the link with it
  // (itself included). Not owned.
  PartitionTuner* tuner = nullptr;
  // Optional: after a host collective that left bytes out (zero blocks,
  // Communicator::skipped_bytes), how many; on the worker's thread.
  std::function<void(int64_t bytes)> bytes_skipped;
};

// The executing half of a generation's data plane (the Scheduler decides
// what to launch): one worker thread per data communicator runs the host
// tensors' launches on the tensors' shared memory (the local reduction, then
// the collective), and one more worker, once devices are attached, runs the
// CUDA tensors' partitions on the DeviceGroup. Each worker runs its queue in
// order; the scheduler gives every node's worker i the same launches in the
// same order.
//
// A launch that returned is reported once through `returned`, on its
// worker's thread, with no lock of the executor held.
//
// Thread-safe.
class Executor {
 public:
  // The launch's collective returned with `status`; `dropped`: it was
  // never started (Stop with drop).
  using Returned =
      std::function<void(Launch launch, absl::Status status, bool dropped)>;

  // `data`: at least one. Starts the workers.
  Executor(ExecutorOptions options,
           std::vector<std::unique_ptr<Communicator>> data, Returned returned);
  // Stops (without drop, if Stop was not called) and joins the workers; a
  // worker inside a collective is waited for (bounded by op_timeout).
  ~Executor();

  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // At most once. Not after Stop with drop: the group is aborted at once.
  void AttachDevices(DeviceGroup device) ABSL_LOCKS_EXCLUDED(mu_);
  bool has_devices() const ABSL_LOCKS_EXCLUDED(mu_);

  // Host launches go to one of host_channels() workers: the one named by
  // the launch sequence number of their first partition.
  size_t host_channels() const { return host_workers_; }

  // Queues `launch` on `channel` (host_channels() is the device worker;
  // devices must be attached). `channel` is set in every task.
  void Queue(Launch launch, int32_t channel) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs a host partition of a single-node job on the calling thread (no
  // collective: the local reduction only) and records it.
  absl::Status RunInline(const PartitionTask& task);

  // No launch is queued after this. `drop`: queued launches return as
  // dropped, and the communicators are aborted with `status` (a collective
  // in flight ends at once on NCCL and the TCP rings, at its timeout on
  // gloo); otherwise the workers still run what is queued. Only the first
  // call counts.
  void Stop(const absl::Status& status, bool drop) ABSL_LOCKS_EXCLUDED(mu_);

  // True once every worker has exited (after Stop, when its queue ran out).
  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Worker {
    // Host tensors' worker: its communicator. The device worker: the
    // DeviceGroup's host communicator (may be null) and its device one.
    // Stop aborts both under mu_, so the worker resets them under mu_.
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<DeviceCommunicator> device;
    std::deque<Launch> queue;
    // The packed buffer of fused launches and of partitioned allgathers
    // (grows to the largest one); the worker's own.
    std::vector<uint8_t> fused;
    // Signalled when its queue grows or the executor stops.
    absl::CondVar cv;
    std::thread thread;
  };

  void AttachDevicesLocked(DeviceGroup device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartWorker(Worker* worker, std::string name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop(Worker* worker) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs one partition: the local reduction, then the collective.
  // `*reduced_us` is when the local reduction finished.
  absl::Status Execute(Worker& worker, const PartitionTask& task,
                       int64_t* reduced_us);
  // Runs a fused launch: each tensor's local reduction into the packed
  // buffer, one allreduce over it, each result copied out.
  absl::Status ExecuteFused(Worker& worker, const Launch& launch,
                            int64_t* reduced_us);
  // Each node's share of a collective whose ranks each hold `per_rank`
  // units: per_rank times its trainers (options_.local_sizes).
  absl::InlinedVector<size_t, 16> NodeSpans(size_t per_rank) const;
  // Execute's allgather of a host tensor: the local inputs copied to their
  // ranks' places, then the nodes' spans exchanged.
  absl::Status ExecuteAllgather(Worker& worker, const PartitionTask& task,
                                const CollectiveOptions& opts,
                                int64_t* reduced_us);
  // Execute's reduce-scatter of a host tensor: every rank's slice reduced
  // over the local inputs, the nodes' spans reduce-scattered, each local
  // trainer's slice put in its place.
  absl::Status ExecuteReduceScatter(Worker& worker, const PartitionTask& task,
                                    CollectiveOptions opts,
                                    int64_t* reduced_us);
  // Execute's alltoall of a host tensor: the local inputs' blocks packed by
  // destination node, the nodes' chunks exchanged, each block put in its
  // local trainer's output (none of it copied where a node has one
  // trainer and the task is the whole tensor).
  absl::Status ExecuteAlltoall(Worker& worker, const PartitionTask& task,
                               const CollectiveOptions& opts,
                               int64_t* reduced_us);
  // The same for a CUDA tensor, on the device worker.
  absl::Status ExecuteOnDevice(Worker& worker, const PartitionTask& task,
                               int64_t* reduced_us);
  // The hierarchical path's host step ended after a Stop with drop: the
  // trainers were told the operation failed and may be writing their next
  // input, so the result is not copied into their buffers (the stop's
  // status).
  absl::Status AbortedBeforeWriteBack() const ABSL_LOCKS_EXCLUDED(mu_);
  // Hands a returned partition's phases to options_.timeline.
  void Record(const PartitionTask& task, int64_t started_us, int64_t reduced_us,
              int64_t done_us, bool ok) const;
  int64_t NowUs() const;
  std::string Describe(const PartitionTask& task) const;
  std::string DescribeFused(const Launch& launch) const;
  // A transport error with the collective's peers named.
  absl::Status Failed(const absl::Status& status,
                      const std::string& what) const;

  // Constant after construction.
  const ExecutorOptions options_;
  const Returned returned_;
  size_t host_workers_ = 0;

  mutable absl::Mutex mu_;
  // The host workers, then the device worker once attached. The vector is
  // reserved for it, so a worker's pointer never moves.
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  Worker* device_worker_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Set with the devices; read by the device worker after it started.
  GpuCrossNode cross_node_ = GpuCrossNode::kNccl;
  DeviceMemory* device_memory_ = nullptr;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool drop_ ABSL_GUARDED_BY(mu_) = false;
  // Host launches inside Execute now (the tuner's samples).
  std::atomic<int> host_running_{0};
  absl::Status stop_status_ ABSL_GUARDED_BY(mu_);
  int workers_running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton::agent
