#include "agent/transport/nccl/local_gpus.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/transport/nccl/cuda_nccl_api.h"

namespace baton::agent {
namespace {

// 13000 -> "13.0" (CUDA's encoding: 1000 x major + 10 x minor).
std::string CudaVersion(int version) {
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

// 22809 -> "2.28.9" (NCCL's: 10000 x major + 100 x minor + patch).
std::string NcclVersion(int version) {
  return absl::StrCat(version / 10000, ".", (version % 10000) / 100, ".",
                      version % 100);
}

}  // namespace

absl::StatusOr<int> CountCudaDevices(gpu::GpuApi& api) {
  int count = 0;
  const gpu::CudaError error = api.GetDeviceCount(&count);
  if (error != gpu::kCudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device (cudaGetDeviceCount: ", api.CudaErrorText(error), ")"));
  }
  if (count <= 0) {
    return absl::UnavailableError(
        "no CUDA device (cudaGetDeviceCount found none)");
  }
  return count;
}

absl::StatusOr<std::string> DescribeLocalGpus(gpu::GpuApi& api) {
  const absl::StatusOr<int> count = CountCudaDevices(api);
  if (!count.ok()) return count.status();
  std::vector<std::string> devices;
  for (int device = 0; device < *count; ++device) {
    gpu::DeviceProperties properties;
    const gpu::CudaError error = api.GetDeviceProperties(device, &properties);
    if (error != gpu::kCudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("cudaGetDeviceProperties of CUDA device ", device,
                       " failed: ", api.CudaErrorText(error)));
    }
    devices.push_back(absl::StrFormat(
        "%d: %s, %.1f GiB, sm_%d%d, PCI %s", device, properties.name,
        static_cast<double>(properties.total_memory_bytes) / (1 << 30),
        properties.compute_major, properties.compute_minor,
        properties.pci_bus_id));
  }
  int runtime = 0;
  int driver = 0;
  int nccl = 0;
  api.RuntimeGetVersion(&runtime);
  api.DriverGetVersion(&driver);
  api.GetVersion(&nccl);
  return absl::StrCat(
      *count, *count == 1 ? " CUDA device (" : " CUDA devices (",
      absl::StrJoin(devices, "; "), "), CUDA runtime ", CudaVersion(runtime),
      ", driver ", CudaVersion(driver), ", NCCL ", NcclVersion(nccl));
}

absl::StatusOr<std::string> DescribeLocalGpus() {
  const absl::StatusOr<gpu::GpuApi*> api = gpu::LoadCudaNcclApi();
  if (!api.ok()) return api.status();
  return DescribeLocalGpus(**api);
}

}  // namespace baton::agent
