#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/scheduler/operation.h"

namespace baton::agent {

// One round of the ordering contract's agreement (ARCHITECTURE.md, "The
// ordering contract"): every node encodes what it has ready into a vector of
// int64, the nodes take the element-wise minimum (NegotiationWire::
// ExchangeMin, on TCP connections of their own), and every node decodes the
// same outcome. Maxima
// travel as negated minima, so one collective gives both.
//
// Per tensor the vector holds the key of the operation ready for it (0 when
// none): (step + 1) << 27 | attributes (a push-pull's reduce op and average
// flag, a broadcast's root). The
// tensor is agreed when the minimum and the maximum key are equal and
// nonzero: every node has the same step ready with the same attributes. Equal
// nonzero minimum but a different maximum is a mismatch (nodes disagree on
// the step, the op, average or root) and fails that operation on every node.
//
// Pure functions of their inputs: every node that decodes the same vector
// reaches the same decisions.
class Negotiation {
 public:
  // What this node contributes to a round.
  struct LocalState {
    SchedulingMode mode = SchedulingMode::kPriority;
    // Tensors of the plan this node knows (ids 0..known_tensors-1).
    int32_t known_tensors = 0;
    // credit_bytes minus the bytes this node has in flight.
    int64_t free_credit = 0;
    int64_t in_flight_bytes = 0;
    // Operations submitted and not yet agreed.
    int64_t pending = 0;
    // This node is leaving the job: every node stops after this round.
    bool leaving = false;
    // The partition size and credit this node proposes (its PartitionTuner's,
    // or the values in use): every node applies the minima from this round
    // on.
    int64_t partition_bytes = 0;
    int64_t credit_bytes = 0;
    // The operation ready for each tensor id (at most one per tensor).
    const absl::flat_hash_map<uint32_t, std::shared_ptr<const Operation>>*
        ready = nullptr;
  };

  struct Agreed {
    uint32_t tensor_id = 0;
    // Latest ready time over the nodes (fifo order).
    int64_t ready_unix_us = 0;
  };
  struct Mismatch {
    uint32_t tensor_id = 0;
    int64_t min_key = 0;
    int64_t max_key = 0;
  };
  struct Outcome {
    bool mode_mismatch = false;
    bool someone_leaving = false;
    // Tensors every node knows: the next round's body covers these.
    int32_t known_tensors = 0;
    int64_t min_free_credit = 0;
    int64_t max_in_flight_bytes = 0;
    int64_t max_pending = 0;
    // The minima of the proposed partition size and credit.
    int64_t partition_bytes = 0;
    int64_t credit_bytes = 0;
    // Ordered by tensor id.
    std::vector<Agreed> agreed;
    std::vector<Mismatch> mismatches;
  };

  // Vector length for a round whose body covers `body_tensors` tensors.
  static size_t VectorSize(int32_t body_tensors);
  // Fills `vec` (resized) with this node's contribution; only tensor ids
  // below `body_tensors` are included.
  static void Encode(const LocalState& state, int32_t body_tensors,
                     std::vector<int64_t>* vec);
  static Outcome Decode(const std::vector<int64_t>& vec, int32_t body_tensors);

  // The key an operation contributes; > 0.
  static int64_t KeyOf(const Operation& op);
  // "step 7, sum" / "step 7, average" / "step 7, max" / "step 7, root rank
  // 3" for error messages, about an operation of `kind`.
  static std::string DescribeKey(v1::CollectiveOp kind, int64_t key);

  // Largest step and root rank a key can carry.
  static constexpr int64_t kMaxStep = (int64_t{1} << 35) - 2;
  static constexpr int32_t kMaxRootRank = (1 << 27) - 3;
};

}  // namespace baton::agent
