#pragma once

// Internal to JobManager, shared by job_manager.cc (lifecycle) and
// job_recovery.cc (rebuilding jobs after a coordinator restart): the records
// it keeps per job and the checks both files apply. Include nowhere else.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/status.pb.h"
#include "common/ids.h"
#include "coordinator/job_manager.h"
#include "coordinator/reform_log.h"

namespace baton::coordinator {
namespace job_internal {

inline constexpr int32_t kMaxNodes = 100000;
inline constexpr int32_t kMaxLocalSize = 1024;
inline constexpr int64_t kMaxPartitionBytes = int64_t{1} << 30;

// "forming", "running", "re-forming", "failed", "finished".
std::string StateName(v1::JobState state);
// Failed or finished.
bool Ended(v1::JobState state);
// "6.0 s".
std::string Seconds(absl::Duration d);
// Checks the sizing fields JoinJob and RejoinJob share; `message` names the
// message in errors.
absl::Status ValidateSizing(const std::string& message, int32_t expected_nodes,
                            int32_t min_nodes, int64_t partition_bytes);
absl::Status ValidateLocalSize(const std::string& what, int32_t local_size);

}  // namespace job_internal

struct JobManager::Member {
  std::string node_name;
  std::string data_address;
  int32_t local_size = 0;
  std::string agent_instance;
  // The member's session while connected.
  SessionId session;
  bool connected = true;
  // A recovered member not yet reconnected, or one whose session ended
  // while the coordinator was stalled, is lost at this time.
  absl::Time reconnect_deadline;
  // Why it is disconnected, for the loss's reason ("the coordinator
  // restarted").
  std::string disconnected_by;
  // In the sealed generation; -1 before the member's first seal.
  int32_t node_rank = -1;
  // The rank its launcher gave it (JoinJob.node_rank); -1: none.
  int32_t requested_node_rank = -1;
  int32_t rank_offset = 0;
  absl::Time joined;
  // Left with finished=true.
  bool finished = false;
};

struct JobManager::Job {
  std::string name;
  v1::JobState state = v1::JOB_STATE_FORMING;
  std::string reason;
  // The sealed generation while running; otherwise the generation the next
  // seal will have.
  int64_t generation = 1;
  int32_t expected_nodes = 0;
  // Resolved: never 0.
  int32_t min_nodes = 0;
  int64_t partition_bytes = 0;
  // Who created the job, for error messages about disagreeing joins.
  std::string creator;
  absl::Time created;
  // Rebuilt from an agent's report after a coordinator restart (Rejoin).
  bool recovered = false;
  absl::Time ended;
  absl::Time reform_deadline;
  // Sealed members (node_rank >= 0) in node-rank order, then newcomers in
  // join order. Status pages rely on the sealed ones coming first by rank
  // (JobManager::FillMembers).
  std::vector<Member> members;
  // Node name -> index in `members`; AddMember and Reindex keep it in step.
  absl::flat_hash_map<std::string, size_t> member_index;
  // The newcomers' names (node_rank < 0) in name order, where a status page
  // finds its unsealed members (MemberPage's order). AddMember, RemoveMember
  // and Seal keep it.
  absl::btree_set<std::string> unsealed_names;
  // The members' trainers, summed: the world size status shows while the
  // job is not running. AddMember and RemoveMember keep it.
  int32_t members_local_size = 0;
  // The last sealed membership, and its node names for the per-message
  // member check (5,000 nodes report every second).
  v1::Membership membership;
  absl::flat_hash_set<std::string> sealed_nodes;

  void AddMember(Member member) {
    if (member.node_rank < 0) unsealed_names.insert(member.node_name);
    members_local_size += member.local_size;
    member_index[member.node_name] = members.size();
    members.push_back(std::move(member));
  }
  void RemoveMember(std::vector<Member>::iterator member) {
    unsealed_names.erase(member->node_name);
    members_local_size -= member->local_size;
    members.erase(member);
    Reindex();
  }
  // After members were erased or reordered.
  void Reindex() {
    member_index.clear();
    for (size_t i = 0; i < members.size(); ++i) {
      member_index[members[i].node_name] = i;
    }
  }
  void SetMembership(v1::Membership sealed) {
    membership = std::move(sealed);
    sealed_nodes.clear();
    for (const v1::NodeInfo& node : membership.nodes()) {
      sealed_nodes.insert(node.node_name());
    }
  }
  // Some member left with finished=true: the others are leaving too.
  bool finishing = false;
  // Joins of members that finished, for the name's next run (in order).
  std::vector<JobManager::HeldJoin> held_joins;
  // Nodes waiting to join the running generation (job_growth.cc), in join
  // order, and when they are admitted if no member reaches a commit first.
  std::vector<JobManager::PendingJoin> pending_joins;
  absl::Time join_deadline;
  // Pending joins from nodes other than `node_name`.
  size_t PendingJoinsBesides(const std::string& node_name) const {
    return static_cast<size_t>(
        std::count_if(pending_joins.begin(), pending_joins.end(),
                      [&](const JobManager::PendingJoin& p) {
                        return p.node_name != node_name;
                      }));
  }
  // Forgets `node_name`'s pending join; false when it had none.
  bool DropPendingJoin(const std::string& node_name) {
    const auto end = std::remove_if(pending_joins.begin(), pending_joins.end(),
                                    [&](const JobManager::PendingJoin& p) {
                                      return p.node_name == node_name;
                                    });
    const bool dropped = end != pending_joins.end();
    pending_joins.erase(end, pending_joins.end());
    return dropped;
  }
  std::deque<v1::JobEvent> events;
  // Members lost (session ended or silent, left unfinished, not back after
  // a coordinator restart) since the job was created.
  int64_t members_lost = 0;
  // Nodes that joined after the first seal (into a running or re-forming
  // job).
  int64_t members_joined = 0;
  // Every abort of a running generation until the next seal or the job's
  // end. A job rebuilt after a coordinator restart starts with none, like
  // the two counts above.
  ReformLog reforms;
};

}  // namespace baton::coordinator
