#pragma once

// What coordinator_fuzz checks after every action, on what the coordinator
// sent its agents and on the jobs' status (docs/fuzzing.md). Each check
// aborts the process (fuzz::Broken) on a break, so libFuzzer keeps the
// input.

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "baton/v1/common.pb.h"
#include "baton/v1/status.pb.h"

namespace baton::coordinator {

// A member as status shows it: node name, node rank, rank offset, local size.
using MemberTuple = std::tuple<std::string, int32_t, int32_t, int32_t>;

// `status`'s members, sorted.
std::vector<MemberTuple> Members(const v1::JobStatus& status);

class CoordinatorInvariants {
 public:
  // A coordinator restarted: memberships, plans and global steps start anew
  // (a restarted coordinator seals anew; the restart check is the
  // driver's).
  void NewProcess();
  // `m` was sent to node `receiver`: it is addressed to it (self), its
  // local-size runs cover [0, world) and place self, it carries the table
  // exactly at node ranks 0 and 1, and it agrees with every other view of
  // (job, generation): the shared fields, and one entry per node rank with
  // distinct names.
  void CheckMembership(const std::string& receiver, const v1::Membership& m);
  // A plan sent to a member: the same (job, generation, version) is the same
  // plan for every member.
  void CheckPlan(const v1::TensorPlan& plan);
  // The global step never decreases within one run of a job; a running
  // job's status lists only members of the membership sealed for its
  // generation, with their ranks.
  void CheckStatus(const v1::JobStatus& job);

 private:
  // What the members of one sealed generation were told: the part every
  // view shares, and the table assembled from the views (each node's own
  // entry, and the whole table from node ranks 0 and 1).
  struct Sealed {
    v1::Membership shared;
    std::map<int32_t, v1::NodeInfo> nodes;
  };
  std::map<std::pair<std::string, int64_t>, Sealed> sealed_;
  std::map<std::tuple<std::string, int64_t, int64_t>, v1::TensorPlan> plans_;
  // Per run of a job (its creation time tells runs apart: every action
  // advances the clock).
  std::map<std::pair<std::string, int64_t>, int64_t> global_steps_;
};

}  // namespace baton::coordinator
