#include "tests/unit/agent/transport/fake_gpu_api.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/reduce.h"
#include "baton/v1/common.pb.h"

namespace baton::agent {

FakeNcclFabric::FakeNcclFabric() = default;
FakeNcclFabric::~FakeNcclFabric() = default;

FakeGpuApi::FakeGpuApi(std::shared_ptr<FakeNcclFabric> fabric, Options options)
    : fabric_(std::move(fabric)), options_(options), mu_(fabric_->mu_) {}

FakeGpuApi::~FakeGpuApi() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& comm : comms_) comm->aborted = true;
    for (auto& stream : streams_) stream->destroyed = true;
  }
  for (auto& stream : streams_) stream->thread.join();
  for (auto& [pointer, allocation] : memory_) delete[] pointer;
}

// --- Knobs -------------------------------------------------------------------

void FakeGpuApi::HangCollectives(bool hang) {
  absl::MutexLock lock(&mu_);
  hang_ = hang;
}

void FakeGpuApi::FailCollectives(gpu::NcclResult error) {
  absl::MutexLock lock(&mu_);
  fail_ = error;
}

void FakeGpuApi::StallInitialization(bool stall) {
  absl::MutexLock lock(&mu_);
  stall_init_ = stall;
}

void FakeGpuApi::AwaitWaitingCollectives(int count) {
  absl::MutexLock lock(&mu_);
  const auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return waiting_collectives_ >= count;
  };
  mu_.Await(absl::Condition(&enough));
}

void FakeGpuApi::HoldStream(gpu::Stream handle) {
  absl::MutexLock lock(&mu_);
  Stream* stream = FindStream(handle, "HoldStream");
  if (stream == nullptr) return;
  const int64_t hold = ++stream->holds;
  Push(stream, [this, stream, hold]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stream->releases >= hold || stopping_;
    };
    mu_.Await(absl::Condition(&released));
  });
}

void FakeGpuApi::ReleaseStream(gpu::Stream handle) {
  absl::MutexLock lock(&mu_);
  Stream* stream = FindStream(handle, "ReleaseStream");
  if (stream != nullptr) stream->releases = stream->holds;
}

void FakeGpuApi::FailMemcpy(gpu::CudaError error) {
  absl::MutexLock lock(&mu_);
  memcpy_error_ = error;
}

gpu::IpcMemHandle FakeGpuApi::ExportMemory(void* base) {
  absl::MutexLock lock(&mu_);
  const char* allocation = static_cast<const char*>(base);
  gpu::IpcMemHandle handle;
  if (memory_.find(allocation) == memory_.end()) {
    Misuse("cudaIpcGetMemHandle of a pointer that is no allocation's base");
    return handle;
  }
  auto [it, added] = memory_exports_.emplace(allocation, next_export_id_);
  if (added) exported_memory_[next_export_id_++] = allocation;
  handle.bytes = ExportHandle(it->second, 'm');
  return handle;
}

gpu::IpcEventHandle FakeGpuApi::ExportEvent(gpu::Event event_handle) {
  absl::MutexLock lock(&mu_);
  gpu::IpcEventHandle handle;
  Event* event = FindEvent(event_handle, "cudaIpcGetEventHandle");
  if (event == nullptr) return handle;
  auto [it, added] = event_exports_.emplace(event, next_export_id_);
  if (added) exported_events_[next_export_id_++] = event;
  handle.bytes = ExportHandle(it->second, 'e');
  return handle;
}

int FakeGpuApi::live_ipc_mappings() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(ipc_mappings_.size());
}

int FakeGpuApi::ipc_opens() const {
  absl::MutexLock lock(&mu_);
  return ipc_opens_;
}

int FakeGpuApi::live_comms() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(
      comms_.begin(), comms_.end(), [](const auto& c) { return !c->aborted; }));
}

int FakeGpuApi::live_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(
      std::count_if(streams_.begin(), streams_.end(),
                    [](const auto& s) { return !s->destroyed; }));
}

int FakeGpuApi::live_events() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(
      std::count_if(events_.begin(), events_.end(),
                    [](const auto& e) { return !e->destroyed; }));
}

int FakeGpuApi::aborted_comms() const {
  absl::MutexLock lock(&mu_);
  return aborted_comms_;
}

std::vector<std::string> FakeGpuApi::misuses() const {
  absl::MutexLock lock(&mu_);
  return misuses_;
}

// --- Helpers ---------------------------------------------------------------

void FakeGpuApi::Misuse(const std::string& what) { misuses_.push_back(what); }

