#include "agent/transport/nccl/nccl_communicator.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton::agent {
namespace {

// PollUntilDone: calls that only yield before the first sleep, and the
// sleeps' first and longest length. NCCL collectives on small buffers take
// tens of microseconds; long ones are polled at most every millisecond.
constexpr int kYieldingPolls = 200;
constexpr absl::Duration kFirstSleep = absl::Microseconds(20);
constexpr absl::Duration kLongestSleep = absl::Milliseconds(1);

struct NcclType {
  gpu::NcclDataType type;
  size_t element_size;
};

// NCCL's type for `dtype`, or INVALID_ARGUMENT.
absl::StatusOr<NcclType> ToNcclType(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return NcclType{gpu::NcclDataType::kFloat32, 4};
    case v1::DATA_TYPE_FLOAT64:
      return NcclType{gpu::NcclDataType::kFloat64, 8};
    case v1::DATA_TYPE_FLOAT16:
      return NcclType{gpu::NcclDataType::kFloat16, 2};
    case v1::DATA_TYPE_BFLOAT16:
      return NcclType{gpu::NcclDataType::kBfloat16, 2};
    case v1::DATA_TYPE_INT32:
      return NcclType{gpu::NcclDataType::kInt32, 4};
    case v1::DATA_TYPE_INT64:
      return NcclType{gpu::NcclDataType::kInt64, 8};
    case v1::DATA_TYPE_UINT8:
      return NcclType{gpu::NcclDataType::kUint8, 1};
    case v1::DATA_TYPE_INT8:
      return NcclType{gpu::NcclDataType::kInt8, 1};
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported data type ", DataTypeName(dtype),
          " on a GPU: give float32, float64, float16, bfloat16, int32, "
          "int64, uint8 or int8 (NCCL has no int16: use a host tensor)"));
  }
}

gpu::NcclRedOp ToNcclOp(DeviceReduceOp op) {
  switch (op) {
    case DeviceReduceOp::kAverage:
      return gpu::NcclRedOp::kAvg;
    case DeviceReduceOp::kMin:
      return gpu::NcclRedOp::kMin;
    case DeviceReduceOp::kMax:
      return gpu::NcclRedOp::kMax;
    case DeviceReduceOp::kProduct:
      return gpu::NcclRedOp::kProd;
    case DeviceReduceOp::kSum:
      break;
  }
  return gpu::NcclRedOp::kSum;
}

// "1 device" / "2 devices".
std::string Devices(int count) {
  return absl::StrCat(count, count == 1 ? " device" : " devices");
}

}  // namespace

void ReleaseLocalRanks(gpu::GpuApi& api, std::vector<NcclLocalRank>& ranks) {
  for (NcclLocalRank& rank : ranks) {
    if (rank.comm != nullptr) api.CommAbort(rank.comm);
    rank.comm = nullptr;
  }
  for (NcclLocalRank& rank : ranks) {
    if (rank.device >= 0) api.SetDevice(rank.device);
    if (rank.done != nullptr) api.EventDestroy(rank.done);
    if (rank.stream != nullptr) api.StreamDestroy(rank.stream);
    rank.done = nullptr;
    rank.stream = nullptr;
  }
}

absl::Status PollUntilDone(Clock& clock, absl::Time deadline, absl::Mutex& mu,
                           const bool* stop,
                           absl::FunctionRef<absl::StatusOr<bool>()> poll) {
  absl::Duration sleep = kFirstSleep;
  for (int polls = 0;; ++polls) {
    {
      absl::MutexLock lock(&mu);
      if (stop != nullptr && *stop) return absl::AbortedError("");
    }
    const absl::StatusOr<bool> done = poll();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    const absl::Duration left = deadline - clock.Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("");
    if (polls < kYieldingPolls) {
      std::this_thread::yield();
      continue;
    }
    absl::MutexLock lock(&mu);
    const auto stopped = [stop] { return stop != nullptr && *stop; };
    mu.AwaitWithTimeout(absl::Condition(&stopped), std::min(sleep, left));
    sleep = std::min(2 * sleep, kLongestSleep);
  }
}

