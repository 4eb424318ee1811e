#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "agent/transport/nccl/gpu_api.h"

namespace baton::agent {

// The number of CUDA devices this process sees (at least 1), or UNAVAILABLE
// "no CUDA device (<why>)": the runtime's error (no driver, no device) or
// that it found none.
absl::StatusOr<int> CountCudaDevices(gpu::GpuApi& api);

// What the GPU data plane would run on, in one line: "2 CUDA devices (0:
// NVIDIA H200, 139.8 GiB, sm_90, PCI 0000:19:00.0; 1: ...), CUDA runtime
// 13.0, driver 13.0, NCCL 2.28.9". Errors as CountCudaDevices, or
// UNAVAILABLE naming the call that failed.
absl::StatusOr<std::string> DescribeLocalGpus(gpu::GpuApi& api);

// The same with the real CUDA runtime and NCCL (loaded on first use); their
// loading errors as LoadCudaNcclApi words them ("no CUDA device (cannot load
// the CUDA runtime ...)").
absl::StatusOr<std::string> DescribeLocalGpus();

}  // namespace baton::agent
