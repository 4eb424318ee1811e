#include "agent/transport/nccl/cuda_device_memory.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/transport/nccl/local_gpus.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

// DeviceEvent::Wait: queries that only yield before the first sleep, and the
// sleeps' first and longest length. A ready event usually passes within
// microseconds of the enqueue; the short longest sleep bounds the latency
// it adds when the trainer's kernels run late.
constexpr int kYieldingPolls = 100;
constexpr absl::Duration kFirstSleep = absl::Microseconds(20);
constexpr absl::Duration kLongestSleep = absl::Microseconds(200);

// "0000:3b:00.0" for every spelling of the same address ("0000:3B:00.0",
// nvidia-smi's "00000000:3B:00.0", "3b:00.0"); anything else lowercased.
std::string CanonicalBusId(absl::string_view id) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(id, absl::ByAnyChar(":."));
  if (parts.size() == 3) parts.insert(parts.begin(), "0");
  if (parts.size() == 4) {
    uint32_t values[4];
    bool parsed = true;
    for (int i = 0; i < 4 && parsed; ++i) {
      parsed = !parts[i].empty() && absl::SimpleHexAtoi(parts[i], &values[i]);
    }
    if (parsed) {
      return absl::StrFormat("%04x:%02x:%02x.%x", values[0], values[1],
                             values[2], values[3]);
    }
  }
  return absl::AsciiStrToLower(id);
}

// INVALID_ARGUMENT unless `handle` (the field `field` of CudaBuffer) has the
// size of a CUDA IPC handle.
absl::Status CheckHandle(const std::string& handle, absl::string_view field,
                         absl::string_view type) {
  if (handle.size() == gpu::kCudaIpcHandleBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "CudaBuffer.", field, " is ", handle.size(), " bytes; give the ",
      gpu::kCudaIpcHandleBytes, "-byte ", type));
}

absl::Status CheckBufferSpec(const DeviceBufferSpec& spec) {
  BATON_RETURN_IF_ERROR(
      CheckHandle(spec.memory_handle, "memory_handle", "cudaIpcMemHandle_t"));
  if (spec.offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaBuffer.offset is ", spec.offset,
        "; give the tensor's first byte within its allocation (>= 0)"));
  }
  if (spec.bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA tensor's size (bytes) is ", spec.bytes,
                     "; it must hold at least one byte"));
  }
  if (spec.offset > std::numeric_limits<int64_t>::max() - spec.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBuffer.offset ", spec.offset, " plus the size ",
                     spec.bytes, " bytes overflows"));
  }
  return absl::OkStatus();
}

// The agent's devices and the allocations open in it: what CudaDeviceMemory
// shares with the buffers and events it hands out, which may outlive it.
// Thread-safe.
class IpcMappings : public std::enable_shared_from_this<IpcMappings> {
 public:
  IpcMappings(gpu::GpuApi* api, std::vector<int> ordinals,
              std::vector<std::string> bus_ids)
      : api_(api),
        ordinals_(std::move(ordinals)),
        bus_ids_(std::move(bus_ids)) {
    for (const std::string& id : bus_ids_) {
      canonical_bus_ids_.push_back(CanonicalBusId(id));
    }
  }

  gpu::GpuApi& api() const { return *api_; }
  const std::vector<std::string>& bus_ids() const { return bus_ids_; }
  int size() const { return static_cast<int>(ordinals_.size()); }

  // "local device 1 (CUDA device 3, PCI 0000:3b:00.0)"
  std::string Describe(int local) const {
    return absl::StrCat("local device ", local, " (CUDA device ",
                        ordinals_[local], ", PCI ", bus_ids_[local], ")");
  }

