#include "coordinator/coordinator.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log_context.h"
#include "common/tensor_spec.h"
#include "common/validation.h"
#include "glog/logging.h"

namespace baton::coordinator {
namespace {

std::string RandomInstance() {
  std::random_device device;
  return absl::StrFormat("%08x%08x", device(), device());
}

std::string StallText(const v1::Stall& stall) {
  return absl::StrFormat(
      "tensor %s, step %d: waiting for ranks {%s} on nodes {%s} for %.0f s",
      stall.tensor(), stall.step(), absl::StrJoin(stall.missing_ranks(), ","),
      absl::StrJoin(stall.missing_nodes(), ","), stall.waiting_ms() / 1000.0);
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options, Clock* clock,
                         SecretSource* secrets)
    : options_(options),
      clock_(clock),
      instance_(RandomInstance()),
      steps_(options.stall_threshold),
      jobs_(options, clock, &sessions_, this, secrets) {}

void Coordinator::OnSessionOpened(SessionId id,
                                  std::shared_ptr<AgentChannel> channel,
                                  PeerIdentity identity) {
  if (shutting_down_) {
    channel->Close(absl::UnavailableError(
        "the coordinator is shutting down: reconnect to its replacement"));
    return;
  }
  sessions_.Open(id, std::move(channel), clock_->Now()).identity =
      std::move(identity);
}

void Coordinator::OnAgentMessage(SessionId id,
                                 const v1::AgentMessage& message) {
  Session* session = sessions_.Find(id);
  if (session == nullptr) return;  // Closed while the message was queued.
  session->last_seen = clock_->Now();
  const uint64_t seq = message.seq();
  if (!session->said_hello()) {
    if (!message.has_hello()) {
      session->channel->Close(absl::InvalidArgumentError(
          "the first AgentMessage of a session must be hello: send "
          "Hello{node_name, agent_instance} first"));
      sessions_.Remove(id);
      return;
    }
    HandleHello(id, seq, message.hello());
    return;
  }
  absl::Status status;
  std::string job;
  switch (message.body_case()) {
    case v1::AgentMessage::kHello:
      status = absl::FailedPreconditionError(
          "hello was already received on this session: open a new session "
          "to change the node's identity");
      break;
    case v1::AgentMessage::kJoin:
      job = message.join().job();
      status = jobs_.Join(*session, seq, message.join());
      break;
    case v1::AgentMessage::kRejoin:
      job = message.rejoin().membership().job();
      status = jobs_.Rejoin(*session, seq, message.rejoin());
      break;
    case v1::AgentMessage::kLeave:
      job = message.leave().job();
      status = jobs_.Leave(*session, message.leave());
      break;
    case v1::AgentMessage::kAdmitJoins:
      job = message.admit_joins().job();
      status = jobs_.AdmitJoins(*session, message.admit_joins());
      break;
    case v1::AgentMessage::kHeartbeat: {
      v1::CoordinatorMessage ack;
      ack.set_reply_to(seq);
      ack.mutable_heartbeat_ack()->set_sent_unix_us(
          message.heartbeat().sent_unix_us());
      session->channel->Send(Outbound(std::move(ack)));
      return;
    }
    case v1::AgentMessage::kManifest:
      HandleManifest(id, seq, message.manifest());
      return;
    case v1::AgentMessage::kStepReport:
      HandleStepReport(id, seq, message.step_report());
      return;
    case v1::AgentMessage::kTimelineReply:
      timelines_.OnReply(session->node_name, message.timeline_reply());
      return;
    case v1::AgentMessage::BODY_NOT_SET:
      status = absl::InvalidArgumentError(
          "AgentMessage.body is not set (a message kind this coordinator "
          "does not know?): upgrade the coordinator or fix the agent");
      break;
  }
  if (!status.ok()) ReplyError(id, seq, status, job);
}

void Coordinator::HandleHello(SessionId id, uint64_t seq,
                              const v1::Hello& hello) {
  Session* session = sessions_.Find(id);
  absl::Status status =
      ValidateIdentifier("Hello.node_name", hello.node_name());
  if (status.ok()) {
    status = ValidateIdentifier("Hello.agent_instance", hello.agent_instance());
  }
  const PeerIdentity& identity = session->identity;
  if (status.ok() && identity.verified &&
      std::find(identity.dns_names.begin(), identity.dns_names.end(),
                hello.node_name()) == identity.dns_names.end()) {
    // A node cannot speak for another: its certificate names who it is.
    status = absl::PermissionDeniedError(absl::StrCat(
        "this session's certificate names ",
        identity.dns_names.empty() ? std::string("no node (no DNS name)")
                                   : absl::StrJoin(identity.dns_names, ", "),
        ", not \"", hello.node_name(),
        "\" (Hello.node_name): give each agent its own node's certificate "
        "(--tls_cert)"));
    LOG(WARNING) << "session " << id << " refused: " << status.message();
  }
  if (!status.ok()) {
    ReplyError(id, seq, status);
    session->channel->Close(status);
    sessions_.Remove(id);
    return;
  }
  v1::Hello bounded = hello;
  bounded.set_agent_version(hello.agent_version().substr(0, 128));
  if (Session* previous = sessions_.SetIdentity(*session, bounded)) {
    // The agent reconnected before its old session was noticed gone: the
    // memberships move over and the old stream is ended without a loss.
    jobs_.MoveMemberships(*previous, *session);
    previous->channel->Close(
        absl::AbortedError("replaced by a newer session of the same agent"));
    sessions_.Remove(previous->id);
  }
  LOG(INFO) << LogPrefix({"", 0, session->node_name}) << "session " << id
            << " opened (agent " << session->agent_instance << ", version \""
            << session->agent_version << "\")";
  v1::CoordinatorMessage accepted;
  accepted.set_reply_to(seq);
  auto* body = accepted.mutable_session_accepted();
  body->set_session_id(id.value());
  body->set_coordinator_instance(instance_);
  body->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_interval));
  body->set_liveness_timeout_ms(
      absl::ToInt64Milliseconds(options_.liveness_timeout));
  body->set_report_interval_ms(
      absl::ToInt64Milliseconds(options_.report_interval));
  session->channel->Send(Outbound(std::move(accepted)));
}

