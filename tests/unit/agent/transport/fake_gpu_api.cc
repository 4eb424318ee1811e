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
  Event* event = FindEvent(event_handle, "cudaEventRecord");
  Stream* stream = FindStream(stream_handle, "cudaEventRecord");
  if (event == nullptr || stream == nullptr) return gpu::kCudaErrorInvalidValue;
  if (event->device != stream->device) {
    Misuse("cudaEventRecord of an event on another device than the stream");
    return gpu::kCudaErrorInvalidValue;
  }
  const int64_t generation = ++event->recorded;
  Push(stream, [event, generation] {
    event->completed = std::max(event->completed, generation);
  });
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::EventQuery(gpu::Event handle) {
  absl::MutexLock lock(&mu_);
  Event* event = FindEvent(handle, "cudaEventQuery");
  if (event == nullptr) return gpu::kCudaErrorInvalidValue;
  return event->completed >= event->recorded ? gpu::kCudaSuccess
                                             : gpu::kCudaErrorNotReady;
}

gpu::CudaError FakeGpuApi::EventSynchronize(gpu::Event handle) {
  absl::MutexLock lock(&mu_);
  Event* event = FindEvent(handle, "cudaEventSynchronize");
  if (event == nullptr) return gpu::kCudaErrorInvalidValue;
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
  Event* event = FindEvent(event_handle, "cudaStreamWaitEvent");
  if (event == nullptr || stream == nullptr) return gpu::kCudaErrorInvalidValue;
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
  char* opened = nullptr;
  std::memcpy(&opened, handle.bytes.data(), sizeof opened);
  if (memory_.find(opened) == memory_.end()) {
    return gpu::kCudaErrorInvalidValue;
  }
  *pointer = opened;
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::IpcCloseMemHandle(void* pointer) {
  absl::MutexLock lock(&mu_);
  return memory_.find(static_cast<char*>(pointer)) == memory_.end()
             ? gpu::kCudaErrorInvalidValue
             : gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::IpcOpenEventHandle(
    gpu::Event* event, const gpu::IpcEventHandle& handle) {
  absl::MutexLock lock(&mu_);
  gpu::Event opened = nullptr;
  std::memcpy(&opened, handle.bytes.data(), sizeof opened);
  if (FindEvent(opened, "cudaIpcOpenEventHandle") == nullptr) {
    return gpu::kCudaErrorInvalidValue;
  }
  *event = opened;
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
  delete[] it->first;
  memory_.erase(it);
  return gpu::kCudaSuccess;
}

gpu::CudaError FakeGpuApi::Memcpy(void* destination, const void* source,
                                  size_t bytes) {
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
