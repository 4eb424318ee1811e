// Recovery: rebuilding a running job from its agents' reports after a
// coordinator restart (or taking a reconnected agent's report for a job the
// coordinator still knows).
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log_context.h"
#include "common/status_macros.h"
#include "common/validation.h"
#include "coordinator/job.h"
#include "coordinator/job_manager.h"
#include "glog/logging.h"

namespace baton::coordinator {

using job_internal::Ended;
using job_internal::StateName;
using job_internal::ValidateLocalSize;
using job_internal::ValidateSizing;

absl::Status JobManager::Rejoin(Session& session, uint64_t seq,
                                const v1::RejoinJob& rejoin) {
  const v1::Membership& m = rejoin.membership();
  BATON_RETURN_IF_ERROR(
      ValidateIdentifier("RejoinJob.membership.job", m.job()));
  BATON_RETURN_IF_ERROR(ValidateSizing("RejoinJob", rejoin.expected_nodes(),
                                       rejoin.min_nodes(),
                                       rejoin.partition_bytes()));
  if (m.generation() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RejoinJob.membership.generation is ", m.generation(),
        ": rejoin only a sealed generation (>= 1); join to form a job"));
  }
  if (m.nodes_size() < 1 || m.nodes_size() > rejoin.expected_nodes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RejoinJob.membership has ", m.nodes_size(),
                     " nodes: it must have 1..expected_nodes (",
                     rejoin.expected_nodes(), ")"));
  }
  absl::flat_hash_set<std::string> names;
  int32_t offset = 0;
  bool lists_self = false;
  for (int i = 0; i < m.nodes_size(); ++i) {
    const v1::NodeInfo& node = m.nodes(i);
    const std::string what =
        absl::StrCat("RejoinJob.membership.nodes[", i, "]");
    BATON_RETURN_IF_ERROR(
        ValidateIdentifier(what + ".node_name", node.node_name()));
    BATON_RETURN_IF_ERROR(ValidateHostPort(
        what + ".data_address", node.data_address(), PortZero::kAllowed));
    BATON_RETURN_IF_ERROR(
        ValidateLocalSize(what + ".local_size", node.local_size()));
    if (!names.insert(node.node_name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ".node_name \"", node.node_name(), "\" appears twice"));
    }
    if (node.node_rank() != i || node.rank_offset() != offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has node_rank ", node.node_rank(), " and rank_offset ",
          node.rank_offset(), "; expected ", i, " and ", offset,
          ": report the membership exactly as it was sealed"));
    }
    offset += node.local_size();
    lists_self = lists_self || node.node_name() == session.node_name;
  }
  if (m.world_size() != offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("RejoinJob.membership.world_size is ", m.world_size(),
                     " but its nodes hold ", offset, " ranks"));
  }
  if (m.data_plane_secret().size() != kDataPlaneSecretBytes) {
    // Never quoted: it is a secret.
    return absl::InvalidArgumentError(absl::StrCat(
        "RejoinJob.membership.data_plane_secret has ",
        m.data_plane_secret().size(), " bytes; a sealed generation's has ",
        kDataPlaneSecretBytes,
        ": report the membership exactly as it was sealed (agent and "
        "coordinator must run one build of baton)"));
  }
  if (!lists_self) {
    return absl::InvalidArgumentError(
        absl::StrCat("RejoinJob.membership does not list this agent's node \"",
                     session.node_name, "\""));
  }

  Job* job = FindJob(m.job());
  if (job != nullptr && job->recovered && !Ended(job->state) &&
      m.generation() == job->generation &&
      m.data_plane_secret() != job->membership.data_plane_secret() &&
      m.sealed_unix_ms() > job->membership.sealed_unix_ms()) {
    // Two runs of this job name report the same generation: the coordinator
    // forgot the name's last generation when it restarted, and a new run
    // counted from 1 again. The one rebuilt first was sealed earlier: it is
    // a run that ended while its members could not hear it. Tell them, and
    // rebuild the live run from this report.
    const std::string reason = absl::StrCat(
        "this run of job \"", job->name, "\" (generation ", job->generation,
        ", sealed at ",
        absl::FormatTime(absl::FromUnixMillis(job->membership.sealed_unix_ms()),
                         absl::UTCTimeZone()),
        ") ended before the coordinator restarted: node ", session.node_name,
        " reported a run of the same name sealed later");
    LOG(WARNING) << LogPrefix({job->name, job->generation, session.node_name})
                 << reason;
    EndJob(*job, v1::JOB_STATE_FAILED, reason);
    jobs_.erase(m.job());
    listener_->OnJobRemoved(m.job());
    job = nullptr;
  }
  const bool created = job == nullptr;
  if (created) {
    // Recovery: the coordinator restarted and knows nothing of this job.
    // Rebuild it, at the same generation, from the agent's view; the other
    // members get a liveness timeout to report in. Its history is soft state
    // the agents do not report: the rebuilt job has no re-form records and
    // counts nodes lost and joined from 0, so status shows only what
    // happened since the restart (the first re-form aborts the recovered
    // generation) and the metrics' counters reset, as after any restart.
    job = &NewJob(m.job(), m.generation(), rejoin.expected_nodes(),
                  rejoin.min_nodes(), rejoin.partition_bytes(),
                  session.node_name);
    job->state = v1::JOB_STATE_RUNNING;
    job->recovered = true;
    job->SetMembership(m);
    for (const v1::NodeInfo& node : m.nodes()) {
      Member member;
      member.node_name = node.node_name();
      member.data_address = node.data_address();
      member.local_size = node.local_size();
      member.node_rank = node.node_rank();
      member.rank_offset = node.rank_offset();
      member.connected = false;
      member.joined = job->created;
      member.reconnect_deadline = job->created + options_.liveness_timeout;
      job->AddMember(std::move(member));
    }
    job->reason = absl::StrCat("generation ", m.generation(),
                               " recovered after a coordinator restart");
    last_generation_[job->name] =
        std::max(last_generation_[job->name], m.generation());
    Event(*job, "recovered",
          absl::StrCat("rebuilt generation ", m.generation(), " (",
                       m.nodes_size(), " nodes, world size ", m.world_size(),
                       ") from node ", session.node_name, "'s report"),
          session.node_name);
  } else {
    if (Ended(job->state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job \"", job->name, "\" has ", StateName(job->state),
                       " (", job->reason, "): start a new run"));
    }
    if (m.generation() < job->generation) {
      return absl::AbortedError(
          absl::StrCat("job \"", job->name, "\" is at generation ",
                       job->generation, "; this agent reported generation ",
                       m.generation(), ": re-sync by joining again"));
    }
    if (m.generation() > job->generation ||
        job->state != v1::JOB_STATE_RUNNING) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job->name, "\" is ", StateName(job->state),
          " at generation ", job->generation, " here; this agent reported ",
          "sealed generation ", m.generation(), ": join again"));
    }
    if (m.nodes_size() != job->membership.nodes_size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("RejoinJob.membership of job \"", job->name, "\" has ",
                       m.nodes_size(), " nodes; the recovered generation has ",
                       job->membership.nodes_size(), ": join again"));
    }
    if (m.data_plane_secret() != job->membership.data_plane_secret()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RejoinJob.membership of job \"", job->name, "\" generation ",
          m.generation(),
          " carries another data-plane secret than the recovered one: join "
          "again"));
    }
    for (int i = 0; i < m.nodes_size(); ++i) {
      const v1::NodeInfo& ours = job->membership.nodes(i);
      const v1::NodeInfo& theirs = m.nodes(i);
      if (ours.node_name() != theirs.node_name() ||
          ours.data_address() != theirs.data_address() ||
          ours.local_size() != theirs.local_size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "RejoinJob.membership of job \"", job->name, "\" generation ",
            m.generation(), " differs from the recovered one at node rank ", i,
            ": join again"));
      }
    }
  }

  Member* member = FindMember(*job, session.node_name);
  if (member == nullptr || member->finished) {
    // Lost or left while the generation stayed (the job is finishing).
    return absl::FailedPreconditionError(absl::StrCat(
        "node \"", session.node_name, "\" is no longer a member of job \"",
        job->name, "\" generation ", job->generation, ": join again"));
  }
  if (member->connected && member->session != session.id &&
      member->agent_instance != session.agent_instance) {
    return absl::AlreadyExistsError(absl::StrCat(
        "node name \"", session.node_name, "\" of job \"", job->name,
        "\" is already connected from another agent: give each agent a "
        "unique node name"));
  }
  member->connected = true;
  member->session = session.id;
  member->agent_instance = session.agent_instance;
  session.jobs.insert(job->name);
  if (!created) {
    LOG(INFO) << LogPrefix({job->name, job->generation, session.node_name})
              << "re-reported its state";
  }

  SendJoinAccepted(*job, session.id, seq);
  listener_->OnJobRecovered(job->membership, rejoin, session.node_name,
                            created);
  // Joins held by a stale run that ended above, for the name's next run.
  JoinReleased();
  return absl::OkStatus();
}

}  // namespace baton::coordinator