void Coordinator::HandleManifest(SessionId id, uint64_t seq,
                                 const v1::Manifest& manifest) {
  const Session* session = sessions_.Find(id);
  absl::Status status = jobs_.CheckCurrent(
      manifest.job(), manifest.generation(), session->node_name);
  if (!status.ok()) {
    ReplyError(id, seq, status, manifest.job(), manifest.generation());
    return;
  }
  const v1::Membership& membership = *jobs_.Membership(manifest.job());
  absl::StatusOr<TensorPlanManager::ManifestOutcome> outcome =
      plans_.OnManifest(membership, session->node_name, manifest,
                        steps_.GlobalStep(manifest.job()));
  if (!outcome.ok()) {
    ReplyError(id, seq, outcome.status(), manifest.job(),
               manifest.generation());
    return;
  }
  // The error that tells an agent of a mismatch: its operations on the
  // tensor fail, and its trainers declare the name anew.
  const auto mismatch_error = [&](const v1::TensorMismatch& mismatch) {
    v1::TensorSpec spec;
    spec.set_name(mismatch.tensor());
    spec.set_version(mismatch.version());
    const std::string label = TensorLabel(spec);
    v1::CoordinatorMessage error;
    auto* body = error.mutable_error();
    for (const v1::TensorMismatchStatus& known :
         plans_.Mismatches(manifest.job())) {
      if (known.tensor() == label && known.field() == mismatch.field()) {
        body->set_message(known.message());
      }
    }
    body->set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
    body->set_job(manifest.job());
    body->set_generation(manifest.generation());
    *body->mutable_mismatch() = mismatch;
    return error;
  };
  for (const v1::TensorMismatch& mismatch : outcome->mismatches) {
    v1::CoordinatorMessage error = mismatch_error(mismatch);
    jobs_.RecordEvent(manifest.job(), "mismatch", error.error().message());
    jobs_.Broadcast(manifest.job(), error);
  }
  for (const v1::TensorMismatch& mismatch : outcome->retired) {
    sessions_.Send(id, Outbound(mismatch_error(mismatch)));
  }
  if (outcome->plan.has_value()) {
    const v1::PlanSummary summary = plans_.Summary(manifest.job());
    jobs_.RecordEvent(
        manifest.job(), "plan",
        absl::StrCat("version ", summary.version(), " effective from step ",
                     summary.effective_step(), ": ", summary.num_tensors(),
                     " tensors, ", summary.total_bytes(), " bytes, ",
                     summary.num_partitions(), " partitions"));
    v1::CoordinatorMessage plan;
    *plan.mutable_plan() = *std::move(outcome->plan);
    jobs_.Broadcast(manifest.job(), plan);
  }
}

