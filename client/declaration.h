#pragma once

#include <vector>

#include "absl/status/status.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/trainer.pb.h"

namespace baton::client {

// Bytes of a cudaIpcMemHandle_t and of a cudaIpcEventHandle_t.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// Checks where a declaration's tensors live before it goes to the agent:
// each spec's memory is MEMORY_KIND_HOST or MEMORY_KIND_CUDA; each CUDA
// spec has exactly one of `cuda_buffers` (CudaBuffer.index = its position in
// `specs`) and no host spec has one; every buffer's memory_handle and
// event_handle are 64 bytes and its offset >= 0. INVALID_ARGUMENT naming the
// tensor and the field otherwise. Shapes, dtypes and names are the agent's
// to check.
absl::Status CheckDeclaration(const std::vector<v1::TensorSpec>& specs,
                              const std::vector<v1::CudaBuffer>& cuda_buffers);

// Whether two buffers name the same memory and ready event (the index is
// not compared).
bool SameCudaBuffer(const v1::CudaBuffer& a, const v1::CudaBuffer& b);

}  // namespace baton::client
