#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/scheduler/launch_queue.h"
#include "agent/scheduler/negotiation.h"
#include "agent/scheduler/operation.h"

namespace baton::agent::sim {

// What the simulated nodes have ready, round after round.
struct WorkloadOptions {
  // Tensors in the plan: ResNet-50's 161 parameter tensors (conv weights,
  // batch-norm scales and shifts, the classifier), repeated if more.
  int32_t tensors = 161;
  // Tensors that become ready per round, in backward order (the classifier
  // first), step after step; the plan's size: every tensor every round.
  int32_t ready_per_round = 161;
  // A node submits a tensor one round late (as if its backward pass were
  // slower) with probability 1 / straggle_one_in, decided by a hash of
  // (node, tensor, step); 0: never. The others then cannot agree on it
  // before that node has it.
  int64_t straggle_one_in = 0;
};

// The CPU that one node's part of a round costs, in microseconds of wall
// time of the real calls on this machine (Calibrate).
struct RoundCosts {
  // Negotiation::Encode of a full ready set.
  double encode_us = 0;
  // Element-wise minimum of one received vector into the node's.
  double combine_us = 0;
  // Negotiation::Decode of a round in which every tensor is agreed.
  double decode_us = 0;
  // What the scheduler does with the outcome: LaunchQueue::Add of every
  // agreed tensor, Admit, FuseSmallTensors.
  double plan_us = 0;
};

// The real negotiation (agent/scheduler: Negotiation::Encode and Decode,
// LaunchQueue, FuseSmallTensors) of N simulated nodes, driven the way
// Scheduler::Round drives it: each node encodes its own ready set, decodes
// the round's min-combined vector, takes the agreed tensors off its ready
// set, queues their partitions with the agreed partition size and launches
// what the agreed credit admits, fused as the scheduler fuses. Launches
// complete at once (nothing is in flight at the next round: the data plane
// is not simulated).
//
// Every node's outcome of a round is compared with the first node's to
// decode it, and every node's launches (sequence, tensor, step, partition,
// bytes, fusion) are hashed and compared at the end.
//
// Not thread-safe.
class NegotiationWorkload {
 public:
  NegotiationWorkload(int nodes, WorkloadOptions options);

  // Words of every round's vector.
  size_t vector_size() const;
  // Fills `vec` with `node`'s contribution to `round` (rounds of a node
  // come in order: 0, 1, ...).
  void Encode(int node, int64_t round, std::vector<int64_t>* vec);
  // `node` decodes `round`'s result and launches what it agreed.
  void Decode(int node, int64_t round, const std::vector<int64_t>& vec);
  // out[i] = min(out[i], in[i]): what the nodes combine.
  static void Combine(const std::vector<int64_t>& in,
                      std::vector<int64_t>* out);

  // Decodes that differed from the round's first (0 when every node decoded
  // every round alike), and nodes whose launches differ from node 0's.
  int64_t outcome_mismatches() const { return outcome_mismatches_; }
  int64_t launch_mismatches() const;
  // Tensors agreed and launches made by node 0 so far.
  int64_t agreed() const { return agreed_; }
  int64_t launches() const { return nodes_.empty() ? 0 : nodes_[0].launches; }

  // Medians of the real calls' wall time over `repeats` runs on this
  // machine, on a node with every tensor ready.
  static RoundCosts Calibrate(const WorkloadOptions& options, int repeats);

 private:
  struct NodeState {
    // Submitted, not yet agreed (the scheduler's submitted_).
    absl::flat_hash_map<uint32_t, std::shared_ptr<const Operation>> ready;
    // Tensors this node submits a round late: (tensor, step).
    std::vector<std::pair<uint32_t, int64_t>> late;
    LaunchQueue queue;
    // Partitions of each tensor queued and not launched yet.
    absl::flat_hash_map<uint32_t, int32_t> queued;
    int64_t partition_bytes = 0;
    int64_t credit_bytes = 0;
    uint64_t launch_seq = 0;
    uint64_t launch_hash = 0;
    int64_t launches = 0;
    int64_t next_round = 0;
  };
  struct Tensor {
    std::string name;
    int64_t bytes = 0;
  };
  struct RoundRecord {
    uint64_t outcome_hash = 0;
    int decoded = 0;
  };

  // The operation of `tensor` at `step`, the same object on every node.
  std::shared_ptr<const Operation> OperationOf(uint32_t tensor, int64_t step);
  // What `node` submits before encoding `round`.
  void SubmitReady(int node, int64_t round);
  bool Straggles(int node, uint32_t tensor, int64_t step) const;
  static uint64_t HashOutcome(const Negotiation::Outcome& outcome);

  const WorkloadOptions options_;
  std::vector<Tensor> plan_;
  std::vector<NodeState> nodes_;
  std::map<std::pair<uint32_t, int64_t>, std::shared_ptr<const Operation>>
      operations_;
  uint64_t next_op_id_ = 1;
  absl::flat_hash_map<int64_t, RoundRecord> rounds_;
  int64_t outcome_mismatches_ = 0;
  int64_t agreed_ = 0;
};

// ResNet-50's parameter tensors in forward order: name and bytes (float32).
std::vector<std::pair<std::string, int64_t>> ResNet50Parameters();

}  // namespace baton::agent::sim
