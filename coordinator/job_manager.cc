#include "coordinator/job_manager.h"

#include <algorithm>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log_context.h"
#include "common/membership_view.h"
#include "common/status_macros.h"
#include "common/validation.h"
#include "coordinator/job.h"
#include "glog/logging.h"

namespace baton::coordinator {
namespace job_internal {

std::string StateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_FORMING:
      return "forming";
    case v1::JOB_STATE_RUNNING:
      return "running";
    case v1::JOB_STATE_REFORMING:
      return "re-forming";
    case v1::JOB_STATE_FAILED:
      return "failed";
    case v1::JOB_STATE_FINISHED:
      return "finished";
    default:
      return "unknown";
  }
}

bool Ended(v1::JobState state) {
  return state == v1::JOB_STATE_FAILED || state == v1::JOB_STATE_FINISHED;
}

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

absl::Status ValidateSizing(const std::string& message, int32_t expected_nodes,
                            int32_t min_nodes, int64_t partition_bytes) {
  if (expected_nodes < 1 || expected_nodes > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(message, ".expected_nodes is ", expected_nodes,
                     ": give the job's node count, 1..", kMaxNodes));
  }
  if (min_nodes < 0 || min_nodes > expected_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        message, ".min_nodes is ", min_nodes, ": it must be in 0..",
        expected_nodes, " (expected_nodes; 0 means expected_nodes)"));
  }
  if (partition_bytes != 0 &&
      (partition_bytes < 8 || partition_bytes > kMaxPartitionBytes ||
       partition_bytes % 8 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        message, ".partition_bytes is ", partition_bytes,
        ": give 0 (the coordinator's default) or a multiple of 8 in 8..",
        kMaxPartitionBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateLocalSize(const std::string& what, int32_t local_size) {
  if (local_size < 1 || local_size > kMaxLocalSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", local_size,
        ": give the number of trainers on the node, 1..", kMaxLocalSize));
  }
  return absl::OkStatus();
}

}  // namespace job_internal

using job_internal::Ended;
using job_internal::kMaxNodes;
using job_internal::Seconds;
using job_internal::StateName;
using job_internal::ValidateLocalSize;
using job_internal::ValidateSizing;
JobManager::JobManager(const CoordinatorOptions& options, Clock* clock,
                       SessionManager* sessions, JobListener* listener,
                       SecretSource* secrets)
    : options_(options),
      clock_(clock),
      sessions_(sessions),
      listener_(listener),
      secrets_(secrets) {}

JobManager::~JobManager() = default;

JobManager::Job& JobManager::NewJob(const std::string& name, int64_t generation,
                                    int32_t expected_nodes, int32_t min_nodes,
                                    int64_t partition_bytes,
                                    const std::string& creator) {
  auto job = std::make_unique<Job>();
  job->name = name;
  job->generation = generation;
  job->expected_nodes = expected_nodes;
  job->min_nodes = min_nodes == 0 ? expected_nodes : min_nodes;
  job->partition_bytes =
      partition_bytes == 0 ? options_.partition_bytes : partition_bytes;
  job->creator = creator;
  job->created = clock_->Now();
  Job& ref = *job;
  jobs_[name] = std::move(job);
  return ref;
}

