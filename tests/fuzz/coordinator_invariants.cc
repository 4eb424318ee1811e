#include "tests/fuzz/coordinator_invariants.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
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
// [0, world); sent only to members.
void CoordinatorInvariants::CheckMembership(const std::string& receiver,
                                            const v1::Membership& m) {
  const std::string what =
      absl::StrCat("job ", m.job(), " generation ", m.generation());
  int32_t offset = 0;
  bool lists_receiver = false;
  std::set<std::string> names;
  for (int i = 0; i < m.nodes_size(); ++i) {
    const v1::NodeInfo& node = m.nodes(i);
    if (node.node_rank() != i || node.rank_offset() != offset ||
        node.local_size() < 1 || !names.insert(node.node_name()).second) {
      Broken(absl::StrCat(what, " gives node ", node.node_name(), " rank ",
                          node.node_rank(), " offset ", node.rank_offset(),
                          " local size ", node.local_size(), " at index ", i,
                          " (ranks must be distinct and in order)"));
    }
    offset += node.local_size();
    lists_receiver = lists_receiver || node.node_name() == receiver;
  }
  if (offset != m.world_size()) {
    Broken(absl::StrCat(what, " has world size ", m.world_size(),
                        " but its nodes hold ", offset, " ranks"));
  }
  if (!lists_receiver) {
    Broken(absl::StrCat(what, " was sent to ", receiver,
                        ", which it does not list"));
  }
  auto [it, fresh] =
      sealed_.emplace(std::make_pair(m.job(), m.generation()), m);
  if (!fresh && !MessageDifferencer::Equals(it->second, m)) {
    Broken(absl::StrCat(what, " was sealed twice, differently: ",
                        it->second.DebugString(), " and ", m.DebugString()));
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
  const v1::Membership& m = it->second;
  std::vector<std::tuple<std::string, int32_t, int32_t, int32_t>> sealed;
  for (const v1::NodeInfo& node : m.nodes()) {
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
