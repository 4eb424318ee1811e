#pragma once

// The trainer-facing API: named tensors in the user's own memory, Horovod /
// BytePS style. A Session sits on a Client (client.h): it declares a tensor
// the first time its name is used, copies the user's bytes into the tensor's
// shared-memory input, counts steps per tensor, and copies the result back
// into the user's buffer when the operation is synchronized. A CUDA tensor
// (DeviceBuffer) stays in the caller's device memory instead: the agent
// reads and writes it in place through CUDA IPC.
//
//   auto session = baton::Session::Init();          // from the environment
//   baton::Buffer grad{data, baton::v1::DATA_TYPE_FLOAT32, {1024}};
//   auto handle = (*session)->PushPullAsync("Gradient.w", grad, true);
//   ... // overlap other work
//   absl::Status s = (*session)->Synchronize(*handle);  // grad holds the mean
//   (*session)->Shutdown();

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/client.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/trainer.pb.h"

namespace baton {

// Host memory owned by the caller: `shape`'s elements of `dtype`, dense,
// starting at `data`. It must stay valid until the operation using it is
// synchronized.
struct Buffer {
  void* data = nullptr;
  v1::DataType dtype = v1::DATA_TYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
};

// A tensor in CUDA device memory owned by the caller, shared with the agent
// through CUDA IPC (the agent must run on the same host, in the same IPC
// namespace, and see the device). The client library links no CUDA: the
// caller takes the handles from its CUDA runtime, and keeps the allocation
// and the event alive until the session is shut down.
//
// Before each operation on it the caller writes the input into the buffer
// and records the event on the stream that wrote it; the agent reads the
// input once the event has passed and writes the result over it, in place,
// before the operation completes. Nothing is copied through host memory.
struct DeviceBuffer {
  v1::DataType dtype = v1::DATA_TYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  // cudaIpcMemHandle_t (64 bytes) of the allocation holding the tensor, and
  // the tensor's first byte within that allocation.
  std::string memory_handle;
  int64_t offset = 0;
  // cudaIpcEventHandle_t (64 bytes) of an event created with
  // cudaEventInterprocess | cudaEventDisableTiming on the tensor's device.
  std::string event_handle;
  // The device as cudaDeviceGetPCIBusId names it ("0000:3b:00.0"), or ""
  // for the agent to find it from the memory.
  std::string pci_bus_id;
};

// A declared host tensor's shared memory on this node: this trainer's input
// region (input_bytes) and the result region (size_bytes; the same but for
// an allgather, whose result holds every rank's input) (Session::Regions).
struct HostRegions {
  uint8_t* input = nullptr;
  const uint8_t* output = nullptr;
  int64_t size_bytes = 0;
  int64_t input_bytes = 0;
};

// Bytes of one element of `dtype`; 0 for DATA_TYPE_UNSPECIFIED or unknown.
int64_t ElementSize(v1::DataType dtype);

// An asynchronous push-pull or broadcast started by a Session. Poll and
// Synchronize it through the Session that started it.
class Operation;
using OperationHandle = std::shared_ptr<Operation>;

// One trainer's session with baton. Thread-safe: the training thread may
// enqueue while another thread synchronizes.
//
// Tensor names are unique within a job and bind a name to one dtype, shape,
// collective (push-pull, broadcast, allgather or reduce-scatter) and kind of
// memory (host or CUDA, the same on every rank) for the job's lifetime; a CUDA
// tensor also keeps its buffer. Every rank must start the operations on a name
// in the same order; a name has at most one operation in flight per trainer
// (synchronize it before starting the next).
class Session {
 public:
  // Attaches to this node's agent and waits until the job is formed.
  static absl::StatusOr<std::unique_ptr<Session>> Init(
      const ClientOptions& options);
  // Options from the environment (ClientOptions::FromEnvironment). RANK and
  // WORLD_SIZE, when a launcher sets them, are checked against what the
  // job assigns.
  static absl::StatusOr<std::unique_ptr<Session>> Init();

  // RANK and WORLD_SIZE, when a launcher set them (torchrun, batonrun),
  // against what the job assigned: FAILED_PRECONDITION naming the variable
  // when they differ, INVALID_ARGUMENT when one is not an integer; the
  // session is then shut down. Init() checks it; a caller of
  // Init(ClientOptions) with options from the environment should too.
  absl::Status CheckLauncherEnvironment();

  // Shuts down with a short drain (Shutdown(std::chrono::seconds(10))) if
  // Shutdown was not called.
  ~Session();

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int32_t rank() const;
  int32_t size() const;
  int32_t local_rank() const;
  int32_t local_size() const;