void Coordinator::HandleStepReport(SessionId id, uint64_t seq,
                                   const v1::StepReport& report) {
  const Session* session = sessions_.Find(id);
  absl::Status status =
      jobs_.CheckCurrent(report.job(), report.generation(), session->node_name);
  if (status.ok()) {
    status = steps_.OnReport(session->node_name, report, clock_->Now());
  }
  if (!status.ok()) {
    ReplyError(id, seq, status, report.job(), report.generation());
  }
}

void Coordinator::ReplyError(SessionId id, uint64_t seq,
                             const absl::Status& status, const std::string& job,
                             int64_t generation) {
  v1::CoordinatorMessage error;
  error.set_reply_to(seq);
  auto* body = error.mutable_error();
  body->set_code(static_cast<int32_t>(status.code()));
  body->set_message(std::string(status.message()));
  body->set_job(job.substr(0, 128));
  body->set_generation(generation);
  sessions_.Send(id, Outbound(std::move(error)));
}

void Coordinator::OnSessionClosed(SessionId id, const std::string& why) {
  Session* session = sessions_.Find(id);
  if (session == nullptr) return;
  if (!shutting_down_ && session->said_hello()) {
    LOG(INFO) << LogPrefix({"", 0, session->node_name}) << "session " << id
              << " ended: " << why;
    const absl::Time now = clock_->Now();
    if (Stalled(now)) {
      // The agents gave up on a coordinator that did not answer (their
      // keepalive) and are reconnecting: their nodes did not fail, so
      // they get the liveness timeout to re-report, not a new generation.
      jobs_.OnSessionsDisconnected({{session, why}},
                                   now + options_.liveness_timeout);
    } else {
      jobs_.OnSessionsLost(
          {{session,
            absl::StrCat("lost its session to the coordinator (", why, ")")}});
    }
  }
  sessions_.Remove(id);
}

absl::Status Coordinator::CheckStoreCaller(const v1::StoreScope& scope,
                                           const PeerIdentity& caller) const {
  absl::Status current =
      jobs_.CheckCurrent(scope.job(), scope.generation(), "");
  if (!current.ok() || !caller.verified) return current;
  for (const std::string& name : caller.dns_names) {
    if (jobs_.CheckCurrent(scope.job(), scope.generation(), name).ok()) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the rendezvous store of job \"", scope.job(), "\" generation ",
      scope.generation(),
      " is open to its members only, and this connection's certificate "
      "names no member (its DNS names: ",
      caller.dns_names.empty() ? "none" : absl::StrJoin(caller.dns_names, ", "),
      ")"));
}

void Coordinator::StoreSet(const v1::StoreSetRequest& request,
                           const PeerIdentity& caller,
                           std::function<void(absl::Status)> done) {
  absl::Status status = CheckStoreCaller(request.scope(), caller);
  done(status.ok() ? store_.Set(request) : status);
}

void Coordinator::StoreGet(const v1::StoreGetRequest& request,
                           const PeerIdentity& caller,
                           RendezvousStore::GetCallback done) {
  absl::Status status = CheckStoreCaller(request.scope(), caller);
  if (!status.ok()) {
    done(status);
    return;
  }
  store_.Get(request, clock_->Now(), std::move(done));
}

