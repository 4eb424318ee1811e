// JobManager's part of Status.GetJob: a job's own fields and one page of its
// members (MemberPage), filling only the page's members so a status probe
// costs the control loop O(page size), not O(members), at 10,000 nodes.

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/job.h"
#include "coordinator/job_manager.h"

namespace baton::coordinator {

absl::StatusOr<bool> JobManager::FillStatus(const std::string& job_name,
                                            const MemberPage& page,
                                            v1::JobStatus* status) const {
  const Job* job = FindJob(job_name);
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("job \"", job_name, "\" is unknown to the coordinator"));
  }
  status->set_job(job->name);
  status->set_state(job->state);
  status->set_state_reason(job->reason);
  status->set_generation(job->generation);
  status->set_expected_nodes(job->expected_nodes);
  status->set_min_nodes(job->min_nodes);
  status->set_created_unix_ms(absl::ToUnixMillis(job->created));
  status->set_total_members(static_cast<int32_t>(job->members.size()));
  status->set_world_size(job->state == v1::JOB_STATE_RUNNING
                             ? job->membership.world_size()
                             : job->members_local_size);
  for (const v1::JobEvent& event : job->events) *status->add_events() = event;
  job->reforms.Fill(clock_->Now(), static_cast<int32_t>(job->members.size()),
                    status);
  status->set_members_lost(job->members_lost);
  status->set_members_joined(job->members_joined);
  if (absl::Status fits = page.Check(*status); !fits.ok()) return fits;
  return FillMembers(*job, page, status);
}

bool JobManager::FillMembers(const Job& job, const MemberPage& page,
                             v1::JobStatus* status) const {
  // Page order: the sealed members, which come first in `members` by node
  // rank, then the unsealed ones by name.
  const auto sealed_end =
      std::partition_point(job.members.begin(), job.members.end(),
                           [](const Member& m) { return m.node_rank >= 0; });
  auto sealed = std::partition_point(
      job.members.begin(), sealed_end, [&page](const Member& m) {
        return !page.Follows(m.node_rank, m.node_name);
      });
  const std::string* after = page.unsealed_after();
  auto unsealed = after == nullptr ? job.unsealed_names.begin()
                                   : job.unsealed_names.upper_bound(*after);
  int32_t left = page.size();
  for (; sealed != sealed_end && left > 0; ++sealed, --left) {
    FillMember(*sealed, status->add_members());
  }
  for (; unsealed != job.unsealed_names.end() && left > 0; ++unsealed, --left) {
    FillMember(job.members[job.member_index.at(*unsealed)],
               status->add_members());
  }
  return sealed != sealed_end || unsealed != job.unsealed_names.end();
}

void JobManager::FillMember(const Member& member, v1::MemberStatus* out) const {
  out->set_node_name(member.node_name);
  out->set_data_address(member.data_address);
  out->set_node_rank(member.node_rank);
  out->set_rank_offset(member.node_rank < 0 ? -1 : member.rank_offset);
  out->set_local_size(member.local_size);
  out->set_connected(member.connected);
  if (member.connected) {
    if (const Session* session = sessions_->Find(member.session)) {
      out->set_last_seen_unix_ms(absl::ToUnixMillis(session->last_seen));
    }
  }
}

}  // namespace baton::coordinator