JobManager::Job* JobManager::FindJob(const std::string& job) {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const JobManager::Job* JobManager::FindJob(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second.get();
}

JobManager::Member* JobManager::FindMember(Job& job,
                                           const std::string& node_name) {
  auto it = job.member_index.find(node_name);
  return it == job.member_index.end() ? nullptr : &job.members[it->second];
}

absl::Status JobManager::CheckJoinMatchesJob(const Job& job,
                                             const v1::JoinJob& join,
                                             const Session& session) const {
  const int32_t min_nodes =
      join.min_nodes() == 0 ? join.expected_nodes() : join.min_nodes();
  const int64_t partition_bytes = join.partition_bytes() == 0
                                      ? options_.partition_bytes
                                      : join.partition_bytes();
  const auto disagree = [&](const char* field, int64_t theirs, int64_t ours) {
    return absl::InvalidArgumentError(
        absl::StrCat("JoinJob.", field, " is ", theirs, " from node \"",
                     session.node_name, "\" but job \"", job.name, "\" has ",
                     field, "=", ours, " (set by node \"", job.creator,
                     "\"): give every agent of the job the same value"));
  };
  if (join.expected_nodes() != job.expected_nodes) {
    return disagree("expected_nodes", join.expected_nodes(),
                    job.expected_nodes);
  }
  if (min_nodes != job.min_nodes) {
    return disagree("min_nodes", min_nodes, job.min_nodes);
  }
  if (partition_bytes != job.partition_bytes) {
    return disagree("partition_bytes", partition_bytes, job.partition_bytes);
  }
  // Node ranks place nodes in a run's first seal only (Seal): later
  // joiners' ranks are not used, so neither are they refused.
  if (!join.has_node_rank() || job.state != v1::JOB_STATE_FORMING) {
    return absl::OkStatus();
  }
  for (const Member& member : job.members) {
    if (member.node_rank < 0 && member.node_name != session.node_name &&
        member.requested_node_rank == join.node_rank()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "JoinJob.node_rank ", join.node_rank(), " from node \"",
          session.node_name, "\" is already taken by node \"", member.node_name,
          "\" in job \"", job.name,
          "\": give each node its own node rank (the trainers' GROUP_RANK)"));
    }
  }
  return absl::OkStatus();
}