int FakeGpuApi::CurrentDevice() const {
  const auto it = current_device_.find(std::this_thread::get_id());
  return it == current_device_.end() ? 0 : it->second;
}

FakeGpuApi::Comm* FakeGpuApi::FindComm(gpu::NcclComm handle, const char* call) {
  for (auto& comm : comms_) {
    if (ToHandle<gpu::NcclComm>(comm.get()) != handle) continue;
    if (comm->aborted) break;
    return comm.get();
  }
  Misuse(absl::StrCat(call, " on a communicator that is not live"));
  return nullptr;
}

FakeGpuApi::Stream* FakeGpuApi::FindStream(gpu::Stream handle,
                                           const char* call) {
  for (auto& stream : streams_) {
    if (ToHandle<gpu::Stream>(stream.get()) != handle) continue;
    if (stream->destroyed) break;
    return stream.get();
  }
  Misuse(absl::StrCat(call, " on a stream that is not live"));
  return nullptr;
}

FakeGpuApi::Event* FakeGpuApi::FindEvent(gpu::Event handle, const char* call) {
  for (auto& event : events_) {
    if (ToHandle<gpu::Event>(event.get()) != handle) continue;
    if (event->destroyed) break;
    return event.get();
  }
  Misuse(absl::StrCat(call, " on an event that is not live"));
  return nullptr;
}

bool FakeGpuApi::IsDeviceMemory(const void* pointer, size_t bytes,
                                int device) const {
  const char* p = static_cast<const char*>(pointer);
  auto it = memory_.upper_bound(p);
  if (it == memory_.begin()) return false;
  --it;
  return it->second.device == device && p >= it->first &&
         p + bytes <= it->first + it->second.bytes;
}

const char* FakeGpuApi::FindAllocation(const void* pointer) const {
  const char* p = static_cast<const char*>(pointer);
  auto it = memory_.upper_bound(p);
  if (it == memory_.begin()) return nullptr;
  --it;
  // An allocation of 0 bytes still holds its base.
  return p < it->first + std::max<size_t>(it->second.bytes, 1) ? it->first
                                                               : nullptr;
}

// "fake", the kind, 3 bytes of zeros, the id; zeros after.
std::array<char, gpu::kCudaIpcHandleBytes> FakeGpuApi::ExportHandle(int64_t id,
                                                                    char kind) {
  std::array<char, gpu::kCudaIpcHandleBytes> bytes{};
  std::memcpy(bytes.data(), "fake", 4);
  bytes[4] = kind;
  std::memcpy(bytes.data() + 8, &id, sizeof id);
  return bytes;
}

int64_t FakeGpuApi::ExportId(
    const std::array<char, gpu::kCudaIpcHandleBytes>& bytes, char kind) {
  if (std::memcmp(bytes.data(), "fake", 4) != 0 || bytes[4] != kind) return 0;
  int64_t id = 0;
  std::memcpy(&id, bytes.data() + 8, sizeof id);
  return id;
}

void FakeGpuApi::Push(Stream* stream, std::function<void()> task) {
  stream->tasks.push_back(std::move(task));
}

void FakeGpuApi::StreamLoop(Stream* stream) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    const auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !stream->tasks.empty() || stream->destroyed;
    };
    mu_.Await(absl::Condition(&work));
    if (stream->tasks.empty()) return;
    std::function<void()> task = std::move(stream->tasks.front());
    stream->tasks.pop_front();
    task();
  }
}

// --- CUDA runtime ----------------------------------------------------------

gpu::CudaError FakeGpuApi::GetDeviceCount(int* count) {
  *count =
      options_.device_count_error == gpu::kCudaSuccess ? options_.devices : 0;
  return options_.device_count_error;
}