  // Elastic training (baton.torch.elastic builds on these). The job's
  // generation this session knows: rank() and size() describe it. A node
  // lost or joined re-forms the job into a new generation, with new ranks
  // and a new size; operations of the old one fail with ABORTED.
  int64_t generation() const;
  // Waits until the job runs a generation newer than `after` and returns
  // it. DEADLINE_EXCEEDED when none comes within `timeout`; the agent's
  // error when the job failed meanwhile (too few nodes left).
  absl::StatusOr<int64_t> WaitForGeneration(int64_t after,
                                            std::chrono::milliseconds timeout);
  // Operations started from now on run only in `generation`: one the agent
  // takes after the job re-formed fails with ABORTED instead of running in
  // a generation this trainer has not synchronized in. 0 lifts the fence.
  void FenceGeneration(int64_t generation);
  // Whether nodes wait to join the running generation (a replacement, or
  // growth): they are admitted when a trainer reaches a commit and calls
  // AdmitJoins, which ends the generation there; the coordinator admits
  // them itself after its --join_wait_ms.
  bool JoinPending() const;
  absl::Status AdmitJoins();
  // The highest step any tensor's next operation takes (at least the step
  // floor). Names that start with "baton." are baton's own: not counted.
  int64_t NextStep() const;
  // Raises every tensor's next step to at least `floor`, also for names
  // first used later (names starting with "baton." aside). After a re-form
  // the ranks agree on a floor (the highest NextStep of any rank), so a
  // node that joined and the survivors take the same steps.
  void SetStepFloor(int64_t floor);

  // Declares tensors ahead of use (one round trip for all of them; the
  // declaration order is the default priority: first declared = most
  // urgent). Declaring a name again with the same spec (and CUDA buffer) is
  // a no-op; with a different one, INVALID_ARGUMENT.
  //
  // Specs whose memory is MEMORY_KIND_CUDA take exactly one of
  // `cuda_buffers` each (CudaBuffer.index = the spec's position in `specs`);
  // host specs take none. INVALID_ARGUMENT names the tensor and the field
  // when they do not fit (a handle that is not 64 bytes, a negative offset,
  // a missing or extra buffer); an agent without a GPU transport refuses
  // CUDA tensors with FAILED_PRECONDITION.
  absl::Status DeclareTensors(
      const std::vector<v1::TensorSpec>& specs,
      const std::vector<v1::CudaBuffer>& cuda_buffers = {});
  absl::Status DeclareTensor(const std::string& name, v1::DataType dtype,
                             const std::vector<int64_t>& shape,
                             v1::CollectiveOp op);
  // A CUDA tensor.
  absl::Status DeclareTensor(const std::string& name,
                             const DeviceBuffer& buffer, v1::CollectiveOp op);

  // A declared host tensor's shared-memory regions, for callers that keep
  // their data there (the PyTorch optimizers let gradients accumulate in
  // the input region): an operation whose buffer is the input region copies
  // nothing in, and one whose output is the result region copies nothing
  // out. The agent only reads the input region; the result region holds
  // the last result until the next operation of the name completes. Valid
  // until the Session is destroyed. NOT_FOUND for a name not declared,
  // FAILED_PRECONDITION for a CUDA tensor.
  absl::StatusOr<HostRegions> Regions(const std::string& name) const;

  // Sum (average = false) or mean of `buffer` over every rank, written back
  // into `buffer` by Synchronize; with `op` its element-wise min, max,
  // product or bitwise and/or/xor instead (average only with a sum, the
  // bitwise ops on integer tensors only; every rank passes the same op, or
  // the operation fails on every rank naming both). Declares `name` as a
  // push-pull tensor on first use.
  absl::StatusOr<OperationHandle> PushPullAsync(
      const std::string& name, const Buffer& buffer, bool average,
      v1::ReduceOp op = v1::REDUCE_OP_SUM);
  // The same, with the result going to `output` (as many bytes as `buffer`
  // holds) instead of back into `buffer`. Either way the input is copied
  // before this returns, so `buffer` may be reused at once.
  absl::StatusOr<OperationHandle> PushPullAsync(
      const std::string& name, const Buffer& buffer, void* output, bool average,
      v1::ReduceOp op = v1::REDUCE_OP_SUM);
  // `root_rank`'s `buffer`, written into every rank's `buffer` by
  // Synchronize. Declares `name` as a broadcast tensor on first use.
  absl::StatusOr<OperationHandle> BroadcastAsync(const std::string& name,
                                                 const Buffer& buffer,
                                                 int32_t root_rank);

  // Every rank's `buffer`, stacked in rank order, written to `output` by
  // Synchronize: size() times the bytes of `buffer`, which every rank
  // gives with the same dtype and shape (or the operation fails on every
  // rank naming both). Declares `name` as an allgather tensor of shape
  // [size(), buffer's shape...] on first use, and anew when the job's world
  // size changed. The input is copied before this returns.
  absl::StatusOr<OperationHandle> AllgatherAsync(const std::string& name,
                                                 const Buffer& buffer,
                                                 void* output);

