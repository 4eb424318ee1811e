#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "agent/transport/transport.h"
#include "baton/v1/common.pb.h"

namespace baton::agent {

// How a reduction combines the ranks' values.
enum class DeviceReduceOp {
  kSum,
  // The sum divided by the number of ranks (integer types truncate toward
  // zero, as torch's integer division for averages does).
  kAverage,
  kMin,
  kMax,
  kProduct,
};

// The device reduction of a push-pull's op (not average); kSum for the
// bitwise ops, which no device transport has (the agent refuses them on
// CUDA tensors before they reach one).
DeviceReduceOp DeviceReduceOpOf(v1::ReduceOp op);
// "sum", "average", "min", "max", "product".
const char* DeviceReduceOpName(DeviceReduceOp op);

// A Communicator over GPUs: one rank per GPU, several per node. Node `n`'s
// local device i is rank n x local_devices() + i, and every node drives the
// same number of devices.
//
// The Device* collectives take one device buffer per local device, in local
// order, each on its device; the call returns once every local device has
// its result (the result is in device memory, written on the transport's own
// streams, complete when the call returns OK).
//
// Contract of Communicator (one thread at a time calls the collectives; a
// failure poisons the communicator), read per node: rank() and size() are
// this node's rank and the number of nodes, and the Communicator
// collectives (one buffer) work when the node drives exactly one device,
// whose rank is then the node rank. Negotiation does not run on device
// communicators: it stays on a CPU communicator over host memory.
//
// Abort(), poisoned() and the accessors are thread-safe.
class DeviceCommunicator : public Communicator {
 public:
  // Devices this node drives, and all ranks of the group.
  virtual int local_devices() const = 0;
  virtual int world_size() const = 0;
  // The rank of this node's local device `local_index`.
  int device_rank(int local_index) const {
    return rank() * local_devices() + local_index;
  }

  // In place on every rank: buffers[i][j] = op over all ranks of element j.
  // FLOAT16 and BFLOAT16 are added in float32, rounded per addition.
  virtual absl::Status DeviceAllreduce(absl::Span<void* const> buffers,
                                       size_t count, v1::DataType dtype,
                                       DeviceReduceOp op,
                                       const CollectiveOptions& options) = 0;

  // The reduction lands only in the buffer of rank `root`; the other ranks'
  // buffers are left unchanged (they are inputs).
  virtual absl::Status DeviceReduce(absl::Span<void* const> buffers,
                                    size_t count, v1::DataType dtype,
                                    DeviceReduceOp op, int root,
                                    const CollectiveOptions& options) = 0;

  // Every rank's buffer gets rank `root`'s `bytes` bytes.
  virtual absl::Status DeviceBroadcast(absl::Span<void* const> buffers,
                                       size_t bytes, int root,
                                       const CollectiveOptions& options) = 0;

  // Ends this communicator from any thread (the generation changed): an
  // operation in flight returns ABORTED with `status`'s message promptly,
  // the underlying connections are torn down without waiting for peers, and
  // every later call returns FAILED_PRECONDITION. Idempotent; the first
  // reason is kept.
  void Abort(const absl::Status& status) override = 0;
};

// Builds DeviceCommunicators over a fixed list of this node's GPUs (the NCCL
// transport). Thread-safe.
class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;

  // request.count groups over every node's GPUs (every node drives the same
  // number); errors as Transport::Connect, and FAILED_PRECONDITION when the
  // nodes' device counts differ.
  virtual absl::StatusOr<std::vector<std::unique_ptr<DeviceCommunicator>>>
  ConnectDevices(const ConnectRequest& request) = 0;

  // A group of this node's GPUs only (the hierarchical path's local reduce
  // and broadcast).
  virtual absl::StatusOr<std::unique_ptr<DeviceCommunicator>> ConnectLocal(
      std::chrono::milliseconds timeout) = 0;
};

}  // namespace baton::agent
