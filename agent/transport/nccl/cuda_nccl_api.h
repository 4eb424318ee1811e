#pragma once

#include "absl/status/statusor.h"
#include "agent/transport/nccl/gpu_api.h"

namespace baton::agent::gpu {

// The real GpuApi: the CUDA runtime and NCCL, loaded with dlopen on the
// first call rather than linked, so that every baton binary starts on a
// machine without a GPU, a driver or the CUDA libraries and says what is
// missing instead of failing to start.
//
// The libraries are the sonames the build compiled against
// (libcudart.so.<CUDA major> and libnccl.so.<NCCL major>), looked up the
// usual way (LD_LIBRARY_PATH, the loader's cache and default directories)
// and then in the toolkit's library directories found at build time. The
// driver (libcuda) is the CUDA runtime's business: it loads it itself, and
// says "insufficient driver" when there is none.
//
// Returns the process-wide instance (never freed); every call gives the same
// answer. Errors, worded for "using the CPU transport (gloo): <message>":
// UNAVAILABLE "no CUDA device (<why>)" when there is no usable device anyway
// (the runtime cannot be loaded, or it finds no device and NCCL cannot be
// loaded either); FAILED_PRECONDITION when there are devices but NCCL cannot
// be loaded, or a library lacks a symbol (it is too old). Thread-safe.
absl::StatusOr<GpuApi*> LoadCudaNcclApi();

}  // namespace baton::agent::gpu
