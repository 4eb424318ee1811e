// Growing a running job: a node that joins a running generation below the
// job's node count (a replacement, or growth up to expected_nodes) waits
// for the members' next commit. The members hear of it (JoinPending, which
// their agents pass on to the trainers); the first trainer to reach a
// commit (baton.torch.elastic) asks its agent to admit it (AdmitJoins),
// and the running generation ends there: the next one includes the new
// node, and the survivors resume from that commit instead of losing the
// steps since their last one. Trainers that never commit (not elastic)
// have it admitted after --join_wait_ms.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/validation.h"
#include "coordinator/job.h"
#include "coordinator/job_manager.h"

namespace baton::coordinator {

using job_internal::Seconds;

void JobManager::AddJoiner(Job& job, Session& session, uint64_t seq,
                           const v1::JoinJob& join) {
  Member member;
  member.node_name = session.node_name;
  member.data_address = join.data_address();
  member.local_size = join.local_size();
  member.requested_node_rank = join.has_node_rank() ? join.node_rank() : -1;
  member.agent_instance = session.agent_instance;
  member.session = session.id;
  member.joined = clock_->Now();
  job.AddMember(std::move(member));
  session.jobs.insert(job.name);
  if (job.state != v1::JOB_STATE_FORMING) ++job.members_joined;
  Event(job, "join",
        absl::StrCat("node ", session.node_name, " joined (", join.local_size(),
                     " trainers, data plane at ", join.data_address(), "); ",
                     job.members.size(), " of ", job.expected_nodes, " nodes"),
        session.node_name);
  SendJoinAccepted(job, session.id, seq);
}

void JobManager::HoldForCommit(Job& job, Session& session, uint64_t seq,
                               const v1::JoinJob& join) {
  const absl::Time now = clock_->Now();
  // The same node again (its agent reconnected): its latest join counts.
  job.DropPendingJoin(session.node_name);
  if (job.pending_joins.empty()) job.join_deadline = now + options_.join_wait;
  job.pending_joins.push_back(
      PendingJoin{session.id, seq, join, session.node_name, now});
  SendJoinAccepted(job, session.id, seq);
  Event(job, "join pending",
        absl::StrCat("node ", session.node_name, " waits to join generation ",
                     job.generation,
                     ": admitted at the members' next commit, or within ",
                     Seconds(options_.join_wait)),
        session.node_name);
  NotifyJoinPending(job);
}

void JobManager::NotifyJoinPending(Job& job) {
  v1::CoordinatorMessage message;
  v1::JoinPending* pending = message.mutable_join_pending();
  pending->set_job(job.name);
  pending->set_generation(job.generation);
  for (const PendingJoin& join : job.pending_joins) {
    pending->add_nodes(join.node_name);
  }
  const OutboundMessage shared = Outbound(std::move(message));
  for (const Member& member : job.members) SendToMember(member, shared);
}

absl::Status JobManager::AdmitJoins(Session& session,
                                    const v1::AdmitJoins& admit) {
  BATON_RETURN_IF_ERROR(ValidateIdentifier("AdmitJoins.job", admit.job()));
  Job* job = FindJob(admit.job());
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("AdmitJoins.job: job \"", admit.job(),
                     "\" is unknown to the coordinator"));
  }
  const Member* member = FindMember(*job, session.node_name);
  if (member == nullptr || member->session != session.id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node \"", session.node_name, "\" is not a member of job \"", job->name,
        "\" on this session: it admits no one"));
  }
  // Another member's commit, or the deadline, admitted them already.
  if (job->state != v1::JOB_STATE_RUNNING ||
      admit.generation() != job->generation) {
    return absl::OkStatus();
  }
  // Even with nobody left waiting the generation ends: the trainer that
  // asked stopped at its commit and waits for the next one.
  AdmitPending(*job, absl::StrCat("node ", session.node_name,
                                  "'s trainers reached a commit"));
  return absl::OkStatus();
}

void JobManager::AdmitPending(Job& job, const std::string& why) {
  const absl::Time now = clock_->Now();
  std::vector<PendingJoin> pending;
  pending.swap(job.pending_joins);
  std::vector<std::string> admitted;
  for (const PendingJoin& join : pending) {
    Session* session = sessions_->Find(join.session);
    if (session == nullptr || FindMember(job, join.node_name) != nullptr) {
      continue;  // its agent is gone, or it is a member already
    }
    AddJoiner(job, *session, join.seq, join.join);
    admitted.push_back(join.node_name);
  }
  const std::string reason =
      admitted.empty()
          ? absl::StrCat(why, "; the nodes that waited to join are gone")
          : absl::StrCat("node", admitted.size() == 1 ? " " : "s ",
                         absl::StrJoin(admitted, ", "),
                         admitted.size() == 1 ? " joins" : " join",
                         " the running job (", why, ")");
  const int64_t aborted = job.generation;
  v1::CoordinatorMessage notice;
  auto* abort = notice.mutable_generation_aborted();
  abort->set_job(job.name);
  abort->set_aborted_generation(aborted);
  abort->set_new_generation(aborted + 1);
  abort->set_reason(reason);
  const OutboundMessage shared = Outbound(std::move(notice));
  // Only the members of the aborted generation were in it.
  for (const Member& member : job.members) {
    if (member.node_rank >= 0) SendToMember(member, shared);
  }
  job.generation = aborted + 1;
  job.state = v1::JOB_STATE_REFORMING;
  job.reforms.Start(now, aborted, job.generation, ReformCause::kJoined,
                    admitted.empty() ? std::string() : admitted.front(), reason,
                    job.membership.nodes_size());
  listener_->OnGenerationAborted(job.name, aborted, reason);
  Seal(job);
}

}  // namespace baton::coordinator
