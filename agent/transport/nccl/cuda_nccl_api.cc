// The only file that includes the CUDA runtime's and NCCL's headers.
#include "agent/transport/nccl/cuda_nccl_api.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#ifndef BATON_CUDA_LIBRARY_DIRS
#define BATON_CUDA_LIBRARY_DIRS ""
#endif

namespace baton::agent::gpu {
namespace {

static_assert(kCudaSuccess == cudaSuccess);
static_assert(kCudaErrorInvalidValue == cudaErrorInvalidValue);
static_assert(kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver);
static_assert(kCudaErrorNoDevice == cudaErrorNoDevice);
static_assert(kCudaErrorInvalidDevice == cudaErrorInvalidDevice);
static_assert(kCudaErrorNotReady == cudaErrorNotReady);
static_assert(static_cast<int>(NcclResult::kSuccess) == ncclSuccess);
static_assert(static_cast<int>(NcclResult::kUnhandledCudaError) ==
              ncclUnhandledCudaError);
static_assert(static_cast<int>(NcclResult::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclResult::kInternalError) ==
              ncclInternalError);
static_assert(static_cast<int>(NcclResult::kInvalidArgument) ==
              ncclInvalidArgument);
static_assert(static_cast<int>(NcclResult::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);
static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);
static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kCudaIpcHandleBytes);

// The entry points, each loaded by name into a pointer of its declared type.
// clang-format off
#define BATON_CUDART_SYMBOLS(X) \
  X(cudaGetDeviceCount)         \
  X(cudaGetDeviceProperties)    \
  X(cudaRuntimeGetVersion)      \
  X(cudaDriverGetVersion)       \
  X(cudaSetDevice)              \
  X(cudaStreamCreateWithFlags)  \
  X(cudaStreamDestroy)          \
  X(cudaStreamSynchronize)      \
  X(cudaEventCreateWithFlags)   \
  X(cudaEventDestroy)           \
  X(cudaEventRecord)            \
  X(cudaEventQuery)             \
  X(cudaEventSynchronize)       \
  X(cudaStreamWaitEvent)        \
  X(cudaIpcOpenMemHandle)       \
  X(cudaIpcCloseMemHandle)      \
  X(cudaIpcOpenEventHandle)     \
  X(cudaIpcGetMemHandle)        \
  X(cudaIpcGetEventHandle)      \
  X(cudaPointerGetAttributes)   \
  X(cudaFree)                   \
  X(cudaMemcpy)                 \
  X(cudaMemset)                 \
  X(cudaGetErrorString)         \
  X(cudaGetErrorName)

#define BATON_NCCL_SYMBOLS(X)   \
  X(ncclGetVersion)             \
  X(ncclGetUniqueId)            \
  X(ncclCommInitRankConfig)     \
  X(ncclAllReduce)              \
  X(ncclBroadcast)              \
  X(ncclReduce)                 \
  X(ncclGroupStart)             \
  X(ncclGroupEnd)               \
  X(ncclCommGetAsyncError)      \
  X(ncclCommAbort)              \
  X(ncclGetErrorString)         \
  X(ncclGetLastError)
// clang-format on

// Entry points the header overloads, with the type of the C one.
using CudaMallocFunction = cudaError_t (*)(void**, size_t);
#define BATON_CUDART_TYPED_SYMBOLS(X) X(cudaMalloc, CudaMallocFunction)

// The symbol's name after macro expansion (a header may map a name to a
// versioned one).
#define BATON_SYMBOL_NAME_(name) #name
#define BATON_SYMBOL_NAME(name) BATON_SYMBOL_NAME_(name)

#define BATON_DECLARE_POINTER(name) decltype(&::name) name = nullptr;
#define BATON_DECLARE_TYPED_POINTER(name, type) type name = nullptr;
struct CudartSymbols {
  BATON_CUDART_SYMBOLS(BATON_DECLARE_POINTER)
  BATON_CUDART_TYPED_SYMBOLS(BATON_DECLARE_TYPED_POINTER)
};
#undef BATON_DECLARE_TYPED_POINTER
struct NcclSymbols {
  BATON_NCCL_SYMBOLS(BATON_DECLARE_POINTER)
};
#undef BATON_DECLARE_POINTER

// dlopens `soname`: first as is (the loader's search path), then in each of
// the toolkit directories found at build time.
absl::StatusOr<void*> OpenLibrary(const std::string& what,
                                  const std::string& soname) {
  std::vector<std::string> candidates = {soname};
  for (absl::string_view dir :
       absl::StrSplit(BATON_CUDA_LIBRARY_DIRS, ':', absl::SkipEmpty())) {
    candidates.push_back(absl::StrCat(dir, "/", soname));
  }
  std::string first_error;
  for (const std::string& candidate : candidates) {
    void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return handle;
    const char* error = ::dlerror();
    if (first_error.empty() && error != nullptr) first_error = error;
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot load ", what, " (", soname, "): ", first_error,
      " (looked in the loader's path", candidates.size() > 1 ? " and " : "",
      absl::StrJoin(
          absl::StrSplit(BATON_CUDA_LIBRARY_DIRS, ':', absl::SkipEmpty()),
          ", "),
      "; put its directory on LD_LIBRARY_PATH)"));
}

