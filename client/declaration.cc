#include "client/declaration.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"

namespace baton::client {
namespace {

absl::Status CheckHandle(const std::string& tensor, const char* field,
                         const char* type, const std::string& handle) {
  if (handle.size() == kCudaIpcHandleBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor \"", tensor, "\": CudaBuffer.", field, " is ", handle.size(),
      " bytes; it must be a ", type, " (", kCudaIpcHandleBytes, " bytes)"));
}

}  // namespace

absl::Status CheckDeclaration(const std::vector<v1::TensorSpec>& specs,
                              const std::vector<v1::CudaBuffer>& cuda_buffers) {
  for (const v1::TensorSpec& spec : specs) {
    if (spec.memory() != v1::MEMORY_KIND_HOST &&
        spec.memory() != v1::MEMORY_KIND_CUDA) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", spec.name(), "\": TensorSpec.memory is ",
                       static_cast<int>(spec.memory()),
                       "; use MEMORY_KIND_HOST or MEMORY_KIND_CUDA"));
    }
  }
  // Tensor position -> position in cuda_buffers.
  std::map<int32_t, size_t> buffer_of;
  for (size_t i = 0; i < cuda_buffers.size(); ++i) {
    const v1::CudaBuffer& buffer = cuda_buffers[i];
    if (buffer.index() < 0 ||
        static_cast<size_t>(buffer.index()) >= specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_buffers[", i, "]: CudaBuffer.index ", buffer.index(),
          " is outside the declaration's tensors 0..",
          static_cast<int64_t>(specs.size()) - 1));
    }
    const v1::TensorSpec& spec = specs[static_cast<size_t>(buffer.index())];
    if (spec.memory() != v1::MEMORY_KIND_CUDA) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", spec.name(),
          "\" is in host memory (TensorSpec.memory MEMORY_KIND_HOST) but has "
          "a CudaBuffer (cuda_buffers[",
          i, "]); give CUDA buffers only for MEMORY_KIND_CUDA tensors"));
    }
    auto [first, inserted] = buffer_of.emplace(buffer.index(), i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", spec.name(), "\" has two CudaBuffers (cuda_buffers[",
          first->second, "] and [", i, "]); give exactly one"));
    }
    absl::Status status =
        CheckHandle(spec.name(), "memory_handle", "cudaIpcMemHandle_t",
                    buffer.memory_handle());
    if (status.ok()) {
      status = CheckHandle(spec.name(), "event_handle", "cudaIpcEventHandle_t",
                           buffer.event_handle());
    }
    if (!status.ok()) return status;
    if (buffer.offset() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", spec.name(), "\": CudaBuffer.offset is ",
                       buffer.offset(), "; it must be >= 0"));
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].memory() == v1::MEMORY_KIND_CUDA &&
        buffer_of.count(static_cast<int32_t>(i)) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", specs[i].name(),
          "\" is in CUDA memory (TensorSpec.memory MEMORY_KIND_CUDA) but has "
          "no CudaBuffer: give its memory_handle, offset and event_handle"));
    }
  }
  return absl::OkStatus();
}

bool SameCudaBuffer(const v1::CudaBuffer& a, const v1::CudaBuffer& b) {
  return a.memory_handle() == b.memory_handle() && a.offset() == b.offset() &&
         a.event_handle() == b.event_handle() &&
         a.pci_bus_id() == b.pci_bus_id();
}

}  // namespace baton::client
