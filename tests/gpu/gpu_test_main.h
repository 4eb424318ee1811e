#pragma once

#include <functional>

#include "agent/transport/nccl/gpu_api.h"

namespace baton::agent {

// The main() of a GPU test binary (label gpu): initializes gtest, loads the
// CUDA runtime and NCCL, and without a device prints "skipped: <why>" and
// returns 77 (ctest's Skipped); any other loading error is printed under
// `name` and returns 1. Otherwise prints the GPUs, hands the API and the
// device count to `setup` and runs the tests.
int GpuTestMain(
    const char* name, int argc, char** argv,
    const std::function<void(gpu::GpuApi* api, int devices)>& setup);

}  // namespace baton::agent
