#include "tests/fuzz/coordinator_invariants.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/membership_view.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/fuzz/fuzz_input.h"

namespace baton::coordinator {
namespace {

using google::protobuf::util::MessageDifferencer;

[[noreturn]] void Broken(const std::string& what) {
  fuzz::Broken("coordinator_fuzz", what);
}

}  // namespace

std::vector<MemberTuple> Members(const v1::JobStatus& status) {
  std::vector<MemberTuple> members;
  for (const v1::MemberStatus& m : status.members()) {
    members.emplace_back(m.node_name(), m.node_rank(), m.rank_offset(),
                         m.local_size());
  }
  std::sort(members.begin(), members.end());
  return members;
}

void CoordinatorInvariants::NewProcess() {
  sealed_.clear();
  plans_.clear();
  global_steps_.clear();
}

// One generation per membership; every member a distinct rank range in
// [0, world); each view addressed to its receiver, with the table only at
// node ranks 0 and 1; the views of one generation agree.
void CoordinatorInvariants::CheckMembership(const std::string& receiver,
                                            const v1::Membership& m) {
  const std::string what =
      absl::StrCat("job ", m.job(), " generation ", m.generation());
  if (absl::Status valid = ValidateMembershipView(what, m, 1 << 20);
      !valid.ok()) {
    Broken(std::string(valid.message()));
  }
  if (m.self().node_name() != receiver) {
    Broken(absl::StrCat(what, " addressed to ", m.self().node_name(),
                        " was sent to ", receiver));
  }
  if (m.nodes().empty() != (m.self().node_rank() >= kMembershipKeepers)) {
    Broken(absl::StrCat(what, " sent node rank ", m.self().node_rank(), " ",
                        m.nodes_size(), " table entries"));
  }
  v1::Membership shared = m;
  shared.clear_self();
  shared.clear_nodes();
  auto [it, fresh] = sealed_.emplace(std::make_pair(m.job(), m.generation()),
                                     Sealed{shared, {}});
  if (!fresh && !MessageDifferencer::Equals(it->second.shared, shared)) {
    Broken(absl::StrCat(what, " was sealed twice, differently: ",
                        it->second.shared.DebugString(), " and ",
                        shared.DebugString()));
  }
  std::map<int32_t, v1::NodeInfo>& table = it->second.nodes;
  std::set<std::string> names;
  for (int i = -1; i < m.nodes_size(); ++i) {
    const v1::NodeInfo& node = i < 0 ? m.self() : m.nodes(i);
    auto [at, added] = table.emplace(node.node_rank(), node);
    if (!added && !MessageDifferencer::Equals(at->second, node)) {
      Broken(absl::StrCat(what, " gives node rank ", node.node_rank(),
                          " two entries: ", at->second.DebugString(), " and ",
                          node.DebugString()));
    }
  }
  for (const auto& [rank, node] : table) {
    if (!names.insert(node.node_name()).second) {
      Broken(
          absl::StrCat(what, " gives node ", node.node_name(), " two ranks"));
    }
  }
}

// The global step never decreases within one run of a job; a running
// job's members are the membership sealed for its generation.
void CoordinatorInvariants::CheckStatus(const v1::JobStatus& job) {
  int64_t& step =
      global_steps_
          .emplace(std::make_pair(job.job(), job.created_unix_ms()), -1)
          .first->second;
  if (job.global_step() < step) {
    Broken(absl::StrCat("job ", job.job(), "'s global step went from ", step,
                        " to ", job.global_step()));
  }
  step = job.global_step();
  if (job.state() != v1::JOB_STATE_RUNNING) return;
  auto it = sealed_.find(std::make_pair(job.job(), job.generation()));
  if (it == sealed_.end()) return;  // recovered, not sealed by this process
  const v1::Membership& m = it->second.shared;
  // Only a table every member's view was seen for (or a keeper sent).
  if (static_cast<int32_t>(it->second.nodes.size()) != m.num_nodes()) return;
  std::vector<std::tuple<std::string, int32_t, int32_t, int32_t>> sealed;
  for (const auto& [rank, node] : it->second.nodes) {
    sealed.emplace_back(node.node_name(), node.node_rank(), node.rank_offset(),
                        node.local_size());
  }
  std::sort(sealed.begin(), sealed.end());
  // Members that left finished are gone from the list while the others
  // finish; nobody else may appear.
  const auto members = Members(job);
  if (!std::includes(sealed.begin(), sealed.end(), members.begin(),
                     members.end()) ||
      job.world_size() != m.world_size()) {
    Broken(absl::StrCat("job ", job.job(), " runs generation ",
                        job.generation(),
                        " but its status lists other members than were "
                        "sealed: ",
                        job.DebugString(), " vs ", m.DebugString()));
  }
}

void CoordinatorInvariants::CheckPlan(const v1::TensorPlan& plan) {
  const auto key =
      std::make_tuple(plan.job(), plan.generation(), plan.version());
  auto [it, fresh] = plans_.emplace(key, plan);
  if (!fresh && !MessageDifferencer::Equals(it->second, plan)) {
    Broken(absl::StrCat("two different plans of job ", plan.job(),
                        " generation ", plan.generation(), " version ",
                        plan.version(), ": ", it->second.DebugString(), " and ",
                        plan.DebugString()));
  }
}

}  // namespace baton::coordinator
