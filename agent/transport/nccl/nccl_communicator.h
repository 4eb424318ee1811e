#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/transport/device_communicator.h"
#include "agent/transport/nccl/gpu_api.h"
#include "common/clock.h"

namespace baton::agent {

// What a node holds for one of its devices in one NCCL group: the CUDA
// ordinal, the NCCL communicator, the stream the collectives run on and the
// event that marks their completion. Null members are not created (yet).
struct NcclLocalRank {
  int device = -1;
  gpu::NcclComm comm = nullptr;
  gpu::Stream stream = nullptr;
  gpu::Event done = nullptr;
};

// Aborts the NCCL communicators of `ranks` (without waiting for peers) and
// destroys their events and streams; clears the handles. For Connect's
// error paths and the communicator's destructor.
void ReleaseLocalRanks(gpu::GpuApi& api, std::vector<NcclLocalRank>& ranks);

// Waits for GPU work without blocking inside CUDA or NCCL (a blocking call
// could not be abandoned): calls `poll` until it returns true or an error,
// yielding between calls at first and then sleeping 20 us, doubling up to
// 1 ms. Returns poll's error, DEADLINE_EXCEEDED once `clock` passes
// `deadline`, or ABORTED as soon as `*stop` is true (read under `mu`, which
// the caller does not hold; a writer of `*stop` holding `mu` wakes the wait).
// The errors other than poll's carry no message: the caller words them.
absl::Status PollUntilDone(Clock& clock, absl::Time deadline, absl::Mutex& mu,
                           const bool* stop,
                           absl::FunctionRef<absl::StatusOr<bool>()> poll)
    ABSL_LOCKS_EXCLUDED(mu);

// Whether every rank's NCCL state is kSuccess (false: some are still
// kInProgress), or the error of the first whose state is an error.
absl::StatusOr<bool> NcclStatesSettled(gpu::GpuApi& api,
                                       absl::Span<const NcclLocalRank> ranks,
                                       const std::string& what);

// The UNAVAILABLE error for a failed NCCL call: "<what> failed: <NCCL's
// text>: <ncclGetLastError>".
absl::Status NcclError(gpu::GpuApi& api, const std::string& what,
                       gpu::NcclResult result, gpu::NcclComm comm);
// The UNAVAILABLE error for a failed CUDA call on `device`.
absl::Status CudaError(gpu::GpuApi& api, const std::string& what, int device,
                       gpu::CudaError error);

// One NCCL group across nodes: one NCCL rank per local device, each with
// its own stream. Built by NcclTransport.
//
// Contract of DeviceCommunicator, plus:
// - Each collective is enqueued on every local device inside one
//   ncclGroupStart/End, then waited for by polling the devices' completion
//   events and NCCL's asynchronous error state, never by a blocking CUDA
//   call: CollectiveOptions::timeout bounds the whole operation, and
//   Abort() ends the wait at once. CollectiveOptions::tag is not used (one
//   operation at a time).
// - Errors: DEADLINE_EXCEEDED naming the local devices that had not
//   finished (a peer is missing or stuck), UNAVAILABLE for an NCCL or CUDA
//   error (NCCL's own text included), ABORTED after Abort(). Each aborts
//   every local NCCL communicator (ncclCommAbort, which never waits for
//   peers) and poisons this communicator. Invalid arguments are
//   INVALID_ARGUMENT and poison nothing.
// - The destructor aborts the NCCL communicators rather than destroying them:
//   ncclCommDestroy flushes outstanding work, which can wait for peers that
//   are gone, and a generation change must never hang.
class NcclCommunicator : public DeviceCommunicator {
 public:
  // `ranks` are initialized (their NCCL state is kSuccess) and each has a
  // stream and an event; the communicator owns them from now on. `name`
  // identifies it in errors ("c0"); `clock` outlives it.
  NcclCommunicator(gpu::GpuApi* api, Clock* clock, std::string name,
                   int node_rank, int num_nodes,
                   std::vector<NcclLocalRank> ranks);
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return node_rank_; }
  int size() const override { return num_nodes_; }
  int local_devices() const override { return static_cast<int>(ranks_.size()); }
  int world_size() const override { return num_nodes_ * local_devices(); }

  absl::Status DeviceAllreduce(absl::Span<void* const> buffers, size_t count,
                               v1::DataType dtype, DeviceReduceOp op,
                               const CollectiveOptions& options) override;
  absl::Status DeviceReduce(absl::Span<void* const> buffers, size_t count,
                            v1::DataType dtype, DeviceReduceOp op, int root,
                            const CollectiveOptions& options) override;
  absl::Status DeviceBroadcast(absl::Span<void* const> buffers, size_t bytes,
                               int root,
                               const CollectiveOptions& options) override;
  void Abort(const absl::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Allreduce(void* data, size_t count, v1::DataType dtype,
                         const CollectiveOptions& options) override;
  absl::Status Broadcast(void* data, size_t bytes, int root,
                         const CollectiveOptions& options) override;

  bool poisoned() const override {
    return poisoned_.load(std::memory_order_acquire);
  }

 private:
  // One rank's part of a collective: enqueues it on the rank's stream.
  using Enqueue =
      absl::FunctionRef<gpu::NcclResult(const NcclLocalRank&, int local_index)>;

  // FAILED_PRECONDITION when poisoned; INVALID_ARGUMENT for a bad timeout,
  // a number of buffers other than the local devices', or a root that is not
  // a rank.
  absl::Status CheckCall(const std::string& what,
                         absl::Span<void* const> buffers,
                         std::optional<int> root,
                         const CollectiveOptions& options) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // INVALID_ARGUMENT for a null buffer.
  absl::Status CheckBuffers(const std::string& what,
                            absl::Span<void* const> buffers) const;
  // DeviceReduce to `root`, or DeviceAllreduce without one.
  absl::Status Reduction(absl::Span<void* const> buffers, size_t count,
                         v1::DataType dtype, DeviceReduceOp op,
                         std::optional<int> root,
                         const CollectiveOptions& options);
  // Runs one collective: enqueues it on every local device, waits for it,
  // and on any error aborts the NCCL communicators and poisons this one.
  absl::Status Run(const std::string& what, const CollectiveOptions& options,
                   Enqueue enqueue) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Launch(const std::string& what, Enqueue enqueue);
  absl::Status AwaitCompletion(const std::string& what,
                               const CollectiveOptions& options)
      ABSL_LOCKS_EXCLUDED(mu_);
  // "NCCL communicator c0 of 2 nodes x 2 devices (node rank 0)".
  std::string Describe() const;
  absl::Status PoisonedError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PoisonLocked(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortRanksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  gpu::GpuApi* const api_;
  Clock* const clock_;
  const std::string name_;
  const int node_rank_;
  const int num_nodes_;

  std::atomic<bool> poisoned_{false};
  mutable absl::Mutex mu_;
  // The handles; aborted (and nulled) by AbortRanksLocked. Used without mu_
  // by the thread running a collective while in_flight_ is true: nobody
  // else touches them then.
  std::vector<NcclLocalRank> ranks_;
  bool ranks_aborted_ ABSL_GUARDED_BY(mu_) = false;
  // The error that poisoned this communicator.
  absl::Status poison_ ABSL_GUARDED_BY(mu_);
  // A collective is between its start and its end.
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  // Abort() was called; abort_reason_ is its status.
  bool abort_requested_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::agent
