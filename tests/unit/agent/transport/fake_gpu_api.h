#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/transport/nccl/gpu_api.h"

namespace baton::agent {

class FakeGpuApi;

// What the fake nodes of one test share: NCCL groups (found by unique id)
// and one mutex, under which every fake call, stream task and collective
// runs. Create one per test and give it to every FakeGpuApi.
//
// Thread-safe.
class FakeNcclFabric {
 public:
  FakeNcclFabric();
  ~FakeNcclFabric();

 private:
  friend class FakeGpuApi;
  // One collective of a group, while its ranks arrive.
  struct Pending {
    int kind = 0;
    size_t count = 0;
    gpu::NcclDataType type = gpu::NcclDataType::kUint8;
    gpu::NcclRedOp op = gpu::NcclRedOp::kSum;
    int root = 0;
    std::vector<const void*> send;
    std::vector<void*> receive;
    int arrived = 0;
    int departed = 0;
    bool done = false;
  };

  // One NCCL group: its members by rank and the collectives under way, by
  // sequence number (every rank numbers its collectives 0, 1, 2, ...).
  struct Group {
    struct Member {
      const void* api = nullptr;
      int device = -1;
      bool joined = false;
    };

    explicit Group(int ranks) : members(ranks) {}

    std::vector<Member> members;
    int joined = 0;
    std::map<int64_t, Pending> collectives;
  };

  absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
};

// A GpuApi whose devices are host memory and whose NCCL ranks are threads of
// this process, for the NCCL transport's unit tests. One FakeGpuApi is one
// node's view of its GPUs.
//
// - Device memory comes from Malloc and is host memory: tests read and
//   write it directly. Collectives check that each buffer is memory of the
//   communicator's device, large enough.
// - Each stream is a thread running its tasks in order; events and
//   StreamWaitEvent follow CUDA's rules. HoldStream stands for a kernel
//   that is still running.
// - CUDA IPC: ExportMemory and ExportEvent are the trainer's side
//   (cudaIpcGetMemHandle, cudaIpcGetEventHandle), as if another process on
//   the node had called them; IpcGetMemHandle and IpcGetEventHandle are the
//   same through the seam (an error where they record a misuse), and
//   EventCreateInterprocess is EventCreate. IpcOpenMemHandle maps the
//   allocation at its own address (the fake has one address space);
//   PointerGetDevice names the device the allocation was made on, whichever
//   device opened it. An event opened with IpcOpenEventHandle is a new event
//   that follows the exported one's records.
// - NCCL communicators are non-blocking like the real ones: an initialization
//   completes (CommGetAsyncError says kSuccess) once every rank of the group
//   has called CommInitRankNonBlocking; after ncclGroupEnd the work reaches
//   the streams only on the next CommGetAsyncError, which says kInProgress
//   that once. A collective really reduces or copies every rank's buffer
//   once all ranks' stream tasks have arrived; until then they wait, so a
//   missing peer is a hang, ended only by CommAbort.
// - Mistakes a real CUDA or NCCL would punish (a call on an aborted
//   communicator, a collective while the communicator is not ready, a
//   buffer on the wrong device, closing memory IpcOpenMemHandle did not
//   return) return an error and are recorded in misuses(). The fake is
//   stricter than CUDA 13 in two ways that baton relies on not needing:
//   opening a handle that is open already (CUDA counts references; older
//   CUDA refused) and closing a mapping with another device current than
//   the one it was opened on are misuses too.
//
// Thread-safe.
class FakeGpuApi : public gpu::GpuApi {
 public:
  struct Options {
    int devices = 1;
    // What GetDeviceCount returns (the count is 0 unless it is success).
    gpu::CudaError device_count_error = gpu::kCudaSuccess;
  };

  FakeGpuApi(std::shared_ptr<FakeNcclFabric> fabric, Options options);
  // Aborts what is left, stops the streams' threads, frees the memory.
  ~FakeGpuApi() override;

  // --- Knobs and observations ----------------------------------------------
  // Collectives enqueued from now on never arrive: they wait until their
  // communicator is aborted (a stuck GPU or a peer that hangs).
  void HangCollectives(bool hang);
  // Collectives enqueued from now on fail on the stream with `error` as the
  // communicator's asynchronous error (kSuccess: none).
  void FailCollectives(gpu::NcclResult error);
  // CommInitRankNonBlocking from now on joins no group: the rank stays
  // kInProgress until aborted (a node that never reaches NCCL's bootstrap).
  void StallInitialization(bool stall);
  // Waits until `count` collectives of this node wait on their streams.
  void AwaitWaitingCollectives(int count);
  // Work enqueued on `stream` from now on waits, like work behind a kernel
  // that is still running, until ReleaseStream(stream).
  void HoldStream(gpu::Stream stream);
  void ReleaseStream(gpu::Stream stream);
  // Memcpy fails with `error` from now on (kCudaSuccess: never).
  void FailMemcpy(gpu::CudaError error);
  // The trainer's side of CUDA IPC: the handle of the allocation Malloc
  // returned as `base` (cudaIpcGetMemHandle), and of a live event
  // (cudaIpcGetEventHandle). The same allocation or event always gives the
  // same handle. A pointer that is no allocation's base, or an event that
  // is not live, is a misuse and gives a handle that opens nothing.
  gpu::IpcMemHandle ExportMemory(void* base);
  gpu::IpcEventHandle ExportEvent(gpu::Event event);
  // Live handles (created and not yet destroyed or aborted).
  int live_comms() const;
  int live_streams() const;
  int live_events() const;
  // Allocations opened with IpcOpenMemHandle and not yet closed, and how
  // many times IpcOpenMemHandle succeeded in all.
  int live_ipc_mappings() const;
  int ipc_opens() const;
  int aborted_comms() const;
  std::vector<std::string> misuses() const;