  // Makes local device `local` current on this thread.
  absl::Status SetDevice(int local, absl::string_view what) const {
    const gpu::CudaError error = api_->SetDevice(ordinals_[local]);
    if (error == gpu::kCudaSuccess) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat(what, ": cudaSetDevice(", ordinals_[local], ") for ",
                     Describe(local), " failed: ", api_->CudaErrorText(error)));
  }

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> Open(
      const DeviceBufferSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

  // The local device a tensor's ready event is opened on (see the header).
  absl::StatusOr<int> EventDevice(const DeviceBufferSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);

  // One DeviceBuffer of the allocation `handle` is gone; closes the
  // allocation after its last.
  void Release(const std::string& handle) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One allocation open in this process.
  struct Mapping {
    char* base = nullptr;
    int local_device = 0;
    // The DeviceBuffers in it.
    int users = 0;
  };

  // The local index of the device `bus_id` names, or INVALID_ARGUMENT.
  absl::StatusOr<int> LocalDeviceOfBusId(const std::string& bus_id) const;
  std::optional<int> LocalDeviceOfOrdinal(int ordinal) const;
  // "CUDA device 2 (PCI 0000:03:00.0)", as far as CUDA says.
  std::string DescribeOrdinal(int ordinal) const;
  std::string DrivenBusIds() const { return absl::StrJoin(bus_ids_, ", "); }

  // Opens `handle` on the device Open chooses (see the header), with one
  // user.
  absl::StatusOr<Mapping> OpenMapping(const gpu::IpcMemHandle& handle,
                                      std::optional<int> named)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<char*> OpenOn(int local, const gpu::IpcMemHandle& handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Close(int local, char* base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  gpu::GpuApi* const api_;
  const std::vector<int> ordinals_;
  const std::vector<std::string> bus_ids_;
  std::vector<std::string> canonical_bus_ids_;

  // Held across the CUDA calls that open and close allocations.
  absl::Mutex mu_;
  // By the handle's 64 bytes: one allocation lives on one device.
  std::map<std::string, Mapping> mappings_ ABSL_GUARDED_BY(mu_);
};

// A tensor in an open allocation; releases its share of the mapping.
class CudaBuffer : public DeviceBuffer {
 public:
  CudaBuffer(std::shared_ptr<IpcMappings> mappings, std::string handle,
             void* data, size_t bytes, int local_device)
      : mappings_(std::move(mappings)),
        handle_(std::move(handle)),
        data_(data),
        bytes_(bytes),
        local_device_(local_device) {}
  ~CudaBuffer() override { mappings_->Release(handle_); }

  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  int local_device() const override { return local_device_; }

 private:
  const std::shared_ptr<IpcMappings> mappings_;
  const std::string handle_;
  void* const data_;
  const size_t bytes_;
  const int local_device_;
};

// A trainer's ready event opened in the agent.
class CudaEvent : public DeviceEvent {
 public:
  CudaEvent(std::shared_ptr<IpcMappings> mappings, int local_device,
            gpu::Event event)
      : mappings_(std::move(mappings)),
        local_device_(local_device),
        event_(event) {}

  ~CudaEvent() override {
    absl::Status status =
        mappings_->SetDevice(local_device_, "destroying a ready event");
    if (status.ok()) {
      const gpu::CudaError error = mappings_->api().EventDestroy(event_);
      if (error != gpu::kCudaSuccess) {
        status = absl::UnavailableError(
            absl::StrCat("cudaEventDestroy of a ready event on ",
                         mappings_->Describe(local_device_),
                         " failed: ", mappings_->api().CudaErrorText(error)));
      }
    }
    LOG_IF(WARNING, !status.ok()) << "CUDA IPC: " << status.message();
  }

  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  absl::Status Wait(std::chrono::milliseconds timeout) override {
    BATON_RETURN_IF_ERROR(mappings_->SetDevice(
        local_device_, "waiting for the trainer's ready event"));
    Clock& clock = *Clock::Real();
    const absl::Time deadline = clock.Now() + absl::FromChrono(timeout);
    absl::Duration sleep = kFirstSleep;
    for (int polls = 0;; ++polls) {
      const gpu::CudaError error = mappings_->api().EventQuery(event_);
      if (error == gpu::kCudaSuccess) return absl::OkStatus();
      if (error != gpu::kCudaErrorNotReady) {
        return absl::UnavailableError(
            absl::StrCat("cudaEventQuery of the trainer's ready event on ",
                         mappings_->Describe(local_device_),
                         " failed: ", mappings_->api().CudaErrorText(error)));
      }
      const absl::Duration left = deadline - clock.Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat("the trainer's ready event did not complete within ",
                         timeout.count(), " ms"));
      }
      if (polls < kYieldingPolls) {
        std::this_thread::yield();
        continue;
      }
      absl::SleepFor(std::min(sleep, left));
      sleep = std::min(2 * sleep, kLongestSleep);
    }
  }

 private:
  const std::shared_ptr<IpcMappings> mappings_;
  const int local_device_;
  const gpu::Event event_;
};

absl::StatusOr<int> IpcMappings::LocalDeviceOfBusId(
    const std::string& bus_id) const {
  const std::string canonical = CanonicalBusId(bus_id);
  const auto it = std::find(canonical_bus_ids_.begin(),
                            canonical_bus_ids_.end(), canonical);
  if (it != canonical_bus_ids_.end()) {
    return static_cast<int>(it - canonical_bus_ids_.begin());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "CudaBuffer.pci_bus_id \"", bus_id,
      "\" is not a device this agent drives (it drives ", DrivenBusIds(),
      "); start the agent with the trainers' GPUs visible"));
}

std::optional<int> IpcMappings::LocalDeviceOfOrdinal(int ordinal) const {
  const auto it = std::find(ordinals_.begin(), ordinals_.end(), ordinal);
  if (it == ordinals_.end()) return std::nullopt;
  return static_cast<int>(it - ordinals_.begin());
}

