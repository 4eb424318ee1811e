#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/device_memory.h"
#include "baton/v1/common.pb.h"
#include "common/shm.h"
#include "common/tensor_spec.h"

namespace baton::agent {

// A tensor declared by every local trainer of a job on this node, with the
// memory its bytes live in. A host tensor has shared memory: one input
// region per local trainer and one output region, starting on 4 KiB
// boundaries. Its name stays while the job runs here, so that a trainer
// attaching in place of a lost one can map it (a killed agent's names are
// removed when the next agent starts: SharedMemory::RemoveOrphans). A CUDA
// tensor has each trainer's buffer, opened through CUDA IPC, and its ready
// event; the hierarchical path stages it in `stage`.
struct LocalTensor {
  v1::TensorSpec spec;
  // What each rank receives and writes (ResultSizeBytes, InputSizeBytes):
  // the tensor's bytes, but a reduce-scatter's result and an allgather's
  // input are one rank's slice.
  int64_t size_bytes = 0;
  int64_t input_bytes = 0;
  SharedMemory memory;
  std::vector<int64_t> input_offsets;  // by local rank
  int64_t output_offset = 0;
  // CUDA tensors, by local rank (null until that rank declared it).
  std::vector<std::shared_ptr<DeviceBuffer>> device_buffers;
  std::vector<std::unique_ptr<DeviceEvent>> ready_events;
  std::vector<uint8_t> stage;
  // Local ranks that declared it; the node's manifest lists it once all did.
  int32_t declared_by = 0;
  // From the coordinator's plan; -1 until planned.
  int64_t tensor_id = -1;
  int32_t priority = 0;
  // Set when the coordinator reported that nodes declared it differently:
  // every enqueue of it fails with this.
  absl::Status mismatch;
  // Last step each local rank enqueued; -1 before the first.
  std::vector<int64_t> last_step;

  bool on_device() const { return spec.memory() == v1::MEMORY_KIND_CUDA; }
  // Where local rank `local_rank` reads its result: the output region, or
  // for a reduce-scatter or an alltoall that rank's own part of it
  // (local_size parts, ResultPerRank).
  int64_t output_offset_of(int32_t local_rank) const;

  // Creates the shared memory for `local_size` trainers (none for a CUDA
  // tensor), shared with `group` when given (SharedMemory::Create).
  static absl::StatusOr<std::unique_ptr<LocalTensor>> Create(
      const std::string& shm_name, const v1::TensorSpec& spec,
      int32_t local_size, std::optional<gid_t> group = std::nullopt);
};

// "" when equal; otherwise which field differs and both values, e.g.
// "dtype float32 vs int64" (common/tensor_spec.h's words).
std::string DescribeDifference(const v1::TensorSpec& a,
                               const v1::TensorSpec& b);

}  // namespace baton::agent
