#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::agent {

// A trainer's CUDA buffer, opened in the agent through CUDA IPC. The memory
// stays mapped while any DeviceBuffer of its allocation lives.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  // The tensor's first byte in the agent's address space (device memory).
  virtual void* data() const = 0;
  virtual size_t bytes() const = 0;
  // Index of its device among the agent's devices (DeviceMemory::devices()).
  virtual int local_device() const = 0;
};

// A trainer's interprocess event, recorded on the trainer's stream once the
// tensor's input is written (ByteScheduler's ready event).
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Returns once the work the event captured last is done: OK;
  // DEADLINE_EXCEEDED naming the timeout when it is not done by then;
  // UNAVAILABLE with CUDA's error otherwise. The caller names the operation
  // in front of the message (nothing is built for it on the way to OK: this
  // runs for every partition). Called by one thread at a time.
  virtual absl::Status Wait(std::chrono::milliseconds timeout) = 0;
};

// Where a trainer says its tensor lives: the fields of v1::CudaBuffer.
struct DeviceBufferSpec {
  // The device as cudaDeviceGetPCIBusId names it ("0000:3b:00.0"), or
  // empty: then the device is found from the opened memory
  // (cudaPointerGetAttributes). Ordinals differ between processes under
  // CUDA_VISIBLE_DEVICES; bus ids do not.
  std::string pci_bus_id;
  // cudaIpcMemHandle_t of the allocation holding the tensor (64 bytes).
  std::string memory_handle;
  // The tensor's first byte within that allocation, and its size.
  int64_t offset = 0;
  int64_t bytes = 0;
  // cudaIpcEventHandle_t of the ready event (64 bytes).
  std::string event_handle;
};

// The agent's access to its local GPUs' memory for the trainers' tensors.
// One per agent process, outliving every job; thread-safe.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // PCI bus ids of the devices this agent drives, in local order (the order
  // of the NCCL transport's devices).
  virtual const std::vector<std::string>& devices() const = 0;

  // Opens a trainer's tensor. An allocation is opened once per process
  // (older CUDA allowed one mapping per handle and context; CUDA 13 counts
  // references) and shared by every tensor in it. Errors:
  // INVALID_ARGUMENT naming the field for a handle that is not 64 bytes, a
  // negative offset, a size that is not positive, or a device this agent does
  // not drive (the error lists the ones it does); UNAVAILABLE with CUDA's error
  // when the handle cannot be opened.
  virtual absl::StatusOr<std::shared_ptr<DeviceBuffer>> Open(
      const DeviceBufferSpec& spec) = 0;

  // Opens the ready event that comes with `spec` (event_handle). Errors as
  // Open.
  virtual absl::StatusOr<std::unique_ptr<DeviceEvent>> OpenEvent(
      const DeviceBufferSpec& spec) = 0;

  // Synchronous copies between host memory and device memory of local
  // device `local_device` (the hierarchical path's staging).
  virtual absl::Status CopyToHost(void* host, const void* device, size_t bytes,
                                  int local_device) = 0;
  virtual absl::Status CopyToDevice(void* device, const void* host,
                                    size_t bytes, int local_device) = 0;
};

}  // namespace baton::agent
