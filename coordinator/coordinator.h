#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/rendezvous.pb.h"
#include "baton/v1/status.pb.h"
#include "common/clock.h"
#include "common/ids.h"
#include "coordinator/agent_channel.h"
#include "coordinator/bucket_histogram.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/job_manager.h"
#include "coordinator/member_page.h"
#include "coordinator/reform_log.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/secret_source.h"
#include "coordinator/session_manager.h"
#include "coordinator/step_manager.h"
#include "coordinator/tensor_plan_manager.h"
#include "coordinator/timeline_collector.h"

namespace baton::coordinator {

// The coordinator's state and logic, free of gRPC: it wires the managers
// together in dependency order (sessions -> jobs -> plan, steps, store) and
// dispatches agent messages to them.
//
// Not thread-safe: every method runs on the control loop's thread. The gRPC
// adapters post calls to the loop; tests call the methods directly and move
// a FakeClock.
class Coordinator : private JobListener {
 public:
  // `secrets` (which must outlive this) gives each generation's data-plane
  // secret; tests pass a CountingSecretSource.
  Coordinator(const CoordinatorOptions& options, Clock* clock,
              SecretSource* secrets = CryptoSecretSource());
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Agent sessions. `id` is chosen by the caller and unique per process.
  // `identity`: what the transport verified about the agent (nothing
  // without TLS); its hello must name a node the identity carries.
  void OnSessionOpened(SessionId id, std::shared_ptr<AgentChannel> channel,
                       PeerIdentity identity = {});
  void OnAgentMessage(SessionId id, const v1::AgentMessage& message);
  // Idempotent; `why` says how the stream ended.
  void OnSessionClosed(SessionId id, const std::string& why);
  // A message of an agent that was read off its stream at `arrived` (by
  // the coordinator's clock) has been handled: how long that took, queueing
  // for the control loop included, goes to MessageSeconds.
  void MessageHandled(absl::Time arrived);

  // Rendezvous store. Callbacks run on the loop thread. `caller`: what the
  // transport verified about who asks; with TLS only the members of the
  // scope's sealed generation may use it (PERMISSION_DENIED otherwise).
  void StoreSet(const v1::StoreSetRequest& request, const PeerIdentity& caller,
                std::function<void(absl::Status)> done);
  void StoreGet(const v1::StoreGetRequest& request, const PeerIdentity& caller,
                RendezvousStore::GetCallback done);
  void StoreAdd(const v1::StoreAddRequest& request, const PeerIdentity& caller,
                std::function<void(absl::StatusOr<int64_t>)> done);

  // Status API. ListJobs() and GetJob(job) give every member of a job (the
  // coordinator's own callers: metrics, tests); ListJobs(request) each job
  // with the first page of its members, and GetJob(request) the page of
  // members it asks for (MemberPage, in member_page.h), with the job's
  // other fields whole.
  v1::ListJobsResponse ListJobs() const;
  v1::ListJobsResponse ListJobs(const v1::ListJobsRequest& request) const;
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job) const;
  absl::StatusOr<v1::JobStatus> GetJob(const v1::GetJobRequest& request) const;
  // `job`'s status with the members `page` selects (JobPageBuilder's).
  absl::StatusOr<v1::JobStatus> JobStatusPage(const std::string& job,
                                              const MemberPage& page) const;

  // Admin API. Ends `job` as failed with the reason "cancelled by <who>:
  // <why>" (just "cancelled by <who>" without `why`), through the path of
  // every job failure: its agents are told and its trainers' next calls
  // fail with that reason. Returns the reason. NOT_FOUND for an unknown
  // job, FAILED_PRECONDITION for an ended one, INVALID_ARGUMENT for a `why`
  // longer than kMaxCancelReasonBytes.
  absl::StatusOr<std::string> CancelJob(const std::string& job,
                                        const std::string& who,
                                        const std::string& why);
  static constexpr size_t kMaxCancelReasonBytes = 1024;

