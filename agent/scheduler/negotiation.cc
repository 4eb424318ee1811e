#include "agent/scheduler/negotiation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/reduce.h"

namespace baton::agent {
namespace {

constexpr int kAttrBits = 27;
constexpr int64_t kAttrMask = (int64_t{1} << kAttrBits) - 1;
// Attribute values: a push-pull's reduce op << 1 | its average flag (0 a
// plain sum, 1 an average); a broadcast's root.
constexpr int64_t kAttrAverage = 1;

// Header layout.
enum Header : size_t {
  kMode = 0,
  kNegMode,
  kKnownTensors,
  kFreeCredit,
  kNegInFlight,
  kNegPending,
  kNegLeaving,
  kPartitionBytes,
  kCreditBytes,
  kHeaderSize,
};
// Per tensor: key, -key, -ready time.
constexpr size_t kWordsPerTensor = 3;

}  // namespace

size_t Negotiation::VectorSize(int32_t body_tensors) {
  return kHeaderSize + kWordsPerTensor * static_cast<size_t>(body_tensors);
}

int64_t Negotiation::KeyOf(const Operation& op) {
  // Only what the kind uses: an allgather's attributes are always 0.
  int64_t attr = 0;
  if (op.kind == v1::COLLECTIVE_OP_BROADCAST) {
    attr = op.root_rank;
  } else if (Reduces(op.kind)) {
    attr = int64_t{op.reduce_op} << 1 | (op.average ? kAttrAverage : 0);
  }
  return ((op.step + 1) << kAttrBits) | attr;
}

std::string Negotiation::DescribeKey(v1::CollectiveOp kind, int64_t key) {
  const int64_t step = (key >> kAttrBits) - 1;
  const int64_t attr = key & kAttrMask;
  if (kind == v1::COLLECTIVE_OP_BROADCAST) {
    return absl::StrCat("step ", step, ", root rank ", attr);
  }
  if (!Reduces(kind)) return absl::StrCat("step ", step);
  if (attr == kAttrAverage) return absl::StrCat("step ", step, ", average");
  return absl::StrCat("step ", step, ", ",
                      ReduceOpName(static_cast<v1::ReduceOp>(attr >> 1)));
}

void Negotiation::Encode(const LocalState& state, int32_t body_tensors,
                         std::vector<int64_t>* vec) {
  vec->assign(VectorSize(body_tensors), 0);
  int64_t* v = vec->data();
  const int64_t mode = static_cast<int64_t>(state.mode);
  v[kMode] = mode;
  v[kNegMode] = -mode;
  v[kKnownTensors] = state.known_tensors;
  v[kFreeCredit] = state.free_credit;
  v[kNegInFlight] = -state.in_flight_bytes;
  v[kNegPending] = -state.pending;
  v[kNegLeaving] = state.leaving ? -1 : 0;
  v[kPartitionBytes] = state.partition_bytes;
  v[kCreditBytes] = state.credit_bytes;
  if (state.ready == nullptr) return;
  for (const auto& [tensor_id, op] : *state.ready) {
    if (tensor_id >= static_cast<uint32_t>(body_tensors)) continue;
    int64_t* t = v + kHeaderSize + kWordsPerTensor * tensor_id;
    const int64_t key = KeyOf(*op);
    t[0] = key;
    t[1] = -key;
    t[2] = -op->ready_unix_us;
  }
}

Negotiation::Outcome Negotiation::Decode(const std::vector<int64_t>& vec,
                                         int32_t body_tensors) {
  Outcome out;
  const int64_t* v = vec.data();
  out.mode_mismatch = v[kMode] != -v[kNegMode];
  out.known_tensors = static_cast<int32_t>(v[kKnownTensors]);
  out.min_free_credit = v[kFreeCredit];
  out.max_in_flight_bytes = -v[kNegInFlight];
  out.max_pending = -v[kNegPending];
  out.someone_leaving = v[kNegLeaving] != 0;
  out.partition_bytes = v[kPartitionBytes];
  out.credit_bytes = v[kCreditBytes];
  for (int32_t id = 0; id < body_tensors; ++id) {
    const int64_t* t = v + kHeaderSize + kWordsPerTensor * id;
    const int64_t min_key = t[0];
    const int64_t max_key = -t[1];
    if (min_key <= 0) continue;
    if (min_key == max_key) {
      out.agreed.push_back({static_cast<uint32_t>(id), -t[2]});
    } else {
      out.mismatches.push_back({static_cast<uint32_t>(id), min_key, max_key});
    }
  }
  return out;
}

}  // namespace baton::agent