absl::Status JobManager::Join(Session& session, uint64_t seq,
                              const v1::JoinJob& join) {
  BATON_RETURN_IF_ERROR(ValidateIdentifier("JoinJob.job", join.job()));
  BATON_RETURN_IF_ERROR(ValidateHostPort(
      "JoinJob.data_address", join.data_address(), PortZero::kAllowed));
  BATON_RETURN_IF_ERROR(
      ValidateLocalSize("JoinJob.local_size", join.local_size()));
  BATON_RETURN_IF_ERROR(ValidateSizing("JoinJob", join.expected_nodes(),
                                       join.min_nodes(),
                                       join.partition_bytes()));
  if (join.has_node_rank() &&
      (join.node_rank() < 0 || join.node_rank() >= join.expected_nodes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JoinJob.node_rank is ", join.node_rank(), " but must be in 0..",
        join.expected_nodes() - 1,
        " (expected_nodes - 1): fix the trainers' GROUP_RANK, or unset it and "
        "let the coordinator place the node"));
  }
  Job* job = FindJob(join.job());
  if (job != nullptr && Ended(job->state) && join.last_generation() > 0 &&
      join.last_generation() <= job->generation) {
    // The agent ran in this run and lost its session while it ended: tell
    // it how it ended, as the members were told, rather than start a new
    // run it would wait in alone.
    v1::CoordinatorMessage message;
    v1::JobEnded* ended = message.mutable_job_ended();
    ended->set_job(job->name);
    ended->set_state(job->state);
    ended->set_reason(job->reason);
    sessions_->Send(session.id, Outbound(std::move(message)));
    return absl::OkStatus();
  }
  if (job != nullptr && Ended(job->state)) {
    // A finished or failed job's name may be reused by a new run.
    LOG(INFO) << LogPrefix({join.job(), job->generation, session.node_name})
              << StateName(job->state)
              << " job replaced by a new run (join from node "
              << session.node_name << ")";
    jobs_.erase(join.job());
    listener_->OnJobRemoved(join.job());
    job = nullptr;
  }
  if (job == nullptr) {
    job = &NewJob(join.job(), last_generation_[join.job()] + 1,
                  join.expected_nodes(), join.min_nodes(),
                  join.partition_bytes(), session.node_name);
  } else {
    BATON_RETURN_IF_ERROR(CheckJoinMatchesJob(*job, join, session));
  }

  if (Member* existing = FindMember(*job, session.node_name)) {
    if (existing->finished) {
      // The node finished this run and starts the next (its trainers shut
      // down and initialized again) while other nodes still finish this
      // one: it joins the next run once this one ended, as a new member.
      job->held_joins.push_back({session.id, seq, join});
      Event(*job, "join held",
            absl::StrCat("node ", session.node_name,
                         " finished this run and joins the next once every "
                         "node finished it"),
            session.node_name);
      return absl::OkStatus();
    }
    if (existing->agent_instance != session.agent_instance) {
      return absl::AlreadyExistsError(absl::StrCat(
          "node name \"", session.node_name, "\" is already a member of job \"",
          job->name, "\" (agent at ", existing->data_address,
          "): give each agent a unique node name"));
    }
    if (existing->data_address != join.data_address() ||
        existing->local_size != join.local_size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node \"", session.node_name, "\" already joined job \"", job->name,
          "\" with data_address ", existing->data_address, " and local_size ",
          existing->local_size, ": leave the job before joining differently"));
    }
    // The same agent joining again (for example after a reconnect): answer
    // as if it were the first time.
    existing->session = session.id;
    existing->connected = true;
    session.jobs.insert(job->name);
    SendJoinAccepted(*job, session.id, seq);
    if (job->state == v1::JOB_STATE_RUNNING && existing->node_rank >= 0) {
      SendMembership(*job, *existing);
    }
    return absl::OkStatus();
  }

  const bool running = job->state == v1::JOB_STATE_RUNNING;
  if (running &&
      static_cast<int32_t>(job->members.size() +
                           job->PendingJoinsBesides(session.node_name)) >=
          job->expected_nodes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job->name, "\" is sealed and full (generation ",
        job->generation, " has ", job->members.size(), " of ",
        job->expected_nodes, " nodes, ", job->pending_joins.size(),
        " more waiting to join): start the new node under another job name, "
        "or raise expected_nodes for a new run"));
  }
  if (running) {
    // A running job below expected_nodes (it re-sealed with min_nodes
    // survivors) grows at its members' next commit (job_growth.cc).
    HoldForCommit(*job, session, seq, join);
    return absl::OkStatus();
  }
  AddJoiner(*job, session, seq, join);
  const int32_t needed = job->state == v1::JOB_STATE_REFORMING
                             ? job->min_nodes
                             : job->expected_nodes;
  if (static_cast<int32_t>(job->members.size()) >= needed) {
    Seal(*job);
  } else if (job->state == v1::JOB_STATE_FORMING) {
    job->reason =
        absl::StrCat("waiting for ", job->expected_nodes - job->members.size(),
                     " more node(s) to join");
  }
  return absl::OkStatus();
}

void JobManager::PlaceRequestedRanks(std::vector<Member>& members) {
  const size_t n = members.size();
  std::vector<Member> placed(n);
  std::vector<bool> taken(n, false);
  std::vector<Member> rest;
  for (Member& m : members) {
    const size_t r = static_cast<size_t>(m.requested_node_rank);
    if (m.requested_node_rank >= 0 && r < n && !taken[r]) {
      taken[r] = true;
      placed[r] = std::move(m);
    } else {
      rest.push_back(std::move(m));
    }
  }
  size_t slot = 0;
  for (Member& m : rest) {
    while (taken[slot]) ++slot;
    taken[slot] = true;
    placed[slot] = std::move(m);
  }
  members = std::move(placed);
}

void JobManager::Seal(Job& job) {
  // Members sealed before keep their rank; a node that was in the name's
  // last sealed generation (it left and came back, or this is the name's
  // next run) takes its rank from there; other newcomers follow in join
  // order (std::stable_sort keeps it among equal keys).
  const absl::flat_hash_map<std::string, int32_t>& last =
      last_node_ranks_[job.name];
  const auto key = [&last](const Member& m) {
    if (m.node_rank >= 0) return m.node_rank;
    auto it = last.find(m.node_name);
    return it == last.end() ? kMaxNodes : it->second;
  };
  std::stable_sort(
      job.members.begin(), job.members.end(),
      [&key](const Member& a, const Member& b) { return key(a) < key(b); });
  // In a run's first seal a node that its launcher gave a rank
  // (JoinJob.node_rank, unique among them) takes exactly that one, and the
  // others fill the gaps in the order above. Later seals ignore it: a node
  // that joins a running job comes last, and the survivors keep their order.
  if (job.state == v1::JOB_STATE_FORMING) PlaceRequestedRanks(job.members);
  job.Reindex();
  v1::Membership membership;
  membership.set_job(job.name);
  membership.set_generation(job.generation);
  membership.set_store_prefix(
      absl::StrCat("baton/", job.name, "/", job.generation, "/"));
  // A new one per generation: a node that left cannot prove the next one's.
  membership.set_data_plane_secret(secrets_->Draw(kDataPlaneSecretBytes));
  membership.set_sealed_unix_ms(absl::ToUnixMillis(clock_->Now()));
  int32_t offset = 0;
  for (size_t i = 0; i < job.members.size(); ++i) {
    Member& member = job.members[i];
    member.node_rank = static_cast<int32_t>(i);
    member.rank_offset = offset;
    offset += member.local_size;
    v1::NodeInfo* node = membership.add_nodes();
    node->set_node_name(member.node_name);
    node->set_data_address(member.data_address);
    node->set_node_rank(member.node_rank);
    node->set_local_size(member.local_size);
    node->set_rank_offset(member.rank_offset);
  }
  job.unsealed_names.clear();
  membership.set_world_size(offset);
  CompleteMembership(&membership);
  absl::flat_hash_map<std::string, int32_t>& ranks = last_node_ranks_[job.name];
  ranks.clear();
  for (const Member& member : job.members) {
    ranks[member.node_name] = member.node_rank;
  }
  job.SetMembership(membership);
  job.reforms.Sealed(clock_->Now(), membership.nodes_size());
  job.state = v1::JOB_STATE_RUNNING;
  job.reason = absl::StrCat("generation ", job.generation, " sealed with ",
                            job.members.size(), " nodes, world size ", offset);
  last_generation_[job.name] = job.generation;
  Event(job, "sealed", job.reason);
  // Each member gets its own view: O(1) bytes, the table only at the keepers.
  for (const Member& member : job.members) SendMembership(job, member);
  listener_->OnGenerationSealed(membership);
}

void JobManager::LoseMember(Job& job, const std::string& node_name,
                            ReformCause cause, const std::string& why) {
  auto it =
      std::find_if(job.members.begin(), job.members.end(),
                   [&](const Member& m) { return m.node_name == node_name; });
  if (it == job.members.end()) return;
  if (it->connected) {
    if (Session* session = sessions_->Find(it->session)) {
      session->jobs.erase(job.name);
    }
  }
  job.RemoveMember(it);
  const std::string what = absl::StrCat("node ", node_name, " ", why);

  if (job.state == v1::JOB_STATE_FORMING) {
    ++job.members_lost;
    Event(job, "lost", what, node_name);
    if (job.members.empty()) {
      LOG(INFO) << LogPrefix({job.name, job.generation, node_name})
                << "forgotten: every node left before it was sealed";
      const std::string name = job.name;
      jobs_.erase(name);
      listener_->OnJobRemoved(name);
      return;
    }
    job.reason =
        absl::StrCat("waiting for ", job.expected_nodes - job.members.size(),
                     " more node(s) to join");
    return;
  }
  if (job.finishing) {
    Event(job, "leave", what, node_name);
    const bool all_finished =
        std::all_of(job.members.begin(), job.members.end(),
                    [](const Member& m) { return m.finished; });
    if (all_finished) {
      EndJob(job, v1::JOB_STATE_FINISHED,
             absl::StrCat("training finished (last: ", what, ")"));
    }
    return;
  }

  ++job.members_lost;
  Event(job, "lost", what, node_name);
  if (job.state == v1::JOB_STATE_RUNNING) {
    // The first loss ends the running generation and tells the survivors.
    // Later losses while re-forming only go to the event log: a mass failure
    // of k nodes must not cost k broadcasts to every survivor.
    const int64_t aborted = job.generation;
    const absl::Time now = clock_->Now();
    job.generation = aborted + 1;
    job.state = v1::JOB_STATE_REFORMING;
    job.reform_deadline = now + options_.reform_timeout;
    job.reforms.Start(now, aborted, job.generation, cause, node_name, what,
                      job.membership.nodes_size());
    v1::CoordinatorMessage notice;
    auto* abort = notice.mutable_generation_aborted();
    abort->set_job(job.name);
    abort->set_lost_node(node_name);
    abort->set_reason(what);
    abort->set_aborted_generation(aborted);
    abort->set_new_generation(job.generation);
    const OutboundMessage shared = Outbound(std::move(notice));
    for (const Member& member : job.members) SendToMember(member, shared);
    listener_->OnGenerationAborted(job.name, aborted, what);
  }
  if (job.members.empty()) {
    EndJob(job, v1::JOB_STATE_FAILED,
           absl::StrCat("every node was lost (last: ", what, ")"));
    return;
  }
  job.reason =
      absl::StrCat(what, "; waiting until ", Seconds(options_.reform_timeout),
                   " after the loss for ",
                   job.min_nodes - static_cast<int32_t>(job.members.size()),
                   " more node(s) (have ", job.members.size(), ", need ",
                   job.min_nodes, ")");
  Event(job, "reforming", job.reason);
}

void JobManager::ResealIfWhole(const std::string& name) {
  Job* job = FindJob(name);
  if (job != nullptr && job->state == v1::JOB_STATE_REFORMING &&
      static_cast<int32_t>(job->members.size()) >= job->min_nodes) {
    Seal(*job);
  }
}

void JobManager::EndJob(Job& job, v1::JobState state,
                        const std::string& reason) {
  job.state = state;
  job.reason = reason;
  job.ended = clock_->Now();
  job.reforms.Ended(job.ended, static_cast<int32_t>(job.members.size()),
                    absl::StrCat(StateName(state), ": ", reason));
  Event(job, state == v1::JOB_STATE_FINISHED ? "finished" : "failed", reason);
  v1::CoordinatorMessage message;
  auto* ended = message.mutable_job_ended();
  ended->set_job(job.name);
  ended->set_state(state);
  ended->set_reason(reason);
  const OutboundMessage shared = Outbound(std::move(message));
  for (Member& member : job.members) {
    SendToMember(member, shared);
    if (member.connected) {
      if (Session* session = sessions_->Find(member.session)) {
        session->jobs.erase(job.name);
      }
    }
    member.connected = false;
  }
  // Nodes that waited to join it hear that it ended, as members do.
  for (const PendingJoin& pending : job.pending_joins) {
    sessions_->Send(pending.session, shared);
  }
  job.pending_joins.clear();
  listener_->OnJobEnded(job.name, reason);
  for (HeldJoin& held : job.held_joins) {
    released_joins_.push_back(std::move(held));
  }
  job.held_joins.clear();
}

absl::Status JobManager::Cancel(const std::string& name,
                                const std::string& reason) {
  Job* job = FindJob(name);
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("job \"", name, "\" is unknown to the coordinator"));
  }
  if (Ended(job->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", name, "\" has already ", StateName(job->state),
                     ": ", job->reason));
  }
  EndJob(*job, v1::JOB_STATE_FAILED, reason);
  JoinReleased();
  return absl::OkStatus();
}

void JobManager::JoinReleased() {
  std::vector<HeldJoin> released;
  released.swap(released_joins_);
  for (const HeldJoin& held : released) {
    Session* session = sessions_->Find(held.session);
    if (session == nullptr) continue;  // its agent is gone
    const absl::Status status = Join(*session, held.seq, held.join);
    if (!status.ok())
      ReplyError(held.session, held.seq, held.join.job(), status);
  }
}

void JobManager::ReplyError(SessionId session, uint64_t seq,
                            const std::string& job,
                            const absl::Status& status) {
  v1::CoordinatorMessage error;
  error.set_reply_to(seq);
  error.mutable_error()->set_code(static_cast<int32_t>(status.code()));
  error.mutable_error()->set_message(std::string(status.message()));
  error.mutable_error()->set_job(job);
  sessions_->Send(session, Outbound(std::move(error)));
}

absl::Status JobManager::Leave(Session& session, const v1::LeaveJob& leave) {
  BATON_RETURN_IF_ERROR(ValidateIdentifier("LeaveJob.job", leave.job()));
  Job* job = FindJob(leave.job());
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("LeaveJob.job: job \"", leave.job(),
                     "\" is unknown to the coordinator"));
  }
  // A node waiting to join the running generation gives up.
  if (job->DropPendingJoin(session.node_name)) {
    Event(*job, "leave",
          absl::StrCat("node ", session.node_name, " no longer waits to join"),
          session.node_name);
    return absl::OkStatus();
  }
  // A node whose join waits for the next run (its trainers gave up on it)
  // leaves that.
  auto& held = job->held_joins;
  const auto held_end =
      std::remove_if(held.begin(), held.end(), [&](const HeldJoin& h) {
        const Session* other = sessions_->Find(h.session);
        return h.session == session.id ||
               (other != nullptr && other->node_name == session.node_name);
      });
  if (held_end != held.end()) {
    held.erase(held_end, held.end());
    Event(*job, "leave",
          absl::StrCat("node ", session.node_name,
                       " no longer joins the next run"),
          session.node_name);
    return absl::OkStatus();
  }
  Member* member = FindMember(*job, session.node_name);
  if (member == nullptr || member->session != session.id ||
      !member->connected) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node \"", session.node_name, "\" is not a member of job \"", job->name,
        "\" on this session: nothing to leave"));
  }
  const std::string reason = leave.reason().empty()
                                 ? std::string("no reason given")
                                 : leave.reason().substr(0, 512);
  if (!leave.finished() || job->state == v1::JOB_STATE_FORMING) {
    LoseMember(*job, session.node_name, ReformCause::kLeft,
               absl::StrCat("left the job: ", reason));
    ResealIfWhole(leave.job());
    JoinReleased();
    return absl::OkStatus();
  }
  member->finished = true;
  member->connected = false;
  session.jobs.erase(job->name);
  job->finishing = true;
  Event(*job, "leave",
        absl::StrCat("node ", session.node_name, " finished: ", reason),
        session.node_name);
  const bool all_finished =
      std::all_of(job->members.begin(), job->members.end(),
                  [](const Member& m) { return m.finished; });
  if (all_finished) {
    EndJob(*job, v1::JOB_STATE_FINISHED,
           absl::StrCat("all ", job->members.size(), " nodes finished"));
  }
  JoinReleased();
  return absl::OkStatus();
}

void JobManager::MoveMemberships(Session& old_session, Session& session) {
  for (const std::string& name : old_session.jobs) {
    Job* job = FindJob(name);
    if (job == nullptr) continue;
    Member* member = FindMember(*job, old_session.node_name);
    if (member == nullptr || member->session != old_session.id) continue;
    member->session = session.id;
    member->connected = true;
    session.jobs.insert(name);
    LOG(INFO) << LogPrefix({name, job->generation, session.node_name})
              << "reconnected on a new session";
  }
  old_session.jobs.clear();
}

void JobManager::OnSessionsLost(const std::vector<LostSession>& lost) {
  // Every loss first, then one re-seal per job: k nodes failing together
  // cost one new generation, not k.
  absl::btree_set<std::string> affected;
  for (const LostSession& entry : lost) {
    const Session& session = *entry.session;
    // Copy: losing a member edits session.jobs.
    const std::vector<std::string> names(session.jobs.begin(),
                                         session.jobs.end());
    for (const std::string& name : names) {
      Job* job = FindJob(name);
      if (job == nullptr) continue;
      Member* member = FindMember(*job, session.node_name);
      if (member == nullptr || member->session != session.id) continue;
      LoseMember(*job, session.node_name, ReformCause::kLost, entry.why);
      affected.insert(name);
    }
  }
  for (const std::string& name : affected) ResealIfWhole(name);
  JoinReleased();
}

void JobManager::OnSessionsDisconnected(
    const std::vector<LostSession>& sessions, absl::Time deadline) {
  for (const LostSession& entry : sessions) {
    const Session& session = *entry.session;
    for (const std::string& name : session.jobs) {
      Job* job = FindJob(name);
      if (job == nullptr || job->state != v1::JOB_STATE_RUNNING) continue;
      Member* member = FindMember(*job, session.node_name);
      if (member == nullptr || member->session != session.id) continue;
      // No session now: the loss below passes it by, a RejoinJob on the
      // agent's next session takes it back (JobManager::Rejoin).
      member->session = SessionId();
      member->connected = false;
      member->reconnect_deadline = deadline;
      member->disconnected_by =
          absl::StrCat("its session ended while the coordinator was stalled (",
                       entry.why, ")");
      Event(*job, "disconnected",
            absl::StrCat("node ", session.node_name,
                         "'s session ended while the coordinator was stalled (",
                         entry.why, "); it stays a member for ",
                         Seconds(options_.liveness_timeout),
                         " for its agent to re-report"),
            session.node_name);
    }
  }
  // Members of jobs that are not running are lost as usual.
  OnSessionsLost(sessions);
}

absl::Status JobManager::CheckCurrent(const std::string& job_name,
                                      int64_t generation,
                                      const std::string& node_name) const {
  const Job* job = FindJob(job_name);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "job \"", job_name, "\" is unknown to the coordinator: join it first"));
  }
  if (Ended(job->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_name, "\" has ", StateName(job->state), ": ",
                     job->reason));
  }
  if (generation < job->generation) {
    return absl::AbortedError(
        absl::StrCat("job \"", job_name, "\" is at generation ",
                     job->generation, "; this message is for generation ",
                     generation, ": the generation changed (", job->reason,
                     "), re-sync with the latest membership"));
  }
  if (generation > job->generation || job->state != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", generation, " of job \"", job_name,
                     "\" is not sealed (the job is ", StateName(job->state),
                     " at generation ", job->generation,
                     "): wait for the membership message"));
  }
  if (!node_name.empty()) {
    const bool member = job->sealed_nodes.contains(node_name);
    if (!member) {
      return absl::FailedPreconditionError(
          absl::StrCat("node \"", node_name, "\" is not a member of job \"",
                       job_name, "\" generation ", generation));
    }
  }
  return absl::OkStatus();
}

const v1::Membership* JobManager::Membership(const std::string& job) const {
  const Job* found = FindJob(job);
  if (found == nullptr || found->state != v1::JOB_STATE_RUNNING) {
    return nullptr;
  }
  return &found->membership;
}

int64_t JobManager::PartitionBytes(const std::string& job) const {
  const Job* found = FindJob(job);
  return found == nullptr ? 0 : found->partition_bytes;
}

void JobManager::SendJoinAccepted(const Job& job, SessionId session,
                                  uint64_t seq) {
  v1::CoordinatorMessage accepted;
  accepted.set_reply_to(seq);
  auto* body = accepted.mutable_join_accepted();
  body->set_job(job.name);
  body->set_state(job.state);
  body->set_nodes_joined(static_cast<int32_t>(job.members.size()));
  body->set_expected_nodes(job.expected_nodes);
  sessions_->Send(session, Outbound(std::move(accepted)));
}