std::string IpcMappings::DescribeOrdinal(int ordinal) const {
  gpu::DeviceProperties properties;
  if (api_->GetDeviceProperties(ordinal, &properties) != gpu::kCudaSuccess) {
    return absl::StrCat("CUDA device ", ordinal);
  }
  return absl::StrCat("CUDA device ", ordinal, " (PCI ", properties.pci_bus_id,
                      ")");
}

absl::StatusOr<char*> IpcMappings::OpenOn(int local,
                                          const gpu::IpcMemHandle& handle) {
  BATON_RETURN_IF_ERROR(SetDevice(local, "opening CudaBuffer.memory_handle"));
  void* base = nullptr;
  const gpu::CudaError error = api_->IpcOpenMemHandle(&base, handle);
  if (error != gpu::kCudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "cudaIpcOpenMemHandle of CudaBuffer.memory_handle on ", Describe(local),
        " failed: ", api_->CudaErrorText(error),
        " (is the trainer alive, on this machine, in the agent's IPC "
        "namespace, and still holding the allocation?)"));
  }
  return static_cast<char*>(base);
}

absl::Status IpcMappings::Close(int local, char* base) {
  BATON_RETURN_IF_ERROR(SetDevice(local, "closing a trainer's allocation"));
  const gpu::CudaError error = api_->IpcCloseMemHandle(base);
  if (error == gpu::kCudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cudaIpcCloseMemHandle of a trainer's allocation on ",
                   Describe(local), " failed: ", api_->CudaErrorText(error)));
}

absl::StatusOr<IpcMappings::Mapping> IpcMappings::OpenMapping(
    const gpu::IpcMemHandle& handle, std::optional<int> named) {
  const int first = named.value_or(0);
  BATON_ASSIGN_OR_RETURN(char* base, OpenOn(first, handle));
  int ordinal = -1;
  const gpu::CudaError error = api_->PointerGetDevice(base, &ordinal);
  if (error != gpu::kCudaSuccess) {
    const absl::Status closed = Close(first, base);
    LOG_IF(WARNING, !closed.ok()) << "CUDA IPC: " << closed.message();
    return absl::UnavailableError(
        absl::StrCat("cudaPointerGetAttributes of the memory opened from "
                     "CudaBuffer.memory_handle on ",
                     Describe(first), " failed: ", api_->CudaErrorText(error)));
  }
  const std::optional<int> holder = LocalDeviceOfOrdinal(ordinal);
  if (holder == first) return Mapping{base, first, 1};
  BATON_RETURN_IF_ERROR(Close(first, base));
  if (!holder.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA tensor's memory is on ", DescribeOrdinal(ordinal),
        ", which this agent does not drive (it drives ", DrivenBusIds(),
        "); start the agent with the trainers' GPUs visible"));
  }
  if (named.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBuffer.pci_bus_id names ", Describe(first),
                     ", but the tensor's memory is on ", Describe(*holder),
                     "; give the bus id of the tensor's device, or none"));
  }
  BATON_ASSIGN_OR_RETURN(base, OpenOn(*holder, handle));
  return Mapping{base, *holder, 1};
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> IpcMappings::Open(
    const DeviceBufferSpec& spec) {
  BATON_RETURN_IF_ERROR(CheckBufferSpec(spec));
  std::optional<int> named;
  if (!spec.pci_bus_id.empty()) {
    BATON_ASSIGN_OR_RETURN(named, LocalDeviceOfBusId(spec.pci_bus_id));
  }
  absl::MutexLock lock(&mu_);
  auto it = mappings_.find(spec.memory_handle);
  if (it == mappings_.end()) {
    gpu::IpcMemHandle handle;
    std::memcpy(handle.bytes.data(), spec.memory_handle.data(),
                handle.bytes.size());
    BATON_ASSIGN_OR_RETURN(const Mapping mapping, OpenMapping(handle, named));
    it = mappings_.emplace(spec.memory_handle, mapping).first;
  } else {
    if (named.has_value() && *named != it->second.local_device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaBuffer.pci_bus_id names ", Describe(*named),
          ", but the allocation is open on ", Describe(it->second.local_device),
          " for another tensor in it; give the bus id of the tensor's "
          "device, or none"));
    }
    ++it->second.users;
  }
  return std::shared_ptr<DeviceBuffer>(std::make_shared<CudaBuffer>(
      shared_from_this(), spec.memory_handle, it->second.base + spec.offset,
      static_cast<size_t>(spec.bytes), it->second.local_device));
}

absl::StatusOr<int> IpcMappings::EventDevice(const DeviceBufferSpec& spec) {
  if (!spec.pci_bus_id.empty()) return LocalDeviceOfBusId(spec.pci_bus_id);
  {
    absl::MutexLock lock(&mu_);
    const auto it = mappings_.find(spec.memory_handle);
    if (it != mappings_.end()) return it->second.local_device;
  }
  BATON_ASSIGN_OR_RETURN(const std::shared_ptr<DeviceBuffer> buffer,
                         Open(spec));
  return buffer->local_device();
}