gpu::CudaError FakeGpuApi::GetDeviceProperties(
    int device, gpu::DeviceProperties* properties) {
  if (device < 0 || device >= options_.devices) {
    return gpu::kCudaErrorInvalidDevice;
  }
  properties->name = absl::StrCat("Fake GPU ", device);
  properties->total_memory_bytes = size_t{16} << 30;
  properties->compute_major = 9;
  properties->compute_minor = 0;
  properties->pci_bus_id = absl::StrCat("0000:0", device + 1, ":00.0");
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::RuntimeGetVersion(int* version) {
  *version = 13000;
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::DriverGetVersion(int* version) {
  *version = 13000;
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::SetDevice(int device) {
  if (device < 0 || device >= options_.devices) {
    return gpu::kCudaErrorInvalidDevice;
  }
  absl::MutexLock lock(&mu_);
  current_device_[std::this_thread::get_id()] = device;
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::StreamCreate(gpu::Stream* stream) {
  absl::MutexLock lock(&mu_);
  auto created = std::make_unique<Stream>();
  created->device = CurrentDevice();
  created->thread = std::thread(&FakeGpuApi::StreamLoop, this, created.get());
  *stream = ToHandle<gpu::Stream>(created.get());
  streams_.push_back(std::move(created));
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::StreamDestroy(gpu::Stream handle) {
  absl::MutexLock lock(&mu_);
  Stream* stream = FindStream(handle, "cudaStreamDestroy");
  if (stream == nullptr) return gpu::kCudaErrorInvalidValue;
  stream->destroyed = true;  // its thread ends once the tasks are done
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::StreamSynchronize(gpu::Stream handle) {
  absl::MutexLock lock(&mu_);
  Stream* stream = FindStream(handle, "cudaStreamSynchronize");
  if (stream == nullptr) return gpu::kCudaErrorInvalidValue;
  auto done = std::make_shared<bool>(false);
  Push(stream, [done] { *done = true; });
  const auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return *done || stopping_;
  };
  mu_.Await(absl::Condition(&finished));
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::EventCreate(gpu::Event* event) {
  absl::MutexLock lock(&mu_);
  auto created = std::make_unique<Event>();
  created->device = CurrentDevice();
  *event = ToHandle<gpu::Event>(created.get());
  events_.push_back(std::move(created));
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::EventCreateInterprocess(gpu::Event* event) {
  return EventCreate(event);
}

gpu::CudaError FakeGpuApi::EventDestroy(gpu::Event handle) {
  absl::MutexLock lock(&mu_);
  Event* event = FindEvent(handle, "cudaEventDestroy");
  if (event == nullptr) return gpu::kCudaErrorInvalidValue;
  event->destroyed = true;
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::EventRecord(gpu::Event event_handle,
                                       gpu::Stream stream_handle) {
  absl::MutexLock lock(&mu_);
  Event* opened = FindEvent(event_handle, "cudaEventRecord");
  Stream* stream = FindStream(stream_handle, "cudaEventRecord");
  if (opened == nullptr || stream == nullptr) {
    return gpu::kCudaErrorInvalidValue;
  }
  if (opened->device != stream->device) {
    Misuse("cudaEventRecord of an event on another device than the stream");
    return gpu::kCudaErrorInvalidValue;
  }
  Event* event = Recorded(opened);
  const int64_t generation = ++event->recorded;
  Push(stream, [event, generation] {
    event->completed = std::max(event->completed, generation);
  });
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::EventQuery(gpu::Event handle) {
  absl::MutexLock lock(&mu_);
  Event* opened = FindEvent(handle, "cudaEventQuery");
  if (opened == nullptr) return gpu::kCudaErrorInvalidValue;
  const Event* event = Recorded(opened);
  return event->completed >= event->recorded ? gpu::kCudaSuccess
                                             : gpu::kCudaErrorNotReady;
}

gpu::CudaError FakeGpuApi::EventSynchronize(gpu::Event handle) {
  absl::MutexLock lock(&mu_);
  Event* opened = FindEvent(handle, "cudaEventSynchronize");
  if (opened == nullptr) return gpu::kCudaErrorInvalidValue;
  const Event* event = Recorded(opened);
  const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return event->completed >= event->recorded || stopping_;
  };
  mu_.Await(absl::Condition(&done));
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::StreamWaitEvent(gpu::Stream stream_handle,
                                           gpu::Event event_handle) {
  absl::MutexLock lock(&mu_);
  Stream* stream = FindStream(stream_handle, "cudaStreamWaitEvent");
  Event* opened = FindEvent(event_handle, "cudaStreamWaitEvent");
  if (opened == nullptr || stream == nullptr) {
    return gpu::kCudaErrorInvalidValue;
  }
  const Event* event = Recorded(opened);
  const int64_t generation = event->recorded;
  Push(stream, [this, event, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return event->completed >= generation || stopping_;
    };
    mu_.Await(absl::Condition(&done));
  });
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::IpcOpenMemHandle(void** pointer,
                                            const gpu::IpcMemHandle& handle) {
  absl::MutexLock lock(&mu_);
  const auto exported = exported_memory_.find(ExportId(handle.bytes, 'm'));
  // Not exported, or freed since: what CUDA says to a stale handle.
  if (exported == exported_memory_.end()) return gpu::kCudaErrorInvalidValue;
  const char* allocation = exported->second;
  if (ipc_mappings_.count(allocation) != 0) {
    Misuse("cudaIpcOpenMemHandle of a handle this process has open already");
    return gpu::kCudaErrorInvalidValue;
  }
  ipc_mappings_[allocation] = CurrentDevice();
  ++ipc_opens_;
  *pointer = const_cast<char*>(allocation);
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::IpcCloseMemHandle(void* pointer) {
  absl::MutexLock lock(&mu_);
  const auto it = ipc_mappings_.find(static_cast<const char*>(pointer));
  if (it == ipc_mappings_.end()) {
    Misuse(
        "cudaIpcCloseMemHandle of a pointer cudaIpcOpenMemHandle did not "
        "return, or closed already");
    return gpu::kCudaErrorInvalidValue;
  }
  if (it->second != CurrentDevice()) {
    Misuse(absl::StrCat("cudaIpcCloseMemHandle with device ", CurrentDevice(),
                        " current of memory opened with device ", it->second,
                        " current"));
  }
  ipc_mappings_.erase(it);
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::IpcOpenEventHandle(
    gpu::Event* event, const gpu::IpcEventHandle& handle) {
  absl::MutexLock lock(&mu_);
  const auto exported = exported_events_.find(ExportId(handle.bytes, 'e'));
  if (exported == exported_events_.end() || exported->second->destroyed) {
    return gpu::kCudaErrorInvalidValue;
  }
  auto opened = std::make_unique<Event>();
  opened->device = CurrentDevice();
  opened->exported = exported->second;
  *event = ToHandle<gpu::Event>(opened.get());
  events_.push_back(std::move(opened));
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::IpcGetMemHandle(gpu::IpcMemHandle* handle,
                                           void* pointer) {
  *handle = ExportMemory(pointer);
  return ExportId(handle->bytes, 'm') != 0 ? gpu::kCudaSuccess
                                           : gpu::kCudaErrorInvalidValue;
}

gpu::CudaError FakeGpuApi::IpcGetEventHandle(gpu::IpcEventHandle* handle,
                                             gpu::Event event) {
  *handle = ExportEvent(event);
  return ExportId(handle->bytes, 'e') != 0 ? gpu::kCudaSuccess
                                           : gpu::kCudaErrorInvalidValue;
}

gpu::CudaError FakeGpuApi::PointerGetDevice(const void* pointer, int* device) {
  absl::MutexLock lock(&mu_);
  const char* allocation = FindAllocation(pointer);
  if (allocation == nullptr) return gpu::kCudaErrorInvalidValue;
  *device = memory_.at(allocation).device;
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::Malloc(void** pointer, size_t bytes) {
  absl::MutexLock lock(&mu_);
  char* allocated = new char[std::max<size_t>(bytes, 1)];
  memory_[allocated] = Allocation{CurrentDevice(), bytes};
  *pointer = allocated;
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::Free(void* pointer) {
  absl::MutexLock lock(&mu_);
  const auto it = memory_.find(static_cast<char*>(pointer));
  if (it == memory_.end()) {
    Misuse("cudaFree of memory Malloc did not return");
    return gpu::kCudaErrorInvalidValue;
  }
  if (ipc_mappings_.count(it->first) != 0) {
    Misuse("cudaFree of memory another process still has open through IPC");
  }
  if (const auto exported = memory_exports_.find(it->first);
      exported != memory_exports_.end()) {
    exported_memory_.erase(exported->second);
    memory_exports_.erase(exported);
  }
  delete[] it->first;
  memory_.erase(it);
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::Memcpy(void* destination, const void* source,
                                  size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    if (memcpy_error_ != gpu::kCudaSuccess) return memcpy_error_;
  }
  std::memcpy(destination, source, bytes);
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::Memset(void* pointer, int value, size_t bytes) {
  std::memset(pointer, value, bytes);
  return gpu::kCudaSuccess;
}

std::string FakeGpuApi::CudaErrorText(gpu::CudaError error) {
  switch (error) {
    case gpu::kCudaSuccess:
      return "no error (cudaSuccess)";
    case gpu::kCudaErrorInvalidValue:
      return "invalid argument (cudaErrorInvalidValue)";
    case gpu::kCudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version "
             "(cudaErrorInsufficientDriver)";
    case gpu::kCudaErrorNoDevice:
      return "no CUDA-capable device is detected (cudaErrorNoDevice)";
    case gpu::kCudaErrorInvalidDevice:
      return "invalid device ordinal (cudaErrorInvalidDevice)";
    case gpu::kCudaErrorNotReady:
      return "device not ready (cudaErrorNotReady)";
    default:
      return absl::StrCat("CUDA error ", error);
  }
}

}  // namespace baton::agent