  // --- GpuApi --------------------------------------------------------------
  gpu::CudaError GetDeviceCount(int* count) override;
  gpu::CudaError GetDeviceProperties(
      int device, gpu::DeviceProperties* properties) override;
  gpu::CudaError RuntimeGetVersion(int* version) override;
  gpu::CudaError DriverGetVersion(int* version) override;
  gpu::CudaError SetDevice(int device) override;
  gpu::CudaError StreamCreate(gpu::Stream* stream) override;
  gpu::CudaError StreamDestroy(gpu::Stream stream) override;
  gpu::CudaError StreamSynchronize(gpu::Stream stream) override;
  gpu::CudaError EventCreate(gpu::Event* event) override;
  gpu::CudaError EventCreateInterprocess(gpu::Event* event) override;
  gpu::CudaError EventDestroy(gpu::Event event) override;
  gpu::CudaError EventRecord(gpu::Event event, gpu::Stream stream) override;
  gpu::CudaError EventQuery(gpu::Event event) override;
  gpu::CudaError EventSynchronize(gpu::Event event) override;
  gpu::CudaError StreamWaitEvent(gpu::Stream stream, gpu::Event event) override;
  gpu::CudaError IpcOpenMemHandle(void** pointer,
                                  const gpu::IpcMemHandle& handle) override;
  gpu::CudaError IpcCloseMemHandle(void* pointer) override;
  gpu::CudaError IpcOpenEventHandle(gpu::Event* event,
                                    const gpu::IpcEventHandle& handle) override;
  gpu::CudaError IpcGetMemHandle(gpu::IpcMemHandle* handle,
                                 void* pointer) override;
  gpu::CudaError IpcGetEventHandle(gpu::IpcEventHandle* handle,
                                   gpu::Event event) override;
  gpu::CudaError PointerGetDevice(const void* pointer, int* device) override;
  gpu::CudaError Malloc(void** pointer, size_t bytes) override;
  gpu::CudaError Free(void* pointer) override;
  gpu::CudaError Memcpy(void* destination, const void* source,
                        size_t bytes) override;
  gpu::CudaError Memset(void* pointer, int value, size_t bytes) override;
  std::string CudaErrorText(gpu::CudaError error) override;

  gpu::NcclResult GetVersion(int* version) override;
  gpu::NcclResult GetUniqueId(gpu::NcclUniqueId* id) override;
  gpu::NcclResult CommInitRankNonBlocking(gpu::NcclComm* comm, int ranks,
                                          const gpu::NcclUniqueId& id,
                                          int rank) override;
  gpu::NcclResult AllReduce(const void* send, void* receive, size_t count,
                            gpu::NcclDataType type, gpu::NcclRedOp op,
                            gpu::NcclComm comm, gpu::Stream stream) override;
  gpu::NcclResult Broadcast(const void* send, void* receive, size_t count,
                            gpu::NcclDataType type, int root,
                            gpu::NcclComm comm, gpu::Stream stream) override;
  gpu::NcclResult Reduce(const void* send, void* receive, size_t count,
                         gpu::NcclDataType type, gpu::NcclRedOp op, int root,
                         gpu::NcclComm comm, gpu::Stream stream) override;
  gpu::NcclResult GroupStart() override;
  gpu::NcclResult GroupEnd() override;
  gpu::NcclResult CommGetAsyncError(gpu::NcclComm comm,
                                    gpu::NcclResult* state) override;
  gpu::NcclResult CommAbort(gpu::NcclComm comm) override;
  std::string NcclErrorText(gpu::NcclResult result) override;
  std::string NcclLastError(gpu::NcclComm comm) override;

 private:
  struct Stream {
    int device = 0;
    std::deque<std::function<void()>> tasks;
    bool destroyed = false;
    // HoldStream calls, and how many of them ReleaseStream has ended.
    int64_t holds = 0;
    int64_t releases = 0;
    std::thread thread;
  };

