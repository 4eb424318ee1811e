#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/scheduler/scheduler.h"
#include "agent/links.h"
#include "agent/local_tensor.h"
#include "agent/scheduler/timeline_recorder.h"
#include "agent/transport/transport.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/trainer.pb.h"
#include "common/shm.h"
#include "common/shm_channel.h"

namespace baton::agent {

// The GPUs this agent drives, for jobs with CUDA tensors. Without them
// (`memory` null) CUDA declarations are refused with `unavailable`.
struct GpuSupport {
  std::unique_ptr<DeviceMemory> memory;
  // A transport over the given devices (indices into memory->devices()), in
  // local-rank order.
  std::function<absl::StatusOr<std::unique_ptr<DeviceTransport>>(
      const std::vector<int>& local_devices)>
      transport;
  // Why there are none ("no CUDA device (...)").
  std::string unavailable = "it drives no GPU";
};

// Builds the rendezvous store of one (job, generation).
using StoreFactory = std::function<std::shared_ptr<KeyValueStore>(
    const std::string& job, int64_t generation)>;

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
class AgentJob {
 public:
  struct Environment {
    const AgentConfig* config = nullptr;
    CoordinatorLink* coordinator = nullptr;
    Transport* transport = nullptr;
    // Never null; outlives the job.
    const GpuSupport* gpus = nullptr;
    StoreFactory store_factory;
    // This job's metrics on this node (never null).
    std::shared_ptr<JobMetrics> metrics;
    // Called once from the job's thread when the job is over on this node;
    // the owner then destroys the job from another thread.
    std::function<void()> on_done;
  };

  AgentJob(std::string name, Environment env);
  // Fails what is left (CANCELLED) and joins the threads.
  ~AgentJob();

  AgentJob(const AgentJob&) = delete;
  AgentJob& operator=(const AgentJob&) = delete;

  const std::string& name() const { return name_; }
  // True once the job ended on this node (it only waits to be destroyed).
  bool ended() const { return ended_.load(); }

  // Trainer requests. `sink` identifies the trainer's stream.
  void Attach(std::shared_ptr<TrainerSink> sink, uint64_t seq,
              v1::AttachRequest request);
  void Declare(TrainerSink* sink, uint64_t seq, v1::DeclareRequest request);
  void Enqueue(TrainerSink* sink, uint64_t seq, v1::EnqueueRequest request);
  void Detach(TrainerSink* sink, uint64_t seq, v1::DetachRequest request);
  // The trainer's stream closed without a detach.
  void TrainerGone(TrainerSink* sink);

  // Coordinator messages about this job.
  void OnCoordinatorMessage(v1::CoordinatorMessage message);
  // A coordinator session (re)opened; `restarted`: a new coordinator
  // process, which must be told the job's state.
  void OnCoordinatorSession(bool restarted);

 private:
  enum class State {
    kAttaching,  // waiting for every local rank
    kJoining,    // joined, waiting for the generation to be sealed
    kRunning,    // sealed generation
    kReforming,  // generation aborted, waiting for the next
    kDone,
  };
  // A trainer's shared-memory channel (common/shm_channel.h). Shared with
  // the data plane's threads, which push successful completions into its
  // ring themselves (Delivery).
  struct ChannelMapping {
    SharedMemory memory;
    TrainerChannel* channel = nullptr;
    // One producer of completions at a time.
    absl::Mutex completions_mu;
    // Pushes `entry` and rings the trainer's bell; false when the ring is
    // full (then the completion goes over the stream).
    bool Complete(const ChannelEntry& entry)
        ABSL_LOCKS_EXCLUDED(completions_mu);
  };
  struct Trainer {
    std::shared_ptr<TrainerSink> sink;
    int64_t pid = 0;
    int32_t declared = 0;
    bool detached = false;
    // Last step this rank finished of any tensor; -1 before the first.
    int64_t completed_step = -1;
    // The shared-memory fast path of its enqueues and completions (null:
    // everything over the stream).
    std::shared_ptr<ChannelMapping> mapping;
    // The GPU of its CUDA tensors (index into the agent's devices); -1
    // before its first CUDA declaration.
    int cuda_device = -1;
  };
  // One local rank's enqueue of a tensor, waiting for the other local ranks.
  struct Enqueued {
    bool present = false;
    v1::EnqueueRequest request;
    // Came through the trainer's channel: complete it there too.
    bool via_channel = false;
  };
  struct PendingOp {
    uint64_t id = 0;
    int32_t index = 0;
    int64_t step = 0;
    int64_t generation = 0;
    std::chrono::steady_clock::time_point first_enqueued;
    std::chrono::steady_clock::time_point ready;
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
  using Clock = std::chrono::steady_clock;

  // The job thread.
  void Post(std::function<void()> task);
  void Loop();
  void OnTimer(Clock::time_point now);