  // Reduce-scatter: `buffer` (the same dtype and shape on every rank, its
  // first dimension a multiple of size()) cut along its first dimension
  // into size() equal parts; rank r's `output` gets part r summed (or
  // averaged, or `op`) over every rank, written by Synchronize. Declares
  // `name` as a reduce-scatter tensor of shape [size(), rows / size(),
  // ...] on first use, and anew when the world size changed.
  absl::StatusOr<OperationHandle> ReduceScatterAsync(
      const std::string& name, const Buffer& buffer, void* output, bool average,
      v1::ReduceOp op = v1::REDUCE_OP_SUM);

  // All to all: `buffer` (the same dtype and shape on every rank, its first
  // dimension a multiple of size()) cut along its first dimension into
  // size() equal blocks; block d goes to rank d, and `output` (as many
  // bytes as `buffer`) gets block s of every rank s, in rank order, written
  // by Synchronize. Declares `name` as an alltoall tensor of shape [size(),
  // rows / size(), ...] on first use, and anew when the world size
  // changed. Uneven splits: pad each block to the largest (baton.torch's
  // alltoall does).
  absl::StatusOr<OperationHandle> AlltoallAsync(const std::string& name,
                                                const Buffer& buffer,
                                                void* output);

  // The same on a CUDA tensor, in place: record the buffer's event after
  // writing the input, then call these. Completion (Poll, Synchronize)
  // means the result is in the buffer; Synchronize copies nothing.
  // Declares `name` with this buffer on first use.
  absl::StatusOr<OperationHandle> PushPullAsync(
      const std::string& name, const DeviceBuffer& buffer, bool average,
      v1::ReduceOp op = v1::REDUCE_OP_SUM);
  absl::StatusOr<OperationHandle> BroadcastAsync(const std::string& name,
                                                 const DeviceBuffer& buffer,
                                                 int32_t root_rank);

  // True once the operation finished, either way.
  bool Poll(const OperationHandle& handle) const;
  // Waits for the operation and, when it succeeded, copies the result into
  // its buffer. DEADLINE_EXCEEDED when `timeout` passes first (the operation
  // stays in flight, StillInFlight says so; synchronize it again later). A
  // failed operation returns the error that names its cause: ABORTED when the
  // job's generation changed (a node was lost), UNAVAILABLE when the agent is
  // gone. Calling it again returns the same status and copies nothing.
  absl::Status Synchronize(
      const OperationHandle& handle,
      std::chrono::milliseconds timeout = std::chrono::hours(24));

  // PushPullAsync + Synchronize.
  absl::Status PushPull(const std::string& name, const Buffer& buffer,
                        bool average, v1::ReduceOp op = v1::REDUCE_OP_SUM);
  // BroadcastAsync + Synchronize.
  absl::Status Broadcast(const std::string& name, const Buffer& buffer,
                         int32_t root_rank);
  // ReduceScatterAsync + Synchronize.
  absl::Status ReduceScatter(const std::string& name, const Buffer& buffer,
                             void* output, bool average,
                             v1::ReduceOp op = v1::REDUCE_OP_SUM);
  // AllgatherAsync + Synchronize.
  absl::Status Allgather(const std::string& name, const Buffer& buffer,
                         void* output);
  // AlltoallAsync + Synchronize.
  absl::Status Alltoall(const std::string& name, const Buffer& buffer,
                        void* output);
  // The same on CUDA tensors.
  absl::Status PushPull(const std::string& name, const DeviceBuffer& buffer,
                        bool average, v1::ReduceOp op = v1::REDUCE_OP_SUM);
  absl::Status Broadcast(const std::string& name, const DeviceBuffer& buffer,
                         int32_t root_rank);
  // Broadcasts each buffer from `root_rank`, all in flight together, in the
  // given order, as tensors named "Parameter.<name>". Afterwards every rank
  // holds the root's bytes.
  absl::Status BroadcastParameters(
      const std::vector<std::pair<std::string, Buffer>>& params,
      int32_t root_rank);

  // Waits up to `drain_timeout` for every operation in flight, then leaves
  // the job as finished and closes the session. Operations still in flight
  // at the deadline fail with ABORTED, and so does the returned status
  // (naming how many). Later calls return FAILED_PRECONDITION; rank() and
  // size() stay readable.
  absl::Status Shutdown(
      std::chrono::milliseconds drain_timeout = std::chrono::seconds(60));

  class Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  // [size(), rows / size(), the rest of buffer's shape...], or
  // INVALID_ARGUMENT naming `what` of `name` when the rows do not split
  // into size() equal parts.
  absl::StatusOr<std::vector<int64_t>> RankStacked(const std::string& what,
                                                   const std::string& name,
                                                   const Buffer& buffer) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton
