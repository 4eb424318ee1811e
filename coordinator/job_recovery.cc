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
#include "common/membership_view.h"
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
  BATON_RETURN_IF_ERROR(ValidateMembershipView("RejoinJob.membership", m,
                                               rejoin.expected_nodes()));
  for (int i = 0; i < m.local_sizes_size(); ++i) {
    BATON_RETURN_IF_ERROR(ValidateLocalSize(
        absl::StrCat("RejoinJob.membership.local_sizes[", i, "].local_size"),
        m.local_sizes(i).local_size()));
  }
  const v1::NodeInfo& self = m.self();
  if (self.node_name() != session.node_name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RejoinJob.membership.self names node \"", self.node_name(),
        "\", not this agent's node \"", session.node_name, "\""));
  }
  absl::flat_hash_set<std::string> names;
  for (int i = 0; i < m.nodes_size(); ++i) {
    const v1::NodeInfo& node = m.nodes(i);
    const std::string what =
        absl::StrCat("RejoinJob.membership.nodes[", i, "]");
    BATON_RETURN_IF_ERROR(
        ValidateIdentifier(what + ".node_name", node.node_name()));
    BATON_RETURN_IF_ERROR(ValidateHostPort(
        what + ".data_address", node.data_address(), PortZero::kAllowed));
    if (!names.insert(node.node_name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ".node_name \"", node.node_name(), "\" appears twice"));
    }
  }
  BATON_RETURN_IF_ERROR(
      ValidateHostPort("RejoinJob.membership.self.data_address",
                       self.data_address(), PortZero::kAllowed));
  if (m.data_plane_secret().size() != kDataPlaneSecretBytes) {
    // Never quoted: it is a secret.
    return absl::InvalidArgumentError(absl::StrCat(
        "RejoinJob.membership.data_plane_secret has ",
        m.data_plane_secret().size(), " bytes; a sealed generation's has ",
        kDataPlaneSecretBytes,
        ": report the membership exactly as it was sealed (agent and "
        "coordinator must run one build of baton)"));
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
  if (job == nullptr && m.nodes().empty()) {
    // Only node ranks 0 and 1 hold the table to rebuild the job from: wait
    // for one of them (ReleaseParkedRejoins), or give up at the deadline.
    ParkRejoin(session, seq, rejoin);
    return absl::OkStatus();
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
    v1::Membership table = m;
    table.clear_self();
    job->SetMembership(std::move(table));
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
      member.disconnected_by = "the coordinator restarted";
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
    if (m.num_nodes() != job->membership.nodes_size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("RejoinJob.membership of job \"", job->name, "\" has ",
                       m.num_nodes(), " nodes; the recovered generation has ",
                       job->membership.nodes_size(), ": join again"));
    }
    if (m.data_plane_secret() != job->membership.data_plane_secret()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RejoinJob.membership of job \"", job->name, "\" generation ",
          m.generation(),
          " carries another data-plane secret than the recovered one: join "
          "again"));
    }
    // The table where the agent has it, its own entry everywhere.
    const auto same = [](const v1::NodeInfo& a, const v1::NodeInfo& b) {
      return a.node_name() == b.node_name() &&
             a.data_address() == b.data_address() &&
             a.local_size() == b.local_size() &&
             a.rank_offset() == b.rank_offset();
    };
    for (int i = -1; i < m.nodes_size(); ++i) {
      const v1::NodeInfo& theirs = i < 0 ? self : m.nodes(i);
      if (!same(job->membership.nodes(theirs.node_rank()), theirs)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "RejoinJob.membership of job \"", job->name, "\" generation ",
            m.generation(), " differs from the recovered one at node rank ",
            theirs.node_rank(), ": join again"));
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
  if (created) ReleaseParkedRejoins(job->name);
  return absl::OkStatus();
}

void JobManager::ParkRejoin(Session& session, uint64_t seq,
                            const v1::RejoinJob& rejoin) {
  ParkedRejoin parked;
  parked.session = session.id;
  parked.seq = seq;
  parked.rejoin = rejoin;
  parked.deadline = clock_->Now() + options_.liveness_timeout;
  // A newer report of the same node replaces its older one.
  parked_rejoins_[rejoin.membership().job()][session.node_name] =
      std::move(parked);
  VLOG(1) << LogPrefix({rejoin.membership().job(),
                        rejoin.membership().generation(), session.node_name})
          << "re-report waits for node rank 0 or 1, which hold the table";
}

void JobManager::ReleaseParkedRejoins(const std::string& job) {
  auto it = parked_rejoins_.find(job);
  if (it == parked_rejoins_.end()) return;
  std::vector<ParkedRejoin> released;
  released.reserve(it->second.size());
  for (auto& [node, parked] : it->second) released.push_back(std::move(parked));
  parked_rejoins_.erase(it);
  // In node-rank order, whatever order they came in.
  std::sort(released.begin(), released.end(),
            [](const ParkedRejoin& a, const ParkedRejoin& b) {
              return a.rejoin.membership().self().node_rank() <
                     b.rejoin.membership().self().node_rank();
            });
  for (const ParkedRejoin& parked : released) {
    Session* session = sessions_->Find(parked.session);
    if (session == nullptr) continue;  // its agent is gone
    const absl::Status status = Rejoin(*session, parked.seq, parked.rejoin);
    if (!status.ok()) ReplyError(parked.session, parked.seq, job, status);
  }
}

void JobManager::ExpireParkedRejoins(absl::Time now) {
  std::vector<std::pair<std::string, ParkedRejoin>> expired;
  for (auto job = parked_rejoins_.begin(); job != parked_rejoins_.end();) {
    auto& nodes = job->second;
    for (auto node = nodes.begin(); node != nodes.end();) {
      if (now < node->second.deadline) {
        ++node;
        continue;
      }
      expired.emplace_back(node->first, std::move(node->second));
      nodes.erase(node++);
    }
    if (nodes.empty()) {
      parked_rejoins_.erase(job++);
    } else {
      ++job;
    }
  }
  std::sort(expired.begin(), expired.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [node, parked] : expired) {
    const v1::Membership& m = parked.rejoin.membership();
    LOG(WARNING) << LogPrefix({m.job(), m.generation(), node})
                 << "no holder of the node table re-reported; the node joins "
                    "again";
    ReplyError(
        parked.session, parked.seq, m.job(),
        absl::FailedPreconditionError(absl::StrCat(
            "neither node rank 0 nor 1 of job \"", m.job(), "\" generation ",
            m.generation(), " re-reported within ",
            absl::FormatDuration(options_.liveness_timeout),
            " of this node after the coordinator restarted, and only they "
            "hold the generation's node table: join again")));
  }
}

}  // namespace baton::coordinator
