#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/transport/device_memory.h"
#include "baton/v1/common.pb.h"

namespace baton::agent {

// How the scheduler orders a job's collectives.
enum class SchedulingMode {
  // Partitions of at most partition_bytes, launched by (priority, partition
  // index) within the credit window.
  kPriority = 1,
  // Whole tensors in the order they became ready on every node; no
  // partitioning, no credit (the baseline).
  kFifo = 2,
};

const char* SchedulingModeName(SchedulingMode mode);

// How the collectives of CUDA tensors cross nodes (--gpu_cross_node).
enum class GpuCrossNode {
  // One NCCL group over every GPU of the job.
  kNccl = 1,
  // The hierarchical path: an NCCL reduce onto this node's first GPU, the
  // agents' gloo allreduce on host memory, an NCCL broadcast back to the
  // node's GPUs (BytePS and Horovod's hierarchical allreduce).
  kGloo = 2,
};

const char* GpuCrossNodeName(GpuCrossNode mode);

// "push_pull", "broadcast", "allgather" or "reduce_scatter".
const char* CollectiveName(v1::CollectiveOp kind);

// What carries host tensors' collectives between agents (--data_transport).
enum class DataTransport {
  // baton's ring collectives on its own TCP connections (TcpTransport).
  kTcp = 1,
  // gloo's TCP transport (GlooTransport).
  kGloo = 2,
};

// One collective on one tensor for one step, ready on this node: every local
// trainer has written its input. Immutable once submitted to the data plane;
// the buffers it points to are the tensor's shared memory, owned by the
// agent's job and kept alive until the data plane reports the operation done.
struct Operation {
  // Unique within the agent process.
  uint64_t id = 0;
  // The coordinator's plan: global id, priority and partitioning.
  uint32_t tensor_id = 0;
  std::string tensor_name;
  int32_t priority = 0;
  int64_t step = 0;
  v1::CollectiveOp kind = v1::COLLECTIVE_OP_PUSH_PULL;
  v1::DataType dtype = v1::DATA_TYPE_FLOAT32;
  // PUSH_PULL and REDUCE_SCATTER (Reduces): divide the sum by the world
  // size.
  bool average = false;
  // Reduces: how the ranks' values combine (average only with a sum).
  v1::ReduceOp reduce_op = v1::REDUCE_OP_SUM;
  // BROADCAST: the global root rank, the node that holds it, and the root's
  // index among this node's inputs (-1 when the root is on another node).
  int32_t root_rank = -1;
  int32_t root_node = -1;
  int32_t root_local = -1;
  // ALLGATHER, REDUCE_SCATTER and ALLTOALL (IsRankStacked): the global rank
  // of this node's first local trainer; its slices sit at (rank_offset + i)
  // * size_bytes.
  int32_t rank_offset = 0;
  // Bytes of one rank's slice, what partitions divide: the input and the
  // result, except that an ALLGATHER's output holds world_size times as
  // many, and a REDUCE_SCATTER's inputs do (its output: one slice per local
  // trainer); an ALLTOALL's inputs and outputs (one per local trainer)
  // hold world_size blocks of size_bytes.
  int64_t size_bytes = 0;
  // Bytes per partition the job asked for (a multiple of 8; the last one
  // may be shorter); 0: the scheduler's own, tuned size (priority mode).
  int64_t partition_bytes = 0;
  // Host tensors: one input per local trainer, in local-rank order, and the
  // output every local trainer reads (never one of the inputs).
  std::vector<const uint8_t*> inputs;
  uint8_t* output = nullptr;
  // CUDA tensors (TensorSpec.memory MEMORY_KIND_CUDA): each local trainer's
  // tensor, which is input and result (in place), indexed by local device
  // (DeviceCommunicator's local order; one trainer per device), with the
  // trainer's ready event the collective waits for. `inputs` is empty;
  // `output`, when set, is host memory of size_bytes that stages the
  // cross-node step of the hierarchical path. For a broadcast, root_local
  // is the root's local device on its node, on every node.
  bool on_device = false;
  std::vector<uint8_t*> device_buffers;
  std::vector<DeviceEvent*> ready;
  // When the last local trainer enqueued it (microseconds since the epoch):
  // fifo mode orders by the latest of these across nodes.
  int64_t ready_unix_us = 0;
};

// Partitions of `size_bytes` bytes in pieces of at most `partition_bytes`
// (<= 0: one); partition i covers [i * partition_bytes, ...).
int32_t NumPartitions(int64_t size_bytes, int64_t partition_bytes);

// `status` as the failure of `op` ("push_pull of tensor "w" step 3 failed:
// ...").
absl::Status OperationFailure(const Operation& op, const absl::Status& status);

// A transport error of `what` with the peers named: the nodes of
// `node_names` but `self`, the first 8 of them (`node_names` is empty where
// this node was not sent the names).
absl::Status TransportError(const absl::Status& status, const std::string& what,
                            const std::vector<std::string>& node_names,
                            int32_t self);

}  // namespace baton::agent
