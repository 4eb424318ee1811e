#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/transport/device_communicator.h"
#include "agent/transport/device_memory.h"

namespace baton::agent {

// The GPUs this agent drives, for jobs with CUDA tensors. Without them
// (`memory` null) CUDA declarations are refused with `unavailable`.
struct GpuSupport {
  std::unique_ptr<DeviceMemory> memory;
  // A transport over the given devices (indices into memory->devices()), in
  // local-rank order.
  std::function<absl::StatusOr<std::unique_ptr<DeviceTransport>>(
      const std::vector<int>& local_devices)>
      transport;
  // Why there are none ("no CUDA device (...)").
  std::string unavailable = "it drives no GPU";
};

}  // namespace baton::agent
