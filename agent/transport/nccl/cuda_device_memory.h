#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/transport/device_memory.h"
#include "agent/transport/nccl/gpu_api.h"

namespace baton::agent {

// DeviceMemory over the CUDA runtime: trainers' tensors opened through CUDA
// IPC on the devices the agent drives.
//
// `devices` are the CUDA ordinals the agent drives, in local order (the list
// NcclTransport::Options::devices gets); devices() are their PCI bus ids as
// cudaGetDeviceProperties gives them. Bus ids from trainers are compared
// by value: case and the width of the domain do not matter ("0000:3B:00.0",
// nvidia-smi's "00000000:3b:00.0").
//
// Contract of DeviceMemory, plus:
// - Which device a tensor is opened on: the one its pci_bus_id names, or,
//   without one, the device its memory is on, asked of CUDA after opening it
//   with the first driven device current (then closed and opened again on
//   that device when it is another one). Either way the opened memory must
//   be on that device: a pci_bus_id naming another device than the memory's
//   is INVALID_ARGUMENT, as is memory on a device the agent does not drive.
// - Each allocation (memory_handle) is opened once and shared by every
//   DeviceBuffer in it, whatever their offsets; it is closed, with its
//   device current, when the last of them is destroyed. Open takes a lock
//   across the CUDA calls that open and close allocations, so that an
//   allocation is never open twice at once.
// - OpenEvent opens the event with the tensor's device current: the device
//   of an open DeviceBuffer of the same memory_handle when there is one,
//   else the device Open would choose (without pci_bus_id that opens the
//   memory for a moment to ask CUDA). It does not keep the memory open.
// - Each DeviceEvent::Wait polls cudaEventQuery (yielding at first, then
//   sleeping 20 us doubling up to 200 us) and never blocks inside CUDA.
// - The offset and size of a tensor are not checked against its allocation
//   (CUDA IPC does not say how large an allocation is): the trainer vouches
//   for them.
// - Every call sets the device it works on (cudaSetDevice, which is per host
//   thread) and leaves it current; so do the destructors of the buffers and
//   events. Callers that issue CUDA calls of their own set their device
//   first.
// - Buffers and events may outlive the DeviceMemory; `api` must outlive them
//   all.
//
// Errors: INVALID_ARGUMENT when `devices` is empty, lists a device twice or
// names one that does not exist; UNAVAILABLE "no CUDA device (<why>)" as
// CountCudaDevices says it, or naming cudaGetDeviceProperties when a
// device's properties cannot be read.
absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateCudaDeviceMemory(
    gpu::GpuApi* api, std::vector<int> devices);

}  // namespace baton::agent