void Coordinator::StoreAdd(const v1::StoreAddRequest& request,
                           const PeerIdentity& caller,
                           std::function<void(absl::StatusOr<int64_t>)> done) {
  absl::Status status = CheckStoreCaller(request.scope(), caller);
  if (!status.ok()) {
    done(status);
    return;
  }
  done(store_.Add(request));
}

v1::ListJobsResponse Coordinator::ListJobs() const {
  return JobsPage(MemberPage::All());
}

v1::ListJobsResponse Coordinator::ListJobs(
    const v1::ListJobsRequest& /*request*/) const {
  return JobsPage(MemberPage::First());
}

v1::ListJobsResponse Coordinator::JobSummaries() const {
  return JobsPage(MemberPage::None());
}

std::vector<int64_t> Coordinator::RankLags(const std::string& job) const {
  return steps_.RankLags(job, clock_->Now(), [&](uint32_t id) {
    return plans_.TensorName(job, id);
  });
}

v1::ListJobsResponse Coordinator::JobsPage(const MemberPage& page) const {
  v1::ListJobsResponse response;
  for (const std::string& name : jobs_.JobNames()) {
    absl::StatusOr<v1::JobStatus> status = JobStatusPage(name, page);
    if (status.ok()) *response.add_jobs() = *std::move(status);
  }
  return response;
}

absl::StatusOr<std::string> Coordinator::CancelJob(const std::string& job,
                                                   const std::string& who,
                                                   const std::string& why) {
  if (why.size() > kMaxCancelReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the reason has ", why.size(), " bytes, more than ",
                     kMaxCancelReasonBytes, ": shorten it"));
  }
  const std::string reason =
      why.empty() ? absl::StrCat("cancelled by ", who)
                  : absl::StrCat("cancelled by ", who, ": ", why);
  if (absl::Status cancelled = jobs_.Cancel(job, reason); !cancelled.ok()) {
    return cancelled;
  }
  return reason;
}

absl::StatusOr<v1::JobStatus> Coordinator::GetJob(
    const std::string& job) const {
  return JobStatusPage(job, MemberPage::All());
}

absl::StatusOr<v1::JobStatus> Coordinator::GetJob(
    const v1::GetJobRequest& request) const {
  absl::StatusOr<MemberPage> page = MemberPage::FromRequest(request);
  if (!page.ok()) return page.status();
  return JobStatusPage(request.job(), *page);
}

absl::StatusOr<v1::JobStatus> Coordinator::JobStatusPage(
    const std::string& job, const MemberPage& page) const {
  v1::JobStatus status;
  // Only the page's members are filled, by every manager: O(page size).
  absl::StatusOr<bool> more = jobs_.FillStatus(job, page, &status);
  if (!more.ok()) return more.status();
  steps_.FillStatus(
      job, clock_->Now(),
      [&](uint32_t id) { return plans_.TensorName(job, id); }, &status);
  *status.mutable_plan() = plans_.Summary(job);
  for (v1::TensorMismatchStatus& mismatch : plans_.Mismatches(job)) {
    *status.add_mismatches() = std::move(mismatch);
  }
  page.Finish(*more, &status);
  return status;
}

absl::StatusOr<v1::TensorsStatus> Coordinator::GetTensors(
    const std::string& job) const {
  // NOT_FOUND for an unknown job. The members' latencies are summed where
  // they are kept, not copied into member statuses first.
  v1::JobStatus status;
  if (absl::StatusOr<bool> found =
          jobs_.FillStatus(job, MemberPage::None(), &status);
      !found.ok()) {
    return found.status();
  }
  v1::TensorsStatus tensors;
  tensors.set_job(job);
  const v1::TensorPlan* plan = plans_.Plan(job);
  if (plan == nullptr) return tensors;
  tensors.set_plan_version(plan->version());
  tensors.set_partition_bytes(plan->partition_bytes());
  // Latencies summed over the members (a count-weighted mean).
  const absl::flat_hash_map<uint32_t, StepManager::TensorLatencySum> latencies =
      steps_.TensorLatencies(job);
  std::vector<const v1::TensorPlanEntry*> entries;
  for (const v1::TensorPlanEntry& entry : plan->tensors()) {
    entries.push_back(&entry);
  }
  std::sort(entries.begin(), entries.end(),
            [](const v1::TensorPlanEntry* a, const v1::TensorPlanEntry* b) {
              return a->tensor_id() < b->tensor_id();
            });
  for (const v1::TensorPlanEntry* entry : entries) {
    v1::TensorStatus* t = tensors.add_tensors();
    t->set_id(entry->tensor_id());
    *t->mutable_spec() = entry->spec();
    t->set_size_bytes(entry->size_bytes());
    t->set_priority(entry->priority());
    t->set_num_partitions(entry->num_partitions());
    auto it = latencies.find(entry->tensor_id());
    if (it != latencies.end() && it->second.count > 0) {
      t->set_latency_count(it->second.count);
      t->set_latency_mean_us(it->second.total_us / it->second.count);
      t->set_latency_max_us(it->second.max_us);
    }
  }
  return tensors;
}

