#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "agent/scheduler/operation.h"

namespace baton::agent {

// One partition of an agreed operation, ready to launch.
struct PartitionTask {
  std::shared_ptr<const Operation> op;
  int32_t partition = 0;
  int64_t offset = 0;
  int64_t length = 0;
  // Partitions of the operation, agreed with its partition size.
  int32_t num_partitions = 1;
  // Set at launch, for the timeline: the launch sequence number, the
  // communicator it went to, and when (unix microseconds) the operation was
  // submitted, agreed and this partition launched.
  uint64_t seq = 0;
  int32_t channel = -1;
  int64_t submitted_us = 0;
  int64_t agreed_us = 0;
  int64_t launched_us = 0;
};

// A launch: partitions that run as one collective. Usually one; several
// small whole tensors fused into one collective over a packed buffer
// (FuseSmallTensors).
using Launch = std::vector<PartitionTask>;

// Groups `admitted` (in launch order) into launches: a run of consecutive
// host push-pulls, each a whole tensor of at most `max_tensor_bytes`, with
// one data type, one average flag and one reduce op, fuses into one launch of
// at most `max_launch_bytes`; everything else is a launch of its own. Keeps the
// order, so priority order holds; a pure function of its inputs (tensor
// sizes, types and flags are the same on every node), so every node fuses
// alike. max_tensor_bytes 0: no fusion.
std::vector<Launch> FuseSmallTensors(std::vector<PartitionTask> admitted,
                                     int64_t max_tensor_bytes,
                                     int64_t max_launch_bytes);

// The priority scheduler's queue of agreed partitions, ordered by (tensor
// priority, partition index, tensor id), with the credit window applied on
// admission (ARCHITECTURE.md, "Scheduling"). Deterministic: the same
// additions and admissions give the same launches on every node.
//
// Not thread-safe: owned by the data plane's scheduler thread.
class LaunchQueue {
 public:
  // Queues every partition of `op`, in pieces of `partition_bytes` (the
  // size in force in the round that agreed it, the same on every node);
  // returns how many.
  int32_t Add(std::shared_ptr<const Operation> op, int64_t partition_bytes);

  // Pops partitions in order while they fit in `free_credit` bytes. When
  // `nothing_in_flight`, the first partition is admitted whatever its size
  // (one partition is always admitted). Stops at the first partition that
  // does not fit: a smaller, less urgent one never overtakes it.
  std::vector<PartitionTask> Admit(int64_t free_credit, bool nothing_in_flight);

  // Removes everything; returns each operation that had queued partitions.
  std::vector<std::shared_ptr<const Operation>> Clear();

  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }

 private:
  using Key = std::tuple<int32_t, int32_t, uint32_t>;
  std::map<Key, PartitionTask> queue_;
};

}  // namespace baton::agent
