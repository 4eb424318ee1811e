#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "baton/v1/common.pb.h"

namespace baton {

// What each agent is told of a sealed generation (docs/protocol.md,
// "Membership"): the generation's own fields, its own entry (`self`) and
// the local sizes run-length encoded, but the node table (`nodes`) only at
// the first kMembershipKeepers node ranks. A seal of N nodes then moves
// O(N) bytes instead of N tables of N entries, and after a coordinator
// restart one keeper's report is enough to rebuild the job.
inline constexpr int32_t kMembershipKeepers = 2;

// Fills in num_nodes and local_sizes of a sealed membership from its node
// table (the coordinator's copy, at every seal).
void CompleteMembership(v1::Membership* membership);

// What node rank `node_rank` of `full` (a completed membership) is sent.
v1::Membership MembershipView(const v1::Membership& full, int32_t node_rank);

// Where a global rank lives.
struct RankPlace {
  int32_t node_rank = 0;
  // The global rank of that node's local rank 0.
  int32_t rank_offset = 0;
  int32_t local_size = 0;
};
// The node holding global rank `rank`, from the local-size runs of any view;
// nullopt outside 0..world_size-1.
std::optional<RankPlace> NodeOfRank(const v1::Membership& membership,
                                    int32_t rank);

// Checks a view as an agent holds it (as sent, or as reported back after a
// coordinator restart): num_nodes is 1..max_nodes, the runs cover exactly
// num_nodes nodes and world_size ranks, `self` sits where the runs place
// its node rank, and the node table, where present, has num_nodes entries
// that agree with the runs and with `self`. INVALID_ARGUMENT naming `what`
// ("RejoinJob.membership") and the field.
absl::Status ValidateMembershipView(absl::string_view what,
                                    const v1::Membership& membership,
                                    int32_t max_nodes);

}  // namespace baton
