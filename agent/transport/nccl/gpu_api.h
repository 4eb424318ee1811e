#pragma once

#include <array>
#include <cstddef>
#include <string>

// The seam between the NCCL transport and the CUDA runtime + NCCL: exactly
// the calls the transport (and its tests and benchmark) make, with CUDA's
// and NCCL's own error codes, and no CUDA header. The real implementation
// (cuda_nccl_api.cc) is the only file that includes <cuda_runtime_api.h> and
// <nccl.h>; tests run the transport against a fake that simulates devices,
// streams and NCCL ranks in host memory (tests/unit/agent/transport/).

namespace baton::agent::gpu {

// A cudaError_t value. The constants below are checked against the CUDA
// headers where the real implementation is compiled.
using CudaError = int;
inline constexpr CudaError kCudaSuccess = 0;
inline constexpr CudaError kCudaErrorInvalidValue = 1;
inline constexpr CudaError kCudaErrorInsufficientDriver = 35;
inline constexpr CudaError kCudaErrorNoDevice = 100;
inline constexpr CudaError kCudaErrorInvalidDevice = 101;
inline constexpr CudaError kCudaErrorNotReady = 600;

// ncclResult_t, same values.
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// The NCCL element types baton uses (ncclDataType_t has the same names).
enum class NcclDataType {
  kInt8,
  kUint8,
  kInt32,
  kInt64,
  kFloat16,
  kFloat32,
  kFloat64,
  kBfloat16,
};

// The NCCL reductions baton uses: ncclSum, ncclAvg (the sum divided by the
// number of ranks; integer types truncate), ncclMin, ncclMax, ncclProd.
enum class NcclRedOp { kSum, kAvg, kMin, kMax, kProd };

// Opaque handles: cudaStream_t, cudaEvent_t, ncclComm_t.
struct StreamHandle;
struct EventHandle;
struct NcclCommHandle;
using Stream = StreamHandle*;
using Event = EventHandle*;
using NcclComm = NcclCommHandle*;

// ncclUniqueId (NCCL_UNIQUE_ID_BYTES), cudaIpcMemHandle_t and
// cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE): plain bytes that travel
// between processes.
inline constexpr size_t kNcclUniqueIdBytes = 128;
inline constexpr size_t kCudaIpcHandleBytes = 64;
struct NcclUniqueId {
  std::array<char, kNcclUniqueIdBytes> bytes{};
};
struct IpcMemHandle {
  std::array<char, kCudaIpcHandleBytes> bytes{};
};
struct IpcEventHandle {
  std::array<char, kCudaIpcHandleBytes> bytes{};
};

// What cudaGetDeviceProperties says about a device, as far as baton shows it.
struct DeviceProperties {
  std::string name;
  size_t total_memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  // "0000:3b:00.0"
  std::string pci_bus_id;
};

// The CUDA runtime and NCCL calls, one method each, with the semantics of
// the call it names (see the CUDA runtime and NCCL documentation); only the
// differences are noted. Pointers are device pointers unless named `host`.
// Implementations are thread-safe as far as CUDA and NCCL are (the current
// device is per host thread).
class GpuApi {
 public:
  virtual ~GpuApi() = default;