  struct Event {
    int device = 0;
    int64_t recorded = 0;
    int64_t completed = 0;
    bool destroyed = false;
    // Opened with IpcOpenEventHandle: the exported event whose records and
    // completions this one shares (events are never freed before the fake).
    Event* exported = nullptr;
  };

  struct Allocation {
    int device;
    size_t bytes;
  };

  // The event whose records count for `event`: the exported one for an
  // event opened through IPC.
  static Event* Recorded(Event* event) {
    return event->exported != nullptr ? event->exported : event;
  }

  struct Comm {
    std::shared_ptr<FakeNcclFabric::Group> group;
    int rank = 0;
    int device = 0;
    bool joined = false;
    bool ready = false;
    bool aborted = false;
    gpu::NcclResult error = gpu::NcclResult::kSuccess;
    std::string last_error;
    int64_t next_sequence = 0;
    // Collectives after ncclGroupEnd, not yet on their streams.
    std::vector<std::pair<Stream*, std::function<void()>>> unlaunched;
  };

  struct Collective {
    enum Kind { kAllReduce, kBroadcast, kReduce };
    // What the caller asked for.
    Kind kind = kAllReduce;
    const void* send = nullptr;
    void* receive = nullptr;
    size_t count = 0;
    gpu::NcclDataType type = gpu::NcclDataType::kUint8;
    gpu::NcclRedOp op = gpu::NcclRedOp::kSum;
    int root = 0;
    // Filled in by Enqueue.
    Comm* comm = nullptr;
    Stream* stream = nullptr;
    int64_t sequence = 0;
    bool hang = false;
    gpu::NcclResult fail = gpu::NcclResult::kSuccess;
  };

  template <typename Handle, typename Object>
  static Handle ToHandle(Object* object) {
    return reinterpret_cast<Handle>(object);
  }

  // The result of a finished collective (kind: 0 allreduce, 1 broadcast,
  // 2 reduce), written into the ranks' buffers.
  static void Compute(FakeNcclFabric::Pending& p, int kind);
  // The task of one rank's part of a collective on its stream.
  void RunCollective(Comm* comm, const Collective& collective)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks and holds (in a group call) or readies a collective.
  gpu::NcclResult Enqueue(Collective collective, gpu::NcclComm comm,
                          gpu::Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // The live communicator `handle`, or null after recording a misuse.
  Comm* FindComm(gpu::NcclComm handle, const char* call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Stream* FindStream(gpu::Stream handle, const char* call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Event* FindEvent(gpu::Event handle, const char* call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether [pointer, pointer + bytes) is memory of `device`.
  bool IsDeviceMemory(const void* pointer, size_t bytes, int device) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The base of the allocation holding `pointer`, or null.
  const char* FindAllocation(const void* pointer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The export id in an IPC handle made by ExportMemory or ExportEvent
  // (`kind` 'm' or 'e'), or 0.
  static int64_t ExportId(
      const std::array<char, gpu::kCudaIpcHandleBytes>& bytes, char kind);
  static std::array<char, gpu::kCudaIpcHandleBytes> ExportHandle(int64_t id,
                                                                 char kind);
  int CurrentDevice() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Misuse(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Push(Stream* stream, std::function<void()> task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StreamLoop(Stream* stream);

  const std::shared_ptr<FakeNcclFabric> fabric_;
  const Options options_;
  absl::Mutex& mu_;

  std::map<std::thread::id, int> current_device_ ABSL_GUARDED_BY(mu_);
  std::map<const char*, Allocation> memory_ ABSL_GUARDED_BY(mu_);
  // IPC exports by id (ids count from 1), and the ids by what they export.
  int64_t next_export_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, const char*> exported_memory_ ABSL_GUARDED_BY(mu_);
  std::map<const char*, int64_t> memory_exports_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Event*> exported_events_ ABSL_GUARDED_BY(mu_);
  std::map<const Event*, int64_t> event_exports_ ABSL_GUARDED_BY(mu_);
  // Allocations open through IPC, by address: the device current when each
  // was opened.
  std::map<const char*, int> ipc_mappings_ ABSL_GUARDED_BY(mu_);
  int ipc_opens_ ABSL_GUARDED_BY(mu_) = 0;
  gpu::CudaError memcpy_error_ ABSL_GUARDED_BY(mu_) = gpu::kCudaSuccess;
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Event>> events_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Comm>> comms_ ABSL_GUARDED_BY(mu_);
  // Group calls in progress, per thread: depth and the collectives held.
  struct GroupCall {
    int depth = 0;
    bool had_calls = false;
    std::vector<Collective> held;
  };
  std::map<std::thread::id, GroupCall> group_calls_ ABSL_GUARDED_BY(mu_);
  bool hang_ ABSL_GUARDED_BY(mu_) = false;
  gpu::NcclResult fail_ ABSL_GUARDED_BY(mu_) = gpu::NcclResult::kSuccess;
  bool stall_init_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_collectives_ ABSL_GUARDED_BY(mu_) = 0;
  int aborted_comms_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> misuses_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::agent
