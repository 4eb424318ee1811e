#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/status.pb.h"
#include "common/clock.h"
#include "common/ids.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/member_page.h"
#include "coordinator/reform_log.h"
#include "coordinator/secret_source.h"
#include "coordinator/session_manager.h"

namespace baton::coordinator {

// What other managers must do when membership changes. Called by JobManager
// on the control loop thread, after its own state is updated.
class JobListener {
 public:
  virtual ~JobListener() = default;
  // A generation was sealed; members have been sent the membership.
  virtual void OnGenerationSealed(const v1::Membership& membership) = 0;
  // The job's running generation was aborted (a node lost or added).
  virtual void OnGenerationAborted(const std::string& job, int64_t generation,
                                   const std::string& reason) = 0;
  // The job failed or finished.
  virtual void OnJobEnded(const std::string& job,
                          const std::string& reason) = 0;
  // The job is forgotten (retention passed, or it never sealed and emptied).
  virtual void OnJobRemoved(const std::string& job) = 0;
  // `node_name` re-reported a running job after a coordinator restart (or a
  // reconnect). `created` is true for the report that rebuilt the job.
  virtual void OnJobRecovered(const v1::Membership& membership,
                              const v1::RejoinJob& rejoin,
                              const std::string& node_name, bool created) = 0;
};

// Owns jobs: their lifecycle (forming, running, re-forming, failed,
// finished), membership and generations, member liveness, and the recovery
// of running jobs from rejoining agents after a coordinator restart.
//
// Generations: the first seal is generation 1. Losing a member of a running
// job bumps the generation at once (the survivors are told which node was
// lost and why) and the job re-forms; it is sealed again under that new
// generation when expected_nodes members are present, or at once with the
// survivors when there are at least min_nodes of them. A job that is not
// whole again within reform_timeout fails.
//
// Not thread-safe: owned by the coordinator's control loop.
class JobManager {
 public:
  // Each seal draws the generation's data-plane secret from `secrets`.
  JobManager(const CoordinatorOptions& options, Clock* clock,
             SessionManager* sessions, JobListener* listener,
             SecretSource* secrets);
  ~JobManager();

  // Request handlers. On error nothing changed; the caller replies with it.
  absl::Status Join(Session& session, uint64_t seq, const v1::JoinJob& join);
  absl::Status Rejoin(Session& session, uint64_t seq,
                      const v1::RejoinJob& rejoin);
  absl::Status Leave(Session& session, const v1::LeaveJob& leave);
  // A member's trainers reached a commit while nodes wait to join the
  // running generation: the generation ends and the next one includes them
  // (job_growth.cc). A stale generation is ignored.
  absl::Status AdmitJoins(Session& session, const v1::AdmitJoins& admit);

  // The agent reconnected on a new session (same node and instance): its
  // memberships move from `old_session` to `session`.
  void MoveMemberships(Session& old_session, Session& session);

  // Sessions that ended or went silent together: each one's node is lost in
  // each of its jobs, and each affected job re-seals at most once.
  struct LostSession {
    const Session* session;
    std::string why;
  };
  void OnSessionsLost(const std::vector<LostSession>& lost);
  // Sessions that ended while the coordinator itself was not running (it
  // was stopped or starved; the agents gave up on it and reconnect): in
  // each running job the node stays a member, disconnected, until
  // `deadline`, for its agent to re-report the generation (RejoinJob);
  // then it is lost. In a job that is not running it is lost at once.
  void OnSessionsDisconnected(const std::vector<LostSession>& sessions,
                              absl::Time deadline);

  // Checks that `node_name` may send a message for (job, generation): the
  // job exists (NOT_FOUND), has not ended (FAILED_PRECONDITION), the
  // generation is current (older: ABORTED, newer or unsealed:
  // FAILED_PRECONDITION) and the node is a sealed member of it
  // (FAILED_PRECONDITION). An empty node name skips the member check.
  absl::Status CheckCurrent(const std::string& job, int64_t generation,
                            const std::string& node_name) const;

  // The sealed membership of a running job, or nullptr.
  const v1::Membership* Membership(const std::string& job) const;

  // The job's partition size (its own or the coordinator's default); 0 for
  // an unknown job.
  int64_t PartitionBytes(const std::string& job) const;

  // Sends `message` to every connected member of the job.
  void Broadcast(const std::string& job, const v1::CoordinatorMessage& message);

  // Ends the job as failed with `reason` (an operator's cancel), as any
  // failure ends it: every member and waiting node is told, store waits
  // fail, status shows it FAILED with the reason. NOT_FOUND for an unknown
  // job, FAILED_PRECONDITION for one that has ended.
  absl::Status Cancel(const std::string& job, const std::string& reason);

  // Appends to the job's event log (and the process log).
  void RecordEvent(const std::string& job, const std::string& kind,
                   const std::string& message);

  // Deadlines: re-form timeouts, reconnects after recovery, retention.
  void Tick();

  // Job-level status (state, generation, total_members, events, re-forms
  // and the nodes lost and joined) and the members `page` holds, in page
  // order (MemberPage::All(): every member); other managers add theirs.
  // O(page size + log members): only the page's members are filled (in
  // job_status.cc). Returns whether members follow the page. NOT_FOUND for
  // an unknown job, ABORTED for a page token of another generation or state
  // (MemberPage::Check).
  absl::StatusOr<bool> FillStatus(const std::string& job,
                                  const MemberPage& page,
                                  v1::JobStatus* status) const;
  std::vector<std::string> JobNames() const;
  // How long the job's sealed re-forms took, since the job was created (or
  // rebuilt after a coordinator restart); empty for an unknown job.
  ReformHistogram ReformSeconds(const std::string& job) const;