void IpcMappings::Release(const std::string& handle) {
  absl::MutexLock lock(&mu_);
  const auto it = mappings_.find(handle);
  DCHECK(it != mappings_.end());
  if (it == mappings_.end() || --it->second.users > 0) return;
  const Mapping mapping = it->second;
  mappings_.erase(it);
  const absl::Status closed = Close(mapping.local_device, mapping.base);
  LOG_IF(WARNING, !closed.ok()) << "CUDA IPC: " << closed.message()
                                << " (the mapping stays until the agent exits)";
}

class CudaDeviceMemory : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(std::shared_ptr<IpcMappings> mappings)
      : mappings_(std::move(mappings)) {}

  const std::vector<std::string>& devices() const override {
    return mappings_->bus_ids();
  }

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> Open(
      const DeviceBufferSpec& spec) override {
    return mappings_->Open(spec);
  }

  absl::StatusOr<std::unique_ptr<DeviceEvent>> OpenEvent(
      const DeviceBufferSpec& spec) override {
    BATON_RETURN_IF_ERROR(
        CheckHandle(spec.event_handle, "event_handle", "cudaIpcEventHandle_t"));
    BATON_ASSIGN_OR_RETURN(const int local, mappings_->EventDevice(spec));
    BATON_RETURN_IF_ERROR(
        mappings_->SetDevice(local, "opening CudaBuffer.event_handle"));
    gpu::IpcEventHandle handle;
    std::memcpy(handle.bytes.data(), spec.event_handle.data(),
                handle.bytes.size());
    gpu::Event event = nullptr;
    const gpu::CudaError error =
        mappings_->api().IpcOpenEventHandle(&event, handle);
    if (error != gpu::kCudaSuccess) {
      return absl::UnavailableError(absl::StrCat(
          "cudaIpcOpenEventHandle of CudaBuffer.event_handle on ",
          mappings_->Describe(local),
          " failed: ", mappings_->api().CudaErrorText(error),
          " (is the trainer alive, on this machine and in the agent's IPC "
          "namespace?)"));
    }
    return std::unique_ptr<DeviceEvent>(
        std::make_unique<CudaEvent>(mappings_, local, event));
  }

  absl::Status CopyToHost(void* host, const void* device, size_t bytes,
                          int local_device) override {
    return Copy("copy from device to host", host, device, bytes, local_device);
  }

  absl::Status CopyToDevice(void* device, const void* host, size_t bytes,
                            int local_device) override {
    return Copy("copy from host to device", device, host, bytes, local_device);
  }

 private:
  absl::Status Copy(absl::string_view what, void* destination,
                    const void* source, size_t bytes, int local_device) {
    if (local_device < 0 || local_device >= mappings_->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": local device ", local_device,
                       " is out of range; this agent drives ",
                       mappings_->size(), " (0..", mappings_->size() - 1, ")"));
    }
    if (bytes == 0) return absl::OkStatus();
    BATON_RETURN_IF_ERROR(mappings_->SetDevice(local_device, what));
    const gpu::CudaError error =
        mappings_->api().Memcpy(destination, source, bytes);
    if (error == gpu::kCudaSuccess) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        what, " of ", bytes, " bytes on ", mappings_->Describe(local_device),
        ": cudaMemcpy failed: ", mappings_->api().CudaErrorText(error)));
  }

  const std::shared_ptr<IpcMappings> mappings_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateCudaDeviceMemory(
    gpu::GpuApi* api, std::vector<int> devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        "CUDA device memory needs at least one CUDA device");
  }
  BATON_ASSIGN_OR_RETURN(const int count, CountCudaDevices(*api));
  std::vector<std::string> bus_ids;
  for (size_t i = 0; i < devices.size(); ++i) {
    const int device = devices[i];
    if (device < 0 || device >= count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA device ", device, " does not exist: this machine has ", count,
          " (0..", count - 1, ")"));
    }
    if (std::find(devices.begin(), devices.begin() + i, device) !=
        devices.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA device ", device, " is listed twice"));
    }
    gpu::DeviceProperties properties;
    const gpu::CudaError error = api->GetDeviceProperties(device, &properties);
    if (error != gpu::kCudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("cudaGetDeviceProperties(", device,
                       ") failed: ", api->CudaErrorText(error)));
    }
    bus_ids.push_back(properties.pci_bus_id);
  }
  return std::unique_ptr<DeviceMemory>(
      std::make_unique<CudaDeviceMemory>(std::make_shared<IpcMappings>(
          api, std::move(devices), std::move(bus_ids))));
}

}  // namespace baton::agent
