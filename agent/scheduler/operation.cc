#include "agent/scheduler/operation.h"

#include "absl/strings/str_cat.h"

namespace baton::agent {

const char* SchedulingModeName(SchedulingMode mode) {
  return mode == SchedulingMode::kFifo ? "fifo" : "priority";
}

const char* GpuCrossNodeName(GpuCrossNode mode) {
  return mode == GpuCrossNode::kGloo ? "gloo" : "nccl";
}

const char* CollectiveName(v1::CollectiveOp kind) {
  switch (kind) {
    case v1::COLLECTIVE_OP_BROADCAST:
      return "broadcast";
    case v1::COLLECTIVE_OP_ALLGATHER:
      return "allgather";
    case v1::COLLECTIVE_OP_REDUCE_SCATTER:
      return "reduce_scatter";
    case v1::COLLECTIVE_OP_ALLTOALL:
      return "alltoall";
    default:
      return "push_pull";
  }
}

int32_t NumPartitions(int64_t size_bytes, int64_t partition_bytes) {
  if (size_bytes <= partition_bytes || partition_bytes <= 0) return 1;
  return static_cast<int32_t>((size_bytes + partition_bytes - 1) /
                              partition_bytes);
}

absl::Status OperationFailure(const Operation& op, const absl::Status& status) {
  return absl::Status(
      status.code(),
      absl::StrCat(CollectiveName(op.kind), " of tensor \"", op.tensor_name,
                   "\" step ", op.step, " failed: ", status.message()));
}

absl::Status TransportError(const absl::Status& status, const std::string& what,
                            const std::vector<std::string>& node_names,
                            int32_t self) {
  // Names are known only at node ranks 0 and 1 (common/membership_view.h);
  // a long list helps nobody.
  constexpr size_t kListed = 8;
  std::string peers;
  size_t listed = 0;
  for (size_t rank = 0; rank < node_names.size(); ++rank) {
    if (static_cast<int32_t>(rank) == self) continue;
    if (listed == kListed) {
      absl::StrAppend(&peers, " and ", node_names.size() - 1 - listed, " more");
      break;
    }
    absl::StrAppend(&peers, peers.empty() ? "" : ", ", node_names[rank]);
    ++listed;
  }
  return absl::Status(
      status.code(),
      absl::StrCat(what, ": ", status.message(),
                   peers.empty() ? "" : absl::StrCat(" (peers: ", peers, ")")));
}

}  // namespace baton::agent