void Coordinator::GetTimeline(const v1::GetTimelineRequest& request,
                              TimelineCollector::Done done) {
  if (request.first_step() < 0 || request.last_step() < request.first_step() ||
      request.last_step() - request.first_step() >= kMaxTimelineSteps) {
    done(absl::InvalidArgumentError(absl::StrCat(
        "GetTimelineRequest steps ", request.first_step(), "..",
        request.last_step(), ": give 0 <= first_step <= last_step, at most ",
        kMaxTimelineSteps, " steps")));
    return;
  }
  v1::JobStatus status;
  if (absl::StatusOr<bool> found =
          jobs_.FillStatus(request.job(), MemberPage::All(), &status);
      !found.ok()) {
    done(found.status());
    return;
  }
  std::vector<TimelineCollector::Node> nodes;
  for (const v1::MemberStatus& member : status.members()) {
    nodes.push_back(
        {member.node_name(), member.node_rank(), member.connected()});
  }
  const uint64_t id = timelines_.Start(
      request, nodes, clock_->Now() + kTimelineReplyTimeout, std::move(done));
  v1::CoordinatorMessage message;
  v1::TimelineRequest* ask = message.mutable_timeline_request();
  ask->set_request_id(id);
  ask->set_job(request.job());
  ask->set_first_step(request.first_step());
  ask->set_last_step(request.last_step());
  jobs_.Broadcast(request.job(), message);
}

void Coordinator::MessageHandled(absl::Time arrived) {
  message_seconds_.Observe(clock_->Now() - arrived);
}

int Coordinator::ConnectedAgents() const {
  int agents = 0;
  for (SessionId id : sessions_.All()) {
    if (sessions_.Find(id)->said_hello()) ++agents;
  }
  return agents;
}

ReformHistogram Coordinator::ReformSeconds(const std::string& job) const {
  return jobs_.ReformSeconds(job);
}

bool Coordinator::Stalled(absl::Time now) const {
  // Not ticked for long, or ticked for the first time since a stall a
  // moment ago (the sessions that ended meanwhile come in right after).
  return (last_tick_ != absl::InfinitePast() &&
          now - last_tick_ > options_.liveness_timeout / 2) ||
         now < stall_ended_ + options_.liveness_timeout / 2;
}

void Coordinator::Tick() {
  const absl::Time now = clock_->Now();
  timelines_.Tick(now);
  if (last_tick_ != absl::InfinitePast() &&
      now - last_tick_ > options_.liveness_timeout / 2) {
    stall_ended_ = now;
    // The coordinator itself did not run (stopped, swapped, starved): the
    // agents' messages wait unread in its queues and sockets, so silence
    // proves nothing. Restart every liveness deadline instead of declaring
    // the whole cluster lost.
    LOG(WARNING) << "the control loop did not run for " << (now - last_tick_)
                 << "; restarting " << sessions_.size()
                 << " liveness deadline(s)";
    for (SessionId id : sessions_.All()) sessions_.Find(id)->last_seen = now;
  }
  last_tick_ = now;

  std::vector<SessionId> silent =
      sessions_.Silent(now, options_.liveness_timeout);
  std::vector<JobManager::LostSession> lost;
  for (SessionId id : silent) {
    Session* session = sessions_.Find(id);
    const std::string silence =
        absl::StrFormat("no message for %.1f s",
                        absl::ToDoubleSeconds(now - session->last_seen));
    session->channel->Close(absl::DeadlineExceededError(
        absl::StrCat("the coordinator heard nothing from this agent (", silence,
                     ") and counts it as lost: reconnect and rejoin")));
    if (session->said_hello()) {
      lost.push_back({session, absl::StrCat("missed its liveness deadline (",
                                            silence, ")")});
    }
  }
  jobs_.OnSessionsLost(lost);
  for (SessionId id : silent) sessions_.Remove(id);
  jobs_.Tick();
  store_.Tick(now);
  for (const std::string& job : jobs_.JobNames()) {
    if (jobs_.Membership(job) == nullptr) continue;
    for (const v1::Stall& stall : steps_.TakeNewStalls(
             job, now,
             [&](uint32_t id) { return plans_.TensorName(job, id); })) {
      jobs_.RecordEvent(job, "stall", StallText(stall));
    }
  }
}