  // --- CUDA runtime ---------------------------------------------------------
  virtual CudaError GetDeviceCount(int* count) = 0;
  virtual CudaError GetDeviceProperties(int device,
                                        DeviceProperties* properties) = 0;
  // CUDART_VERSION style: 13000 for 13.0; the driver's is 0 without one.
  virtual CudaError RuntimeGetVersion(int* version) = 0;
  virtual CudaError DriverGetVersion(int* version) = 0;
  virtual CudaError SetDevice(int device) = 0;
  // cudaStreamCreateWithFlags(cudaStreamNonBlocking) on the current device:
  // the stream never waits for the legacy default stream.
  virtual CudaError StreamCreate(Stream* stream) = 0;
  virtual CudaError StreamDestroy(Stream stream) = 0;
  virtual CudaError StreamSynchronize(Stream stream) = 0;
  // cudaEventCreateWithFlags(cudaEventDisableTiming) on the current device.
  virtual CudaError EventCreate(Event* event) = 0;
  // cudaEventCreateWithFlags(cudaEventInterprocess | cudaEventDisableTiming)
  // on the current device: an event IpcGetEventHandle can export (a
  // trainer's ready event).
  virtual CudaError EventCreateInterprocess(Event* event) = 0;
  virtual CudaError EventDestroy(Event event) = 0;
  virtual CudaError EventRecord(Event event, Stream stream) = 0;
  // kCudaSuccess when the work the event captured is done,
  // kCudaErrorNotReady while it is not, or an error.
  virtual CudaError EventQuery(Event event) = 0;
  virtual CudaError EventSynchronize(Event event) = 0;
  virtual CudaError StreamWaitEvent(Stream stream, Event event) = 0;
  // Another process's buffer and event (a trainer's tensor and its ready
  // event). Memory is opened with cudaIpcMemLazyEnablePeerAccess.
  virtual CudaError IpcOpenMemHandle(void** pointer,
                                     const IpcMemHandle& handle) = 0;
  virtual CudaError IpcCloseMemHandle(void* pointer) = 0;
  virtual CudaError IpcOpenEventHandle(Event* event,
                                       const IpcEventHandle& handle) = 0;
  // The trainer's side (the agent only opens; tests play trainers):
  // cudaIpcGetMemHandle of the base of an allocation Malloc returned, and
  // cudaIpcGetEventHandle of an event made by EventCreateInterprocess.
  virtual CudaError IpcGetMemHandle(IpcMemHandle* handle, void* pointer) = 0;
  virtual CudaError IpcGetEventHandle(IpcEventHandle* handle, Event event) = 0;
  // cudaPointerGetAttributes(...).device: the device the memory at `pointer`
  // physically resides on (for memory opened with IpcOpenMemHandle, whichever
  // device was current when it was opened). kCudaErrorInvalidValue for host
  // memory CUDA does not know (cudaMemoryTypeUnregistered).
  virtual CudaError PointerGetDevice(const void* pointer, int* device) = 0;
  // On the current device.
  virtual CudaError Malloc(void** pointer, size_t bytes) = 0;
  virtual CudaError Free(void* pointer) = 0;
  // cudaMemcpy(cudaMemcpyDefault): either side may be host or device.
  // Complete when it returns, also from pageable host memory to a device
  // (the real one then synchronizes the legacy default stream).
  virtual CudaError Memcpy(void* destination, const void* source,
                           size_t bytes) = 0;
  virtual CudaError Memset(void* pointer, int value, size_t bytes) = 0;
  // "invalid device ordinal (cudaErrorInvalidDevice)": cudaGetErrorString
  // and cudaGetErrorName together.
  virtual std::string CudaErrorText(CudaError error) = 0;

  // --- NCCL -----------------------------------------------------------------
  virtual NcclResult GetVersion(int* version) = 0;
  virtual NcclResult GetUniqueId(NcclUniqueId* id) = 0;
  // ncclCommInitRankConfig with config.blocking = 0 on the current device:
  // returns kInProgress (or kSuccess) at once; the communicator is usable
  // when CommGetAsyncError says kSuccess, and CommAbort ends a pending
  // initialization. Every call on such a communicator, ncclGroupEnd
  // included, may return kInProgress: the work is enqueued on the streams
  // only once CommGetAsyncError says kSuccess.
  virtual NcclResult CommInitRankNonBlocking(NcclComm* comm, int ranks,
                                             const NcclUniqueId& id,
                                             int rank) = 0;
  virtual NcclResult AllReduce(const void* send, void* receive, size_t count,
                               NcclDataType type, NcclRedOp op, NcclComm comm,
                               Stream stream) = 0;
  virtual NcclResult Broadcast(const void* send, void* receive, size_t count,
                               NcclDataType type, int root, NcclComm comm,
                               Stream stream) = 0;
  virtual NcclResult Reduce(const void* send, void* receive, size_t count,
                            NcclDataType type, NcclRedOp op, int root,
                            NcclComm comm, Stream stream) = 0;
  virtual NcclResult GroupStart() = 0;
  virtual NcclResult GroupEnd() = 0;
  virtual NcclResult CommGetAsyncError(NcclComm comm, NcclResult* state) = 0;
  // Frees the communicator without waiting for its peers; operations in
  // flight on it end. The handle is invalid afterwards.
  virtual NcclResult CommAbort(NcclComm comm) = 0;
  // ncclGetErrorString.
  virtual std::string NcclErrorText(NcclResult result) = 0;
  // ncclGetLastError: NCCL's own account of its last error (may be empty).
  virtual std::string NcclLastError(NcclComm comm) = 0;
};

}  // namespace baton::agent::gpu