  // Metrics: every job's own fields without members (total_members counts
  // them), each rank's lag, agents with an open session (that said hello),
  // and how long `job`'s sealed re-forms took. Cheap enough for the loop at
  // 10,000 members: no member is built.
  v1::ListJobsResponse JobSummaries() const;
  std::vector<int64_t> RankLags(const std::string& job) const;
  int ConnectedAgents() const;
  ReformHistogram ReformSeconds(const std::string& job) const;
  // Every MessageHandled since the coordinator started.
  const MessageHistogram& MessageSeconds() const { return message_seconds_; }
  // The job's tensor plan with each tensor's latency over the members' last
  // report interval. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::TensorsStatus> GetTensors(const std::string& job) const;
  // Asks every connected member for its partition phases of the request's
  // steps; `done` runs once with the merged timeline, when all answered or
  // after kTimelineReplyTimeout (INVALID_ARGUMENT / NOT_FOUND at once for a
  // bad range or an unknown job).
  void GetTimeline(const v1::GetTimelineRequest& request,
                   TimelineCollector::Done done);

  // How long GetTimeline waits for the agents' answers.
  static constexpr absl::Duration kTimelineReplyTimeout = absl::Seconds(3);
  // The most steps one GetTimeline may ask for.
  static constexpr int64_t kMaxTimelineSteps = 1000;

  // Periodic work: liveness and reconnect deadlines, re-form timeouts,
  // expired store waits, stall detection, retention of ended jobs.
  void Tick();

  // Tells every agent the coordinator is going away and closes every
  // session (UNAVAILABLE) without counting their nodes as lost; fails
  // waiting store requests. Later sessions are refused.
  void Shutdown(const std::string& reason);

  const CoordinatorOptions& options() const { return options_; }

 private:
  // Whether the coordinator itself did not run for more than half the
  // liveness timeout just before `now` (Tick's view, see there).
  bool Stalled(absl::Time now) const;
  // JobListener: consequences of membership changes for the other managers.
  void OnGenerationSealed(const v1::Membership& membership) override;
  void OnGenerationAborted(const std::string& job, int64_t generation,
                           const std::string& reason) override;
  void OnJobEnded(const std::string& job, const std::string& reason) override;
  void OnJobRemoved(const std::string& job) override;
  void OnJobRecovered(const v1::Membership& membership,
                      const v1::RejoinJob& rejoin, const std::string& node_name,
                      bool created) override;

  // Every job, each with the members `page` selects (from its start).
  v1::ListJobsResponse JobsPage(const MemberPage& page) const;
  // OK when `scope` names the sealed current generation of a running job
  // and `caller` (when verified) names one of its members.
  absl::Status CheckStoreCaller(const v1::StoreScope& scope,
                                const PeerIdentity& caller) const;
  void HandleHello(SessionId id, uint64_t seq, const v1::Hello& hello);
  void HandleManifest(SessionId id, uint64_t seq, const v1::Manifest& manifest);
  void HandleStepReport(SessionId id, uint64_t seq,
                        const v1::StepReport& report);
  // Sends an error about request `seq` to session `id`.
  void ReplyError(SessionId id, uint64_t seq, const absl::Status& status,
                  const std::string& job = "", int64_t generation = 0);

  // Constant after construction.
  const CoordinatorOptions options_;
  Clock* const clock_;
  // Random per process; tells agents the coordinator restarted.
  const std::string instance_;

  // Managers, in dependency order.
  SessionManager sessions_;
  TensorPlanManager plans_;
  StepManager steps_;
  RendezvousStore store_;
  JobManager jobs_;
  TimelineCollector timelines_;

  MessageHistogram message_seconds_;
  bool shutting_down_ = false;
  // When Tick last ran, to notice the coordinator itself stalling.
  absl::Time last_tick_ = absl::InfinitePast();
  // When Tick last noticed that the coordinator had stalled.
  absl::Time stall_ended_ = absl::InfinitePast();
};

}  // namespace baton::coordinator