  // agent_job.cc: trainers, declarations, operations.
  void HandleAttach(std::shared_ptr<TrainerSink> sink, uint64_t seq,
                    const v1::AttachRequest& request);
  void HandleDeclare(TrainerSink* sink, uint64_t seq,
                     const v1::DeclareRequest& request);
  void HandleEnqueue(TrainerSink* sink, const v1::EnqueueRequest& request,
                     bool via_channel = false);
  // Drains every trainer's request ring; true when it found any.
  bool DrainChannels();
  // Matches DeclareRequest.cuda_buffers to the request's CUDA tensors:
  // (*buffers)[i] for tensors[i], null for host tensors.
  absl::Status MatchCudaBuffers(
      const v1::DeclareRequest& request,
      std::vector<const v1::CudaBuffer*>* buffers) const;
  // Opens local rank `rank`'s buffer and ready event of a CUDA tensor.
  absl::Status OpenCudaBuffer(int32_t rank, const std::string& what,
                              const v1::CudaBuffer& buffer, int64_t bytes,
                              std::shared_ptr<DeviceBuffer>* opened,
                              std::unique_ptr<DeviceEvent>* event) const;
  void HandleDetach(TrainerSink* sink, const v1::DetachRequest& request);
  void HandleTrainerGone(TrainerSink* sink);
  absl::Status ValidateEnqueue(int32_t rank, const v1::EnqueueRequest& r);
  void MakeReady(PendingOp& pending);
  void TrySubmit(PendingOp& pending);
  void SubmitWaiting();
  // Records whom to tell of `pending`'s outcome: every local rank that
  // enqueued it, over its channel or its stream.
  void PrepareDelivery(const PendingOp& pending);
  // Takes `id`'s delivery record; false when it is gone (OpDone told the
  // trainers of a success already, or there was none).
  bool TakeDelivery(uint64_t id);
  // Local rank `rank` detached or is gone: it is told nothing more.
  void DropDeliveries(int32_t rank);
  // Scheduler::Callbacks::op_done, on a data-plane thread: the one path by
  // which a submitted operation ends. A success frees the tensor for its
  // next step (finished_) and tells the trainers at once, one thread
  // hand-over sooner than through the job thread; the job thread then
  // retires the record (OnOpDone). A failure goes to the job thread, which
  // knows why (a lost node, a held failure) and tells them (FinishOp).
  void OpDone(uint64_t id, absl::Status status);
  // If the operation of tensor `index` ended in OpDone and its OnOpDone has
  // not run yet, retires it now, so that the next step's enqueue finds the
  // tensor free.
  void RetireFinished(int32_t index);
  void OnOpDone(uint64_t id, absl::Status status);
  // Tells the trainers the outcome and forgets the operation (a success:
  // OpDone told them; only the bookkeeping is left). `ended`: when it
  // ended, for its latency.
  void FinishOp(PendingOp& pending, const absl::Status& status,
                Clock::time_point ended = Clock::now());
  // Fails it now even if a data plane still holds its buffers (then the
  // tensor stays leased until that data plane lets go).
  void FailNow(PendingOp& pending, const absl::Status& status);
  void Notify(PendingOp& pending, const absl::Status& status);
  void FailOp(int32_t rank, const v1::EnqueueRequest& request,
              const absl::Status& status);
  int32_t RankOf(const TrainerSink* sink) const;
  void SendToAll(const v1::TrainerEvent& event);
  // Ends the job on this node: fails every operation, closes every stream.
  void End(const absl::Status& status);
  void LeaveAndEnd(const absl::Status& status, bool finished);

  // agent_job_membership.cc: coordinator messages and the data plane.
  void HandleCoordinatorMessage(const v1::CoordinatorMessage& message);
  void HandleMembership(const v1::Membership& membership);
  void HandlePlan(const v1::TensorPlan& plan);
  void HandleGenerationAborted(const v1::GenerationAborted& aborted);
  void HandleError(uint64_t reply_to, const v1::Error& error);
  void HandleSession(bool restarted);
  void SendJoin();
  void SendManifest();
  void SendReport();
  void ConnectDataPlane();
  // On a connector thread: the data communicators every node builds (node
  // rank 0's --data_channels, published in the store).
  absl::StatusOr<int> AgreeOnChannels(const ConnectRequest& request) const;
  void OnDataPlaneConnected(int64_t generation,
                            absl::StatusOr<DataConnections> connections);
  void OnDataPlaneStopped(Scheduler* plane, absl::Status status);
  // Connects the CUDA tensors' communicators of this generation once the
  // plan has a CUDA tensor (every node sees the same plan, so every node
  // connects them); on a connector thread.
  void MaybeConnectDevices();
  void OnDevicesConnected(int64_t generation,
                          absl::StatusOr<DeviceGroup> group);
  void RetireDataPlane(absl::Status status);
  // Fails every operation of `generation` now (FailNow), including those
  // still waiting for some local ranks; `only_waiting`: only those no data
  // plane holds.
  void FailGeneration(int64_t generation, const absl::Status& status,
                      bool only_waiting = false);
  void SendAttached();
  v1::Attached AttachedFor(int32_t local_rank) const;
  int64_t CompletedStep() const;
  // The scheduler chooses the partition size: the job did not ask for one
  // (AttachRequest.partition_bytes) and the agent tunes.
  bool TunesPartitions() const;

  // agent_job.cc: observability.
  // "job=J gen=G node=N " for this job's log lines, with "rank=R " (the
  // global rank) for `local_rank` once a generation is sealed. Job thread
  // only.
  std::string JobLogPrefix(int32_t local_rank = -1) const;
  // Samples the gauges of env_.metrics: data plane and trainers.
  void SampleMetrics();

  const std::string name_;
  const Environment env_;
  const AgentConfig& config_;
  // Before the data planes: they record into it until they are destroyed.
  TimelineRecorder timeline_{static_cast<size_t>(config_.timeline_records)};
  // "/baton.<agent pid>.<instance>.<job>.": names of this job's shared memory.
  std::string shm_prefix_;

  // The job's doorbell: trainers ring it after pushing into their request
  // rings, Post after queueing a task; the job thread sleeps on it.
  SharedMemory doorbell_memory_;
  Doorbell* doorbell_ = nullptr;
  // Fallback when the doorbell could not be created.
  Doorbell local_doorbell_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // Everything below is owned by the job thread.
  State state_ = State::kAttaching;
  v1::AttachRequest params_;  // the first attach; the others must agree
  SchedulingMode mode_ = SchedulingMode::kPriority;
  std::vector<Trainer> trainers_;
  int32_t attached_ = 0;
  std::vector<std::unique_ptr<LocalTensor>> tensors_;
  int32_t manifest_sent_ = 0;
  uint64_t join_seq_ = 0;
  uint64_t manifest_seq_ = 0;
  uint64_t rejoin_seq_ = 0;
  std::optional<v1::Membership> membership_;
  int32_t node_rank_ = -1;
  int32_t rank_offset_ = 0;
  std::optional<v1::TensorPlan> plan_;
  int64_t partition_bytes_ = 0;
  // Operations by id, and each tensor's operation (at most one at a time).
  absl::flat_hash_map<uint64_t, PendingOp> ops_;
  std::vector<uint64_t> op_of_tensor_;
  // Per tensor: a failed operation still inside an old data plane (0: none);
  // the tensor's next operation waits for it.
  std::vector<uint64_t> lease_of_tensor_;
  std::unique_ptr<Scheduler> data_plane_;
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
    v1::TrainerEvent completion;
  };
  absl::Mutex deliveries_mu_;
  absl::flat_hash_map<uint64_t, Delivery> deliveries_
      ABSL_GUARDED_BY(deliveries_mu_);
  // Told of a success by OpDone, OnOpDone not run yet: when they finished.
  absl::flat_hash_map<uint64_t, Clock::time_point> finished_
      ABSL_GUARDED_BY(deliveries_mu_);
  // The generation whose device group is connecting or attached (-1: none),
  // and why connecting it failed (CUDA operations of that generation fail
  // with it).
  int64_t devices_generation_ = -1;
  std::optional<absl::Status> devices_failed_;
  // Data planes of aborted generations, until their threads exit.
  std::vector<std::unique_ptr<Scheduler>> retired_;
  // Generation aborted by the coordinator -> the status its operations fail
  // with (names the lost node).
  absl::flat_hash_map<int64_t, absl::Status> aborted_;
  // Set when the data plane failed on its own: operation failures are held
  // until the coordinator names a lost node or the grace period ends.
  std::optional<absl::Status> data_plane_failure_;
  Clock::time_point failure_deadline_;
  std::vector<std::pair<uint64_t, absl::Status>> held_failures_;
  // Set when the data plane stopped for good in this generation (a node
  // left, or the nodes disagree on the mode): enqueues fail with it at once.
  std::optional<absl::Status> data_plane_stopped_;
  Clock::time_point next_report_;
  // Per tensor id since the last report: operations, total and max latency.
  struct Latency {
    int64_t count = 0;
    int64_t total_us = 0;
    int64_t max_us = 0;
  };
  absl::flat_hash_map<uint32_t, Latency> latencies_;
  int64_t reported_bytes_done_ = 0;
  // Bytes per second over the last report interval long enough to measure.
  double throughput_ = 0;
  Clock::time_point reported_at_;
  std::FILE* launch_trace_ = nullptr;
  bool done_reported_ = false;
  std::atomic<bool> ended_{false};

  std::thread thread_;
  // Data-plane connects run on their own threads, so the job thread never
  // blocks on peers; joined when the job is destroyed.
  std::vector<std::thread> connectors_;
};

}  // namespace baton::agent