absl::Status NcclError(gpu::GpuApi& api, const std::string& what,
                       gpu::NcclResult result, gpu::NcclComm comm) {
  std::string text = absl::StrCat(what, " failed: ", api.NcclErrorText(result));
  const std::string last = api.NcclLastError(comm);
  if (!last.empty()) absl::StrAppend(&text, ": ", last);
  return absl::UnavailableError(text);
}

absl::Status CudaError(gpu::GpuApi& api, const std::string& what, int device,
                       gpu::CudaError error) {
  return absl::UnavailableError(absl::StrCat(
      what, " on CUDA device ", device, " failed: ", api.CudaErrorText(error)));
}

absl::StatusOr<bool> NcclStatesSettled(gpu::GpuApi& api,
                                       absl::Span<const NcclLocalRank> ranks,
                                       const std::string& what) {
  bool settled = true;
  for (const NcclLocalRank& rank : ranks) {
    gpu::NcclResult state = gpu::NcclResult::kSuccess;
    const gpu::NcclResult result = api.CommGetAsyncError(rank.comm, &state);
    if (result != gpu::NcclResult::kSuccess) {
      return NcclError(api, absl::StrCat(what, ": ncclCommGetAsyncError"),
                       result, rank.comm);
    }
    if (state == gpu::NcclResult::kInProgress) {
      settled = false;
    } else if (state != gpu::NcclResult::kSuccess) {
      return NcclError(api, absl::StrCat(what, " on CUDA device ", rank.device),
                       state, rank.comm);
    }
  }
  return settled;
}

NcclCommunicator::NcclCommunicator(gpu::GpuApi* api, Clock* clock,
                                   std::string name, int node_rank,
                                   int num_nodes,
                                   std::vector<NcclLocalRank> ranks)
    : api_(api),
      clock_(clock),
      name_(std::move(name)),
      node_rank_(node_rank),
      num_nodes_(num_nodes),
      ranks_(std::move(ranks)) {}

NcclCommunicator::~NcclCommunicator() { ReleaseLocalRanks(*api_, ranks_); }

std::string NcclCommunicator::Describe() const {
  return absl::StrCat("NCCL communicator ", name_, " of ", num_nodes_,
                      num_nodes_ == 1 ? " node x " : " nodes x ",
                      Devices(local_devices()), " (node rank ", node_rank_,
                      ")");
}

absl::Status NcclCommunicator::PoisonedError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("communicator poisoned by ", poison_.ToString(),
                   "; build a new communicator"));
}

void NcclCommunicator::PoisonLocked(const absl::Status& status) {
  if (poisoned()) return;  // the first reason stays
  poison_ = status;
  poisoned_.store(true, std::memory_order_release);
}

void NcclCommunicator::AbortRanksLocked() {
  if (ranks_aborted_) return;
  ranks_aborted_ = true;
  for (NcclLocalRank& rank : ranks_) {
    if (rank.comm != nullptr) api_->CommAbort(rank.comm);
    rank.comm = nullptr;
  }
}

void NcclCommunicator::Abort(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!abort_requested_) {
    abort_requested_ = true;
    abort_reason_ = status;
  }
  PoisonLocked(absl::AbortedError(
      absl::StrCat(Describe(), " aborted: ", status.message())));
  // With a collective in flight its thread owns the handles: it sees
  // abort_requested_ at once and aborts them itself.
  if (!in_flight_) AbortRanksLocked();
}

