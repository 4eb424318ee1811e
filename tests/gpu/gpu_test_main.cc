#include "tests/gpu/gpu_test_main.h"

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "agent/transport/nccl/cuda_nccl_api.h"
#include "agent/transport/nccl/local_gpus.h"
#include "gtest/gtest.h"

namespace baton::agent {

int GpuTestMain(
    const char* name, int argc, char** argv,
    const std::function<void(gpu::GpuApi* api, int devices)>& setup) {
  ::testing::InitGoogleTest(&argc, argv);
  const absl::StatusOr<gpu::GpuApi*> api = gpu::LoadCudaNcclApi();
  if (!api.ok()) {
    if (api.status().code() == absl::StatusCode::kUnavailable) {
      std::printf("skipped: %s\n", std::string(api.status().message()).c_str());
      return 77;
    }
    std::fprintf(stderr, "%s: %s\n", name,
                 std::string(api.status().message()).c_str());
    return 1;
  }
  const absl::StatusOr<int> devices = CountCudaDevices(**api);
  if (!devices.ok()) {
    std::printf("skipped: %s\n",
                std::string(devices.status().message()).c_str());
    return 77;
  }
  const absl::StatusOr<std::string> description = DescribeLocalGpus(**api);
  std::printf("%s\n",
              description.ok()
                  ? description->c_str()
                  : std::string(description.status().message()).c_str());
  setup(*api, *devices);
  return RUN_ALL_TESTS();
}

}  // namespace baton::agent
