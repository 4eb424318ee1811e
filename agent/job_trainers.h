#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "agent/agent_config.h"
#include "agent/channel_mapping.h"
#include "agent/gpu_support.h"
#include "agent/links.h"
#include "agent/local_tensor.h"
#include "agent/tensor_enqueue.h"
#include "baton/v1/trainer.pb.h"
#include "common/shm.h"

namespace baton::agent {

// The trainers of one job on this node and what they declared: attaching
// (the job's parameters come from the first attach; the others must agree),
// the declarations (LocalTensor: shared memory, or the trainers' CUDA
// buffers opened through CUDA IPC), detaching, and each trainer's
// shared-memory channel (ChannelMapping), whose request ring it drains.
//
// Job thread only. When it is destroyed the names of the channels and of
// the host tensors not unlinked yet are removed; the data planes that
// read the tensors must be gone by then.
class JobTrainers {
 public:
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
    // Its request ring was found corrupt (ChannelRing::Corrupt) and its
    // stream closed: the ring is not drained again.
    bool ring_refused = false;
    // The GPU of its CUDA tensors (index into the agent's devices); -1
    // before its first CUDA declaration.
    int cuda_device = -1;
  };

  // `shm_prefix` starts the names of the job's shared memory. `doorbell`:
  // the job's doorbell in shared memory, outliving this; null when there is
  // none, and then no trainer gets a channel (everything goes over the
  // streams).
  JobTrainers(std::string job, const AgentConfig& config,
              const GpuSupport& gpus, std::string shm_prefix,
              const SharedMemory* doorbell);
  ~JobTrainers();

  JobTrainers(const JobTrainers&) = delete;
  JobTrainers& operator=(const JobTrainers&) = delete;

  // Attaches `sink` as local rank request.local_rank(), or says why not
  // (the caller closes the stream with it). `attaching`: the job still
  // waits for local ranks; false once it joined (or ended), when every
  // attach is refused.
  absl::Status Attach(const std::shared_ptr<TrainerSink>& sink,
                      const v1::AttachRequest& request, bool attaching);
  // Every local rank attached.
  bool all_attached() const;
  // Declares local rank `rank`'s tensors, all or nothing, and answers it:
  // `declared`, or an error that says nothing was declared. True when
  // declared. `next_step(index)`: the step the other local ranks are at on
  // a tensor declared before (a trainer that replaces a lost one joins
  // them there).
  bool Declare(int32_t rank, uint64_t seq, const v1::DeclareRequest& request,
               absl::FunctionRef<int64_t(int32_t index)> next_step);
  // Local rank `rank` detached: it is told nothing more.
  void Detach(int32_t rank);
  // Local rank `rank`'s trainer is gone without detaching: its place is
  // free for a trainer that attaches again as `rank` (and declares the same
  // tensors in the same order). Its channel's name is removed.
  void Lose(int32_t rank);
  // Every local rank attached and detached since.
  bool all_detached() const;
  // Closes, with `status`, every stream that did not detach.
  void CloseAll(const absl::Status& status);

  // Drains every trainer's request ring into `enqueue` (local rank, the
  // enqueue); true when it found any. Bounded: a trainer that keeps pushing
  // cannot starve the others. A corrupt ring (ChannelRing::Corrupt) gives
  // nothing: that trainer's stream is closed with INVALID_ARGUMENT.
  bool DrainChannels(
      absl::FunctionRef<void(int32_t rank, const TensorEnqueue& enqueue)>
          enqueue);
  // To every trainer that did not detach.
  void SendToAll(const v1::TrainerEvent& event);

  // The local rank attached through `sink` and not detached; -1 if none.
  int32_t RankOf(const TrainerSink* sink) const;
  // Local rank `rank` finished step `step` of a tensor.
  void Completed(int32_t rank, int64_t step);
  // The last step every local rank finished of some tensor (the oldest of
  // their completed_step); -1 before any.
  int64_t CompletedStep() const;
  // Each local rank's GPU (Trainer::cuda_device), in local-rank order.
  std::vector<int> CudaDevices() const;
  // Trainers attached and not detached.
  int connected() const;
  // Names local rank `local_rank`'s channel and the job's doorbell in
  // `attached`, when it has a channel.
  void AddChannel(int32_t local_rank, v1::Attached* attached) const;

  // The first attach; the others agreed with it.
  const v1::AttachRequest& params() const { return params_; }
  int32_t local_size() const { return params_.local_size(); }
  SchedulingMode mode() const { return mode_; }
  // The scheduler chooses the partition size: the job did not ask for one
  // (AttachRequest.partition_bytes) and the agent tunes.
  bool TunesPartitions() const;
  // By local rank (local_size of them once the first trainer attached).
  int32_t size() const { return static_cast<int32_t>(trainers_.size()); }
  const Trainer& trainer(int32_t rank) const { return trainers_[rank]; }
  // The declared tensors, by index.
  int32_t tensor_count() const { return static_cast<int32_t>(tensors_.size()); }
  LocalTensor& tensor(int32_t index) { return *tensors_[index]; }
  const LocalTensor& tensor(int32_t index) const { return *tensors_[index]; }

 private:
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

  // Constant after construction.
  const std::string job_;
  const AgentConfig& config_;
  const GpuSupport& gpus_;
  const std::string shm_prefix_;
  const SharedMemory* const doorbell_;
  // "job=J node=N ": attaching happens before any generation.
  const std::string log_prefix_;

  v1::AttachRequest params_;
  SchedulingMode mode_ = SchedulingMode::kPriority;
  std::vector<Trainer> trainers_;
  int32_t attached_ = 0;
  std::vector<std::unique_ptr<LocalTensor>> tensors_;
};

}  // namespace baton::agent