absl::Status NcclCommunicator::CheckCall(
    const std::string& what, absl::Span<void* const> buffers,
    std::optional<int> root, const CollectiveOptions& options) const {
  if (poisoned()) {
    absl::MutexLock lock(&mu_);
    return PoisonedError();
  }
  if (options.timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CollectiveOptions.timeout is ", options.timeout.count(),
                     " ms on ", Describe(), ": give a positive timeout"));
  }
  if (buffers.size() != ranks_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " on ", Describe(), ": ", buffers.size(),
        " buffer(s) given; give one per local device (", ranks_.size(), ")"));
  }
  if (root.has_value() && (*root < 0 || *root >= world_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " on ", Describe(), ": root ", *root,
                     " is not a rank (0..", world_size() - 1, ")"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CheckBuffers(
    const std::string& what, absl::Span<void* const> buffers) const {
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " on ", Describe(), ": the buffer of local device ", i,
          " (CUDA device ", ranks_[i].device, ") is null"));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Run(const std::string& what,
                                   const CollectiveOptions& options,
                                   Enqueue enqueue) {
  {
    absl::MutexLock lock(&mu_);
    if (poisoned()) return PoisonedError();
    in_flight_ = true;
  }
  absl::Status status = Launch(what, enqueue);
  if (status.ok()) status = AwaitCompletion(what, options);
  absl::MutexLock lock(&mu_);
  in_flight_ = false;
  if (!status.ok()) PoisonLocked(status);
  // An Abort() during the collective left the handles to this thread.
  if (!status.ok() || abort_requested_) AbortRanksLocked();
  return status;
}

absl::Status NcclCommunicator::Launch(const std::string& what,
                                      Enqueue enqueue) {
  const std::string where = absl::StrCat(what, " on ", Describe());
  gpu::NcclResult result = api_->GroupStart();
  if (result != gpu::NcclResult::kSuccess) {
    return NcclError(*api_, absl::StrCat(where, ": ncclGroupStart"), result,
                     nullptr);
  }
  absl::Status status;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    result = enqueue(ranks_[i], static_cast<int>(i));
    if (result != gpu::NcclResult::kSuccess &&
        result != gpu::NcclResult::kInProgress && status.ok()) {
      status = NcclError(
          *api_,
          absl::StrCat(where, ": enqueueing on CUDA device ", ranks_[i].device),
          result, ranks_[i].comm);
    }
  }
  // The group is closed even after an error, or this thread's next NCCL
  // call would still be inside it.
  result = api_->GroupEnd();
  if (result != gpu::NcclResult::kSuccess &&
      result != gpu::NcclResult::kInProgress && status.ok()) {
    status = NcclError(*api_, absl::StrCat(where, ": ncclGroupEnd"), result,
                       ranks_.front().comm);
  }
  return status;
}

absl::Status NcclCommunicator::AwaitCompletion(
    const std::string& what, const CollectiveOptions& options) {
  const std::string where = absl::StrCat(what, " on ", Describe());
  const absl::Time deadline = clock_->Now() + absl::FromChrono(options.timeout);
  // Until every rank's state leaves kInProgress, the work may not be on the
  // streams yet; an event recorded earlier would complete too soon. Then
  // the events say when the work is done, and the states whether it failed.
  std::vector<bool> finished(ranks_.size(), false);
  bool launched = false;
  const absl::Status status = PollUntilDone(
      *clock_, deadline, mu_, &abort_requested_, [&]() -> absl::StatusOr<bool> {
        const absl::StatusOr<bool> settled =
            NcclStatesSettled(*api_, ranks_, where);
        if (!settled.ok() || !*settled) return settled;
        if (!launched) {
          for (const NcclLocalRank& rank : ranks_) {
            const gpu::CudaError error =
                api_->EventRecord(rank.done, rank.stream);
            if (error != gpu::kCudaSuccess) {
              return CudaError(*api_, absl::StrCat(where, ": cudaEventRecord"),
                               rank.device, error);
            }
          }
          launched = true;
        }
        bool all = true;
        for (size_t i = 0; i < ranks_.size(); ++i) {
          if (finished[i]) continue;
          const gpu::CudaError error = api_->EventQuery(ranks_[i].done);
          if (error == gpu::kCudaSuccess) {
            finished[i] = true;
          } else if (error == gpu::kCudaErrorNotReady) {
            all = false;
          } else {
            return CudaError(*api_, where, ranks_[i].device, error);
          }
        }
        if (!all) return false;
        // An error NCCL raised while the work ended (a peer gone) is set
        // before the work completes: look once more.
        return NcclStatesSettled(*api_, ranks_, where);
      });
  if (status.ok() || !status.message().empty()) return status;
  if (status.code() == absl::StatusCode::kAborted) {
    absl::MutexLock lock(&mu_);
    return absl::AbortedError(
        absl::StrCat(where, " aborted: ", abort_reason_.message()));
  }
  std::vector<int> pending;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (!finished[i]) pending.push_back(ranks_[i].device);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      where, " timed out after ", options.timeout.count(),
      " ms: CUDA device(s) ", absl::StrJoin(pending, ", "),
      " had not finished (a peer is missing or stuck; NCCL_DEBUG=WARN on "
      "every node shows NCCL's view); the communicator is aborted"));
}