 private:
  struct Member;
  struct Job;

  // Creates and registers a forming job; 0 for min_nodes or partition_bytes
  // means the default.
  Job& NewJob(const std::string& name, int64_t generation,
              int32_t expected_nodes, int32_t min_nodes,
              int64_t partition_bytes, const std::string& creator);
  Job* FindJob(const std::string& job);
  const Job* FindJob(const std::string& job) const;
  Member* FindMember(Job& job, const std::string& node_name);
  absl::Status CheckJoinMatchesJob(const Job& job, const v1::JoinJob& join,
                                   const Session& session) const;
  void Seal(Job& job);
  // Puts every member that asked for a node rank (JoinJob.node_rank) at that
  // index of `members`, the others in the gaps, keeping their order.
  static void PlaceRequestedRanks(std::vector<Member>& members);
  // Removes `node_name` from the job for `why` (lost, left or timed out);
  // `cause` (kLost or kLeft) is the cause of the re-form this starts when
  // the job was running. Callers then ResealIfWhole, once per batch of
  // losses.
  void LoseMember(Job& job, const std::string& node_name, ReformCause cause,
                  const std::string& why);
  // Seals a re-forming job that has min_nodes members again.
  void ResealIfWhole(const std::string& job);
  void EndJob(Job& job, v1::JobState state, const std::string& reason);
  // `node`: the node the event is about, for the log line's prefix.
  void Event(Job& job, const std::string& kind, const std::string& message,
             const std::string& node = "");
  void SendToMember(const Member& member, const OutboundMessage& message);
  // The members `page` holds into `status`; whether members follow them.
  bool FillMembers(const Job& job, const MemberPage& page,
                   v1::JobStatus* status) const;
  void FillMember(const Member& member, v1::MemberStatus* out) const;
  // The member's view of the job's sealed membership (MembershipView).
  void SendMembership(const Job& job, const Member& member);
  // Answers a join or rejoin (request `seq`) with the job's state.
  void SendJoinAccepted(const Job& job, SessionId session, uint64_t seq);
  // Joins the held joins of runs that ended (EndJob releases them) to the
  // name's next run. Called last by the handlers that can end a job, so no
  // caller holds a Job the new run replaces.
  void JoinReleased();

  // A join of a node that finished the running run: it joins the next run.
  struct HeldJoin {
    SessionId session;
    uint64_t seq = 0;
    v1::JoinJob join;
  };
  // A join into a running generation, waiting for the members' next commit.
  struct PendingJoin {
    SessionId session;
    uint64_t seq = 0;
    v1::JoinJob join;
    std::string node_name;
    absl::Time since;
  };

  // Growing a running job (job_growth.cc). A join waits for the members'
  // next commit (they are told: JoinPending), or --join_wait_ms.
  void HoldForCommit(Job& job, Session& session, uint64_t seq,
                     const v1::JoinJob& join);
  // Ends the running generation and seals the next with the waiting nodes
  // whose sessions are still there; `why` says what admitted them.
  void AdmitPending(Job& job, const std::string& why);
  // Makes `session`'s node a member (sealed at the next Seal) and answers
  // its join.
  void AddJoiner(Job& job, Session& session, uint64_t seq,
                 const v1::JoinJob& join);
  // Tells the sealed members which nodes wait to join.
  void NotifyJoinPending(Job& job);

  // Recovery (job_recovery.cc). A re-report without the node table (from a
  // node rank other than 0 and 1: MembershipView) of a job the coordinator
  // does not know waits until a report with the table rebuilds the job, or
  // for liveness_timeout, after which the node is told to join again.
  struct ParkedRejoin {
    SessionId session;
    uint64_t seq = 0;
    v1::RejoinJob rejoin;
    absl::Time deadline;
  };
  void ParkRejoin(Session& session, uint64_t seq, const v1::RejoinJob& rejoin);
  // Handles the parked re-reports of `job`, which was just rebuilt.
  void ReleaseParkedRejoins(const std::string& job);
  // Refuses the parked re-reports whose deadline passed.
  void ExpireParkedRejoins(absl::Time now);
  // Answers request `seq` of `session` with `status` (an error).
  void ReplyError(SessionId session, uint64_t seq, const std::string& job,
                  const absl::Status& status);

  // Constant after construction.
  const CoordinatorOptions options_;
  Clock* const clock_;
  SessionManager* const sessions_;
  JobListener* const listener_;
  SecretSource* const secrets_;

  absl::btree_map<std::string, std::unique_ptr<Job>> jobs_;
  // Generation numbers continue across a job name's reuse, so messages of an
  // ended incarnation are always stale.
  absl::flat_hash_map<std::string, int64_t> last_generation_;
  // Per job name, each node's rank in the name's last sealed generation.
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, int32_t>>
      last_node_ranks_;
  // Held joins of runs that ended, for JoinReleased.
  std::vector<HeldJoin> released_joins_;
  // Re-reports waiting for the report that rebuilds their job, by job and
  // node name.
  absl::flat_hash_map<std::string,
                      absl::flat_hash_map<std::string, ParkedRejoin>>
      parked_rejoins_;
};

}  // namespace baton::coordinator