template <typename Pointer>
absl::Status LoadSymbol(void* library, const char* name,
                        const std::string& soname, Pointer* pointer) {
  *pointer = reinterpret_cast<Pointer>(::dlsym(library, name));
  if (*pointer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(soname, " has no symbol ", name,
                     ": it is older than the version baton was built "
                     "against; install a newer one"));
  }
  return absl::OkStatus();
}

template <typename T>
T FromBytes(const char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

cudaStream_t ToCuda(Stream stream) {
  return reinterpret_cast<cudaStream_t>(stream);
}
cudaEvent_t ToCuda(Event event) { return reinterpret_cast<cudaEvent_t>(event); }
ncclComm_t ToNccl(NcclComm comm) { return reinterpret_cast<ncclComm_t>(comm); }

// Indexed by NcclDataType.
constexpr ncclDataType_t kNcclTypes[] = {ncclInt8,    ncclUint8,   ncclInt32,
                                         ncclInt64,   ncclFloat16, ncclFloat32,
                                         ncclFloat64, ncclBfloat16};
static_assert(sizeof kNcclTypes / sizeof kNcclTypes[0] ==
              static_cast<size_t>(NcclDataType::kBfloat16) + 1);

ncclDataType_t ToNccl(NcclDataType type) {
  return kNcclTypes[static_cast<size_t>(type)];
}

ncclRedOp_t ToNccl(NcclRedOp op) {
  switch (op) {
    case NcclRedOp::kAvg:
      return ncclAvg;
    case NcclRedOp::kMin:
      return ncclMin;
    case NcclRedOp::kMax:
      return ncclMax;
    case NcclRedOp::kProd:
      return ncclProd;
    case NcclRedOp::kSum:
      break;
  }
  return ncclSum;
}

NcclResult FromNccl(ncclResult_t result) {
  return static_cast<NcclResult>(result);
}

class CudaNcclApi : public GpuApi {
 public:
  CudaNcclApi(const CudartSymbols& cuda, const NcclSymbols& nccl)
      : cuda_(cuda), nccl_(nccl) {}

  CudaError GetDeviceCount(int* count) override {
    return cuda_.cudaGetDeviceCount(count);
  }
  CudaError GetDeviceProperties(int device,
                                DeviceProperties* properties) override {
    cudaDeviceProp prop;
    const cudaError_t error = cuda_.cudaGetDeviceProperties(&prop, device);
    if (error != cudaSuccess) return error;
    properties->name = prop.name;
    properties->total_memory_bytes = prop.totalGlobalMem;
    properties->compute_major = prop.major;
    properties->compute_minor = prop.minor;
    properties->pci_bus_id = absl::StrFormat(
        "%04x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    return cudaSuccess;
  }
  CudaError RuntimeGetVersion(int* version) override {
    return cuda_.cudaRuntimeGetVersion(version);
  }
  CudaError DriverGetVersion(int* version) override {
    return cuda_.cudaDriverGetVersion(version);
  }
  CudaError SetDevice(int device) override {
    return cuda_.cudaSetDevice(device);
  }
  CudaError StreamCreate(Stream* stream) override {
    cudaStream_t created = nullptr;
    const cudaError_t error =
        cuda_.cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
    *stream = reinterpret_cast<Stream>(created);
    return error;
  }
  CudaError StreamDestroy(Stream stream) override {
    return cuda_.cudaStreamDestroy(ToCuda(stream));
  }
  CudaError StreamSynchronize(Stream stream) override {
    return cuda_.cudaStreamSynchronize(ToCuda(stream));
  }
  CudaError EventCreate(Event* event) override {
    cudaEvent_t created = nullptr;
    const cudaError_t error =
        cuda_.cudaEventCreateWithFlags(&created, cudaEventDisableTiming);
    *event = reinterpret_cast<Event>(created);
    return error;
  }
  CudaError EventCreateInterprocess(Event* event) override {
    cudaEvent_t created = nullptr;
    const cudaError_t error = cuda_.cudaEventCreateWithFlags(
        &created, cudaEventInterprocess | cudaEventDisableTiming);
    *event = reinterpret_cast<Event>(created);
    return error;
  }
  CudaError EventDestroy(Event event) override {
    return cuda_.cudaEventDestroy(ToCuda(event));
  }
  CudaError EventRecord(Event event, Stream stream) override {
    return cuda_.cudaEventRecord(ToCuda(event), ToCuda(stream));
  }
  CudaError EventQuery(Event event) override {
    return cuda_.cudaEventQuery(ToCuda(event));
  }
  CudaError EventSynchronize(Event event) override {
    return cuda_.cudaEventSynchronize(ToCuda(event));
  }
  CudaError StreamWaitEvent(Stream stream, Event event) override {
    return cuda_.cudaStreamWaitEvent(ToCuda(stream), ToCuda(event), 0);
  }
  CudaError IpcOpenMemHandle(void** pointer,
                             const IpcMemHandle& handle) override {
    return cuda_.cudaIpcOpenMemHandle(
        pointer, FromBytes<cudaIpcMemHandle_t>(handle.bytes.data()),
        cudaIpcMemLazyEnablePeerAccess);
  }
  CudaError IpcCloseMemHandle(void* pointer) override {
    return cuda_.cudaIpcCloseMemHandle(pointer);
  }
  CudaError IpcOpenEventHandle(Event* event,
                               const IpcEventHandle& handle) override {
    cudaEvent_t opened = nullptr;
    const cudaError_t error = cuda_.cudaIpcOpenEventHandle(
        &opened, FromBytes<cudaIpcEventHandle_t>(handle.bytes.data()));
    *event = reinterpret_cast<Event>(opened);
    return error;
  }
  CudaError IpcGetMemHandle(IpcMemHandle* handle, void* pointer) override {
    cudaIpcMemHandle_t exported;
    const cudaError_t error = cuda_.cudaIpcGetMemHandle(&exported, pointer);
    if (error == cudaSuccess) {
      std::memcpy(handle->bytes.data(), &exported, sizeof exported);
    }
    return error;
  }
  CudaError IpcGetEventHandle(IpcEventHandle* handle, Event event) override {
    cudaIpcEventHandle_t exported;
    const cudaError_t error =
        cuda_.cudaIpcGetEventHandle(&exported, ToCuda(event));
    if (error == cudaSuccess) {
      std::memcpy(handle->bytes.data(), &exported, sizeof exported);
    }
    return error;
  }
  CudaError PointerGetDevice(const void* pointer, int* device) override {
    cudaPointerAttributes attributes;
    const cudaError_t error =
        cuda_.cudaPointerGetAttributes(&attributes, pointer);
    if (error != cudaSuccess) return error;
    if (attributes.type == cudaMemoryTypeUnregistered) {
      return cudaErrorInvalidValue;
    }
    *device = attributes.device;
    return cudaSuccess;
  }
  CudaError Malloc(void** pointer, size_t bytes) override {
    return cuda_.cudaMalloc(pointer, bytes);
  }
  CudaError Free(void* pointer) override { return cuda_.cudaFree(pointer); }
  CudaError Memcpy(void* destination, const void* source,
                   size_t bytes) override {
    const cudaError_t error =
        cuda_.cudaMemcpy(destination, source, bytes, cudaMemcpyDefault);
    if (error != cudaSuccess) return error;
    // From pageable host memory cudaMemcpy returns once the bytes are
    // staged, before the DMA reaches the device; the legacy stream it runs
    // on is done only when they are there (and the transport's streams,
    // being non-blocking, would not wait for it).
    return cuda_.cudaStreamSynchronize(nullptr);
  }
  CudaError Memset(void* pointer, int value, size_t bytes) override {
    return cuda_.cudaMemset(pointer, value, bytes);
  }
  std::string CudaErrorText(CudaError error) override {
    const auto code = static_cast<cudaError_t>(error);
    return absl::StrCat(cuda_.cudaGetErrorString(code), " (",
                        cuda_.cudaGetErrorName(code), ")");
  }

  NcclResult GetVersion(int* version) override {
    return FromNccl(nccl_.ncclGetVersion(version));
  }
  NcclResult GetUniqueId(NcclUniqueId* id) override {
    ncclUniqueId unique;
    const ncclResult_t result = nccl_.ncclGetUniqueId(&unique);
    std::memcpy(id->bytes.data(), &unique, sizeof unique);
    return FromNccl(result);
  }
  NcclResult CommInitRankNonBlocking(NcclComm* comm, int ranks,
                                     const NcclUniqueId& id,
                                     int rank) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t created = nullptr;
    const ncclResult_t result = nccl_.ncclCommInitRankConfig(
        &created, ranks, FromBytes<ncclUniqueId>(id.bytes.data()), rank,
        &config);
    *comm = reinterpret_cast<NcclComm>(created);
    return FromNccl(result);
  }
  NcclResult AllReduce(const void* send, void* receive, size_t count,
                       NcclDataType type, NcclRedOp op, NcclComm comm,
                       Stream stream) override {
    return FromNccl(nccl_.ncclAllReduce(send, receive, count, ToNccl(type),
                                        ToNccl(op), ToNccl(comm),
                                        ToCuda(stream)));
  }
  NcclResult Broadcast(const void* send, void* receive, size_t count,
                       NcclDataType type, int root, NcclComm comm,
                       Stream stream) override {
    return FromNccl(nccl_.ncclBroadcast(send, receive, count, ToNccl(type),
                                        root, ToNccl(comm), ToCuda(stream)));
  }
  NcclResult Reduce(const void* send, void* receive, size_t count,
                    NcclDataType type, NcclRedOp op, int root, NcclComm comm,
                    Stream stream) override {
    return FromNccl(nccl_.ncclReduce(send, receive, count, ToNccl(type),
                                     ToNccl(op), root, ToNccl(comm),
                                     ToCuda(stream)));
  }
  NcclResult GroupStart() override { return FromNccl(nccl_.ncclGroupStart()); }
  NcclResult GroupEnd() override { return FromNccl(nccl_.ncclGroupEnd()); }
  NcclResult CommGetAsyncError(NcclComm comm, NcclResult* state) override {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t result =
        nccl_.ncclCommGetAsyncError(ToNccl(comm), &async);
    *state = FromNccl(async);
    return FromNccl(result);
  }
  NcclResult CommAbort(NcclComm comm) override {
    return FromNccl(nccl_.ncclCommAbort(ToNccl(comm)));
  }
  std::string NcclErrorText(NcclResult result) override {
    return nccl_.ncclGetErrorString(static_cast<ncclResult_t>(result));
  }
  std::string NcclLastError(NcclComm comm) override {
    const char* text = nccl_.ncclGetLastError(ToNccl(comm));
    return text == nullptr ? "" : text;
  }

 private:
  const CudartSymbols cuda_;
  const NcclSymbols nccl_;
};

absl::StatusOr<GpuApi*> Load() {
  const std::string cudart_soname =
      absl::StrCat("libcudart.so.", CUDART_VERSION / 1000);
  const std::string nccl_soname = absl::StrCat("libnccl.so.", NCCL_MAJOR);
  const absl::StatusOr<void*> cudart =
      OpenLibrary("the CUDA runtime", cudart_soname);
  if (!cudart.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device (", cudart.status().message(), ")"));
  }
  CudartSymbols cuda;
#define BATON_LOAD(name)                                            \
  if (absl::Status s = LoadSymbol(*cudart, BATON_SYMBOL_NAME(name), \
                                  cudart_soname, &cuda.name);       \
      !s.ok()) {                                                    \
    return s;                                                       \
  }
  BATON_CUDART_SYMBOLS(BATON_LOAD)
#define BATON_LOAD_TYPED(name, type) BATON_LOAD(name)
  BATON_CUDART_TYPED_SYMBOLS(BATON_LOAD_TYPED)
#undef BATON_LOAD_TYPED
#undef BATON_LOAD
  const absl::StatusOr<void*> nccl_library = OpenLibrary("NCCL", nccl_soname);
  if (!nccl_library.ok()) {
    // Without a device NCCL is not needed: say that first.
    int devices = 0;
    const cudaError_t error = cuda.cudaGetDeviceCount(&devices);
    if (error != cudaSuccess || devices == 0) {
      return absl::UnavailableError(
          absl::StrCat("no CUDA device (cudaGetDeviceCount: ",
                       error != cudaSuccess
                           ? absl::StrCat(cuda.cudaGetErrorString(error), " (",
                                          cuda.cudaGetErrorName(error), ")")
                           : "none found",
                       "; ", nccl_library.status().message(), ")"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        devices, " CUDA device(s), but ", nccl_library.status().message()));
  }
  NcclSymbols nccl;
#define BATON_LOAD(name)                                                  \
  if (absl::Status s = LoadSymbol(*nccl_library, BATON_SYMBOL_NAME(name), \
                                  nccl_soname, &nccl.name);               \
      !s.ok()) {                                                          \
    return s;                                                             \
  }
  BATON_NCCL_SYMBOLS(BATON_LOAD)
#undef BATON_LOAD
  return new CudaNcclApi(cuda, nccl);
}

}  // namespace

absl::StatusOr<GpuApi*> LoadCudaNcclApi() {
  static const absl::StatusOr<GpuApi*>* const api =
      new absl::StatusOr<GpuApi*>(Load());
  return *api;
}

}  // namespace baton::agent::gpu