absl::Status NcclCommunicator::Reduction(absl::Span<void* const> buffers,
                                         size_t count, v1::DataType dtype,
                                         DeviceReduceOp op,
                                         std::optional<int> root,
                                         const CollectiveOptions& options) {
  const std::string what = absl::StrCat(
      root.has_value() ? "reduce" : "allreduce", " (", DeviceReduceOpName(op),
      ") of ", count, " ", DataTypeName(dtype),
      root.has_value() ? absl::StrCat(" to rank ", *root) : "");
  if (absl::Status s = CheckCall(what, buffers, root, options); !s.ok()) {
    return s;
  }
  const absl::StatusOr<NcclType> type = ToNcclType(dtype);
  if (!type.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " on ", Describe(), ": ", type.status().message()));
  }
  if (count == 0) return absl::OkStatus();
  if (absl::Status s = CheckBuffers(what, buffers); !s.ok()) return s;
  if (count > std::numeric_limits<size_t>::max() / type->element_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " on ", Describe(), ": the size overflows"));
  }
  return Run(what, options, [&](const NcclLocalRank& rank, int i) {
    if (!root.has_value()) {
      return api_->AllReduce(buffers[i], buffers[i], count, type->type,
                             ToNcclOp(op), rank.comm, rank.stream);
    }
    return api_->Reduce(buffers[i], buffers[i], count, type->type, ToNcclOp(op),
                        *root, rank.comm, rank.stream);
  });
}

absl::Status NcclCommunicator::DeviceAllreduce(
    absl::Span<void* const> buffers, size_t count, v1::DataType dtype,
    DeviceReduceOp op, const CollectiveOptions& options) {
  return Reduction(buffers, count, dtype, op, std::nullopt, options);
}

absl::Status NcclCommunicator::DeviceReduce(absl::Span<void* const> buffers,
                                            size_t count, v1::DataType dtype,
                                            DeviceReduceOp op, int root,
                                            const CollectiveOptions& options) {
  return Reduction(buffers, count, dtype, op, root, options);
}

absl::Status NcclCommunicator::DeviceBroadcast(
    absl::Span<void* const> buffers, size_t bytes, int root,
    const CollectiveOptions& options) {
  const std::string what =
      absl::StrCat("broadcast of ", bytes, " bytes from rank ", root);
  if (absl::Status s = CheckCall(what, buffers, root, options); !s.ok()) {
    return s;
  }
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = CheckBuffers(what, buffers); !s.ok()) return s;
  return Run(what, options, [&](const NcclLocalRank& rank, int i) {
    return api_->Broadcast(buffers[i], buffers[i], bytes,
                           gpu::NcclDataType::kUint8, root, rank.comm,
                           rank.stream);
  });
}

absl::Status NcclCommunicator::Allreduce(void* data, size_t count,
                                         v1::DataType dtype,
                                         const CollectiveOptions& options) {
  if (local_devices() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("allreduce with one buffer on ", Describe(),
                     ": this node drives ", Devices(local_devices()),
                     "; use DeviceAllreduce with one buffer per device"));
  }
  if (options.divisor != 1 && options.divisor != size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce on ", Describe(), ": CollectiveOptions.divisor ",
        options.divisor, " is neither 1 nor the group's ", size(),
        " ranks (NCCL averages over the group only)"));
  }
  const void* input = options.input == nullptr ? data : options.input;
  if (input != data) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce on ", Describe(),
        ": CollectiveOptions.input is for host communicators; NCCL "
        "collectives run in place"));
  }
  return DeviceAllreduce(
      {data}, count, dtype,
      options.divisor == 1 ? DeviceReduceOp::kSum : DeviceReduceOp::kAverage,
      options);
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root,
                                         const CollectiveOptions& options) {
  if (local_devices() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("broadcast with one buffer on ", Describe(),
                     ": this node drives ", Devices(local_devices()),
                     "; use DeviceBroadcast with one buffer per device"));
  }
  if (root < 0 || root >= num_nodes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast on ", Describe(), ": root ", root,
                     " is not a node rank (0..", num_nodes_ - 1, ")"));
  }
  return DeviceBroadcast({data}, bytes, root, options);
}

}  // namespace baton::agent