void Coordinator::Shutdown(const std::string& reason) {
  if (shutting_down_) return;
  shutting_down_ = true;
  timelines_.Abort(absl::UnavailableError(
      absl::StrCat("the coordinator is shutting down: ", reason)));
  LOG(INFO) << "shutting down: " << reason << "; telling " << sessions_.size()
            << " agent(s)";
  v1::CoordinatorMessage message;
  message.mutable_shutdown()->set_reason(reason);
  message.mutable_shutdown()->set_retry_after_ms(
      absl::ToInt64Milliseconds(options_.shutdown_retry_after));
  const OutboundMessage shared = Outbound(std::move(message));
  for (SessionId id : sessions_.All()) {
    Session* session = sessions_.Find(id);
    session->channel->Send(shared);
    session->channel->Close(absl::UnavailableError(reason));
    sessions_.Remove(id);
  }
  for (const std::string& job : jobs_.JobNames()) {
    store_.RemoveJob(job, absl::UnavailableError(reason));
  }
}

void Coordinator::OnGenerationSealed(const v1::Membership& membership) {
  const std::string& job = membership.job();
  store_.OpenGeneration(job, membership.generation());
  steps_.OnGenerationSealed(membership);
  std::optional<v1::TensorPlan> plan =
      plans_.OnGenerationSealed(membership, jobs_.PartitionBytes(job));
  if (plan.has_value()) {
    v1::CoordinatorMessage message;
    *message.mutable_plan() = *std::move(plan);
    jobs_.Broadcast(job, message);
  }
}

void Coordinator::OnGenerationAborted(const std::string& job,
                                      int64_t generation,
                                      const std::string& reason) {
  store_.AbortGeneration(job, generation, absl::AbortedError(reason));
}

void Coordinator::OnJobEnded(const std::string& job,
                             const std::string& reason) {
  store_.RemoveJob(job, absl::FailedPreconditionError(
                            absl::StrCat("job \"", job, "\" ended: ", reason)));
}

void Coordinator::OnJobRemoved(const std::string& job) {
  store_.RemoveJob(job, absl::FailedPreconditionError(absl::StrCat(
                            "job \"", job, "\" is gone from the coordinator")));
  steps_.RemoveJob(job);
  plans_.RemoveJob(job);
}

void Coordinator::OnJobRecovered(const v1::Membership& membership,
                                 const v1::RejoinJob& rejoin,
                                 const std::string& node_name, bool created) {
  const std::string& job = membership.job();
  if (created) {
    store_.OpenGeneration(job, membership.generation());
    steps_.OnGenerationSealed(membership);
    plans_.OnGenerationSealed(membership, jobs_.PartitionBytes(job));
  }
  steps_.Recover(job, node_name, rejoin.completed_step());
  if (rejoin.has_plan() && rejoin.plan().version() > 0) {
    absl::Status status = plans_.Recover(job, rejoin.plan());
    if (!status.ok()) {
      jobs_.RecordEvent(
          job, "mismatch",
          absl::StrCat("node ", node_name,
                       " reported a different plan: ", status.message()));
    }
  }
}

}  // namespace baton::coordinator