void JobManager::SendMembership(const Job& job, const Member& member) {
  if (!member.connected) return;
  v1::CoordinatorMessage message;
  *message.mutable_membership() =
      MembershipView(job.membership, member.node_rank);
  SendToMember(member, Outbound(std::move(message)));
}

void JobManager::SendToMember(const Member& member,
                              const OutboundMessage& message) {
  if (member.connected) sessions_->Send(member.session, message);
}

void JobManager::Broadcast(const std::string& job,
                           const v1::CoordinatorMessage& message) {
  const Job* found = FindJob(job);
  if (found == nullptr) return;
  const OutboundMessage shared = Outbound(message);
  for (const Member& member : found->members) SendToMember(member, shared);
}

void JobManager::Event(Job& job, const std::string& kind,
                       const std::string& message, const std::string& node) {
  LOG(INFO) << LogPrefix({job.name, job.generation, node}) << kind << ": "
            << message;
  v1::JobEvent event;
  event.set_unix_ms(absl::ToUnixMillis(clock_->Now()));
  event.set_kind(kind);
  event.set_generation(job.generation);
  event.set_message(message);
  job.events.push_back(std::move(event));
  while (static_cast<int>(job.events.size()) > options_.events_per_job) {
    job.events.pop_front();
  }
}

void JobManager::RecordEvent(const std::string& job, const std::string& kind,
                             const std::string& message) {
  if (Job* found = FindJob(job)) Event(*found, kind, message);
}

void JobManager::Tick() {
  const absl::Time now = clock_->Now();
  ExpireParkedRejoins(now);
  std::vector<std::string> names;
  names.reserve(jobs_.size());
  for (const auto& [name, job] : jobs_) names.push_back(name);
  for (const std::string& name : names) {
    Job* job = FindJob(name);
    if (job == nullptr) continue;
    switch (job->state) {
      case v1::JOB_STATE_REFORMING:
        if (now >= job->reform_deadline) {
          EndJob(*job, v1::JOB_STATE_FAILED,
                 absl::StrCat("not whole again within ",
                              Seconds(options_.reform_timeout), " (have ",
                              job->members.size(), " of the ", job->min_nodes,
                              " nodes needed) after: ", job->reason));
        }
        break;
      case v1::JOB_STATE_RUNNING: {
        if (!job->pending_joins.empty() && now >= job->join_deadline) {
          AdmitPending(*job, absl::StrCat("no member reached a commit within ",
                                          Seconds(options_.join_wait),
                                          " (--join_wait_ms)"));
          break;
        }
        std::vector<std::string> missing;
        for (const Member& member : job->members) {
          if (!member.connected && !member.finished &&
              now >= member.reconnect_deadline) {
            missing.push_back(member.node_name);
          }
        }
        for (const std::string& node : missing) {
          if (FindJob(name) == nullptr) break;
          const Member* member = FindMember(*job, node);
          LoseMember(*job, node, ReformCause::kLost,
                     absl::StrCat("did not reconnect within ",
                                  Seconds(options_.liveness_timeout), " after ",
                                  member->disconnected_by));
        }
        ResealIfWhole(name);
        break;
      }
      case v1::JOB_STATE_FAILED:
      case v1::JOB_STATE_FINISHED:
        if (now - job->ended >= options_.job_retention) {
          jobs_.erase(name);
          listener_->OnJobRemoved(name);
        }
        break;
      default:
        break;
    }
  }
  JoinReleased();
}

std::vector<std::string> JobManager::JobNames() const {
  std::vector<std::string> names;
  names.reserve(jobs_.size());
  for (const auto& [name, job] : jobs_) names.push_back(name);
  return names;
}

ReformHistogram JobManager::ReformSeconds(const std::string& job) const {
  const Job* found = FindJob(job);
  return found == nullptr ? ReformHistogram() : found->reforms.sealed_seconds();
}

}  // namespace baton::coordinator
