#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/trainer.pb.h"

namespace baton {

// How a trainer reaches its node's agent and which job it joins.
struct ClientOptions {
  // The agent's unix socket (BATON_AGENT_SOCKET).
  std::string socket = "/tmp/baton-agent.sock";
  // BATON_JOB, else torchrun's TORCHELASTIC_RUN_ID (its --rdzv_id).
  std::string job;
  // LOCAL_RANK / LOCAL_WORLD_SIZE.
  int32_t local_rank = 0;
  int32_t local_size = 1;
  // Nodes of the job: BATON_NODES, else WORLD_SIZE / LOCAL_WORLD_SIZE.
  int32_t expected_nodes = 1;
  // BATON_MIN_NODES; 0 = expected_nodes.
  int32_t min_nodes = 0;
  // The node rank the launcher gave this node (GROUP_RANK, as torchrun and
  // batonrun set it), 0..expected_nodes-1: the job's first generation places
  // the nodes by it, so that the launcher's RANK holds whatever order the
  // nodes join in. -1 (unset): join order.
  int32_t node_rank = -1;
  // BATON_PARTITION_BYTES; 0 = the coordinator's default.
  int64_t partition_bytes = 0;
  // BATON_SCHEDULING: "priority", "fifo", or "" for the agent's default.
  std::string scheduling;
  // Enqueue and complete through the agent's shared-memory channel when it
  // offers one (BATON_SHM_CHANNEL=0 turns it off: everything over gRPC).
  bool shm_channel = true;
  // How long Connect waits for the job to be formed (every node joined).
  std::chrono::milliseconds attach_timeout{300000};
  // Asked at least every 100 ms while Connect waits, on the waiting thread
  // (unset: never). A status other than OK ends the wait with that status,
  // and the trainer leaves the job it was joining (Ctrl-C in Python).
  std::function<absl::Status()> interrupted;

  // Reads the variables named above; INVALID_ARGUMENT names a bad one.
  static absl::StatusOr<ClientOptions> FromEnvironment();
};

// The library's internals (client/*.cc), not part of the API.
namespace client {
class CompletionRing;
// DEADLINE_EXCEEDED with `message`, marked for StillInFlight.
absl::Status StillInFlightError(std::string message);
}  // namespace client

// Whether `status` is a wait that ran out with its operation still in flight
// (Handle::Wait, Session::Synchronize: DEADLINE_EXCEEDED, marked so), as
// opposed to the outcome of an operation that ended, which may be
// DEADLINE_EXCEEDED too. Decide on this, not on a Poll after the wait: the
// operation may complete between the two.
bool StillInFlight(const absl::Status& status);

// A pending collective. Thread-safe; completed exactly once, by the client's
// threads or, on the shared-memory channel, by the thread that waits for it
// (it takes the completion from the ring itself: one thread wake-up fewer).
class Handle {
 public:
  // True once the operation finished (either way).
  bool Poll() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the outcome. DEADLINE_EXCEEDED when `timeout` passes first
  // (the operation stays pending; StillInFlight says so).
  absl::Status Wait(std::chrono::milliseconds timeout =
                        std::chrono::hours(24)) const ABSL_LOCKS_EXCLUDED(mu_);

  int32_t index() const { return index_; }
  int64_t step() const { return step_; }
  // The generation the agent ran it in (after completion).
  int64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);

  // Internal: the client creates and finishes handles.
  Handle(int32_t index, int64_t step,
         std::shared_ptr<client::CompletionRing> ring = nullptr);
  ~Handle();
  void Finish(absl::Status status, int64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool Done() const ABSL_LOCKS_EXCLUDED(mu_);

  const int32_t index_;
  const int64_t step_;
  // The channel's completions, when the client has the channel.
  const std::shared_ptr<client::CompletionRing> ring_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// A declared tensor. In host memory (spec().memory() MEMORY_KIND_HOST): its
// shared memory on this node; write the input, enqueue, wait, read the
// output. In CUDA memory: the caller's CudaBuffer; the caller writes the
// input there and records the ready event before each enqueue, and the
// result is there once the operation completed.
class Tensor {
 public:
  int32_t index() const { return index_; }
  const v1::TensorSpec& spec() const { return spec_; }
  // The result's bytes, and what this trainer writes as its input: the
  // same, but for an allgather one slice of the result.
  int64_t size_bytes() const { return size_bytes_; }
  int64_t input_bytes() const { return input_bytes_; }
  // This trainer's input region and the result region. Valid while the
  // client lives; nullptr for a CUDA tensor. A broadcast's root that is its
  // node's only trainer finds the result in its input (the agent sends the
  // input itself and leaves the output region alone).
  uint8_t* input() const {
    return base_ == nullptr ? nullptr : base_ + input_offset_;
  }
  const uint8_t* output() const {
    return base_ == nullptr ? nullptr : base_ + output_offset_;
  }

  // The step of this trainer's first operation on it (DeclaredTensor's
  // next_step): 0, except in a trainer that attached in place of a lost one.
  int64_t next_step() const { return next_step_; }

  Tensor(int32_t index, v1::TensorSpec spec, int64_t size_bytes,
         int64_t input_bytes, uint8_t* base, int64_t input_offset,
         int64_t output_offset, int64_t next_step = 0)
      : index_(index),
        spec_(std::move(spec)),
        size_bytes_(size_bytes),
        input_bytes_(input_bytes),
        base_(base),
        input_offset_(input_offset),
        output_offset_(output_offset),
        next_step_(next_step) {}

 private:
  int32_t index_;
  v1::TensorSpec spec_;
  int64_t size_bytes_;
  int64_t input_bytes_;
  uint8_t* base_;
  int64_t input_offset_;
  int64_t output_offset_;
  int64_t next_step_;
};

// A trainer's connection to its agent: attach, declare, enqueue, wait.
//
// Thread-safe. One reader thread completes handles from the agent's event
// stream (and one from the shared-memory completion ring); if the stream
// ends, every pending handle fails with the stream's status (UNAVAILABLE
// when the agent ended it with OK).
class Client {
 public:
  // Connects, attaches and waits until the job's generation is sealed.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);
  ~Client();

  int32_t rank() const;
  int32_t size() const;
  int32_t local_rank() const;
  int32_t local_size() const;
  int64_t generation() const;

  // Declares tensors in order (every rank declares the same ones) and maps
  // the shared memory of those in host memory. `cuda_buffers` gives exactly
  // one buffer per spec whose memory is MEMORY_KIND_CUDA (CudaBuffer.index =
  // its position in `specs`) and none for the others; its allocation must
  // stay alive until the client detaches. INVALID_ARGUMENT naming the field
  // when they do not fit (checked before anything is sent); the agent's
  // error when it refuses (FAILED_PRECONDITION for CUDA tensors on an agent
  // without a GPU transport).
  absl::StatusOr<std::vector<std::shared_ptr<Tensor>>> Declare(
      const std::vector<v1::TensorSpec>& specs,
      const std::vector<v1::CudaBuffer>& cuda_buffers = {});

  // Sum (average) over every rank of the tensor's input, into its output;
  // with `op`, its min, max, product or bitwise and/or/xor instead (average
  // only with a sum; the bitwise ops on integer tensors only). A CUDA
  // tensor's input is read once its ready event (recorded before this call)
  // has passed, and its result replaces it in place.
  absl::StatusOr<std::shared_ptr<Handle>> PushPullAsync(
      const Tensor& tensor, int64_t step, bool average,
      v1::ReduceOp op = v1::REDUCE_OP_SUM);
  // Every rank's output becomes `root_rank`'s input.
  absl::StatusOr<std::shared_ptr<Handle>> BroadcastAsync(const Tensor& tensor,
                                                         int64_t step,
                                                         int32_t root_rank);
  // Every rank's output becomes every rank's input, in rank order (an
  // allgather tensor: its spec's shape is [world size, input shape...]).
  // An alltoall tensor's step is enqueued the same way (neither takes
  // attributes): rank s's input block d becomes rank d's output block s.
  absl::StatusOr<std::shared_ptr<Handle>> AllgatherAsync(const Tensor& tensor,
                                                         int64_t step);

  // Waits until the job runs a generation newer than `after` and returns it;
  // rank() and size() describe it then. After a failed operation pass the
  // failed handle's generation(): the next generation may already have
  // arrived by the time the failure is handled.
  // DEADLINE_EXCEEDED when none comes in time; the stream's error when the
  // agent ended the session.
  absl::StatusOr<int64_t> WaitForGeneration(int64_t after,
                                            std::chrono::milliseconds timeout);
  // Whether nodes wait to join the generation this client is in: they are
  // admitted when a trainer reaches a commit and calls AdmitJoins (or after
  // the coordinator's --join_wait_ms).
  bool JoinPending() const;
  // Asks for the waiting nodes to be admitted now: the generation ends, and
  // the next one includes them.
  absl::Status AdmitJoins();
  // Fences the operations started from now on to `generation`: one the
  // agent takes while the job is in another generation fails at once
  // (ABORTED) instead of running there. 0 lifts the fence.
  void Fence(int64_t generation);

  // Leaves the job (finished = training is done here) and waits up to
  // `timeout` for the agent to close the session, so the detach is known to
  // have arrived. Pending handles then fail with the closed session's error.
  absl::Status Detach(bool finished, std::chrono::milliseconds timeout =
                                         std::chrono::seconds(10));

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton
