#include "agent/scheduler/launch_queue.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace baton::agent {

int32_t LaunchQueue::Add(std::shared_ptr<const Operation> op,
                         int64_t partition_bytes) {
  const int32_t n = NumPartitions(op->size_bytes, partition_bytes);
  for (int32_t p = 0; p < n; ++p) {
    const int64_t offset = n == 1 ? 0 : p * partition_bytes;
    const int64_t length =
        n == 1 ? op->size_bytes
               : std::min(partition_bytes, op->size_bytes - offset);
    PartitionTask task{op, p, offset, length};
    task.num_partitions = n;
    queue_.emplace(Key{op->priority, p, op->tensor_id}, std::move(task));
  }
  return n;
}

std::vector<PartitionTask> LaunchQueue::Admit(int64_t free_credit,
                                              bool nothing_in_flight) {
  std::vector<PartitionTask> admitted;
  while (!queue_.empty()) {
    auto it = queue_.begin();
    const int64_t length = it->second.length;
    const bool always = nothing_in_flight && admitted.empty();
    if (!always && length > free_credit) break;
    free_credit -= length;
    admitted.push_back(std::move(it->second));
    queue_.erase(it);
  }
  return admitted;
}

std::vector<Launch> FuseSmallTensors(std::vector<PartitionTask> admitted,
                                     int64_t max_tensor_bytes,
                                     int64_t max_launch_bytes) {
  const auto fusable = [&](const PartitionTask& task) {
    const Operation& op = *task.op;
    return max_tensor_bytes > 0 && !op.on_device &&
           op.kind == v1::COLLECTIVE_OP_PUSH_PULL && task.num_partitions == 1 &&
           task.length <= max_tensor_bytes;
  };
  std::vector<Launch> launches;
  int64_t bytes = 0;  // of the last launch, while it may grow
  bool growing = false;
  for (PartitionTask& task : admitted) {
    const bool fits =
        growing && fusable(task) && bytes + task.length <= max_launch_bytes &&
        task.op->dtype == launches.back().front().op->dtype &&
        task.op->average == launches.back().front().op->average &&
        task.op->reduce_op == launches.back().front().op->reduce_op;
    if (fits) {
      bytes += task.length;
      launches.back().push_back(std::move(task));
      continue;
    }
    growing = fusable(task);
    bytes = task.length;
    launches.emplace_back();
    launches.back().push_back(std::move(task));
  }
  return launches;
}

std::vector<std::shared_ptr<const Operation>> LaunchQueue::Clear() {
  std::vector<std::shared_ptr<const Operation>> ops;
  absl::flat_hash_set<uint64_t> seen;
  for (auto& [key, task] : queue_) {
    if (seen.insert(task.op->id).second) ops.push_back(task.op);
  }
  queue_.clear();
  return ops;
}

}  // namespace baton::agent
