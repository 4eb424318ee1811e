#include "agent/job_membership.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log_context.h"
#include "common/membership_view.h"
#include "glog/logging.h"

namespace baton::agent {

JobMembership::JobMembership(std::string job, const JobEnvironment& env,
                             JobTrainers* trainers, Callbacks callbacks)
    : job_(std::move(job)),
      env_(env),
      config_(*env.config),
      clock_(*env.clock),
      trainers_(*trainers),
      callbacks_(std::move(callbacks)) {
  if (!config_.launch_trace_dir.empty()) {
    const std::string path = absl::StrCat(config_.launch_trace_dir, "/", job_,
                                          ".", config_.node_name, ".launches");
    launch_trace_ = std::fopen(path.c_str(), "a");
    if (launch_trace_ == nullptr) {
      LOG(ERROR) << JobLogPrefix() << "cannot open launch trace " << path;
    }
  }
}

JobMembership::~JobMembership() {
  StopDataPlanes();
  if (launch_trace_ != nullptr) std::fclose(launch_trace_);
}

void JobMembership::StopDataPlanes() {
  for (std::thread& t : connectors_) t.join();
  connectors_.clear();
  data_plane_.reset();
  retired_.clear();
}

void JobMembership::Join() {
  state_ = State::kJoining;
  SendJoin();
}

void JobMembership::Leave(const absl::Status& status, bool finished) {
  if (state_ != State::kJoining && state_ != State::kRunning &&
      state_ != State::kReforming) {
    return;
  }
  v1::AgentMessage message;
  v1::LeaveJob* leave = message.mutable_leave();
  leave->set_job(job_);
  leave->set_generation(membership_ ? membership_->generation() : 0);
  leave->set_finished(finished);
  leave->set_reason(std::string(status.message()));
  if (finished && data_plane_) {
    // Every node stops after the round that carries this; the data plane
    // finishes on its own, without an abort.
    data_plane_->Leave();
    retired_.push_back(std::move(data_plane_));
  }
  env_.coordinator->Send(std::move(message));
}

void JobMembership::LoseTrainer(const absl::Status& status) {
  if (state_ == State::kAttaching || state_ == State::kDone) return;
  Leave(status, /*finished=*/false);
  if (membership_) aborted_[membership_->generation()] = status;
  if (data_plane_) RetireDataPlane(status);
  data_plane_stopped_.reset();
  ReleaseHeld();
  state_ = State::kAttaching;
}

void JobMembership::End(const absl::Status& status) {
  state_ = State::kDone;
  if (data_plane_) RetireDataPlane(status);
  // The caller fails every operation, held ones included.
  data_plane_failure_.reset();
  env_.transport->DropKept(LinkKey(""));
}

std::string JobMembership::LinkKey(const std::string& purpose) const {
  return absl::StrCat(job_, "/", purpose);
}

void JobMembership::HandleCoordinatorMessage(const v1::CoordinatorMessage& m) {
  if (m.has_timeline_request()) {
    // Answered in every state: what ran before the job ended is still here.
    const v1::TimelineRequest& request = m.timeline_request();
    v1::AgentMessage reply;
    v1::TimelineReply* body = reply.mutable_timeline_reply();
    body->set_request_id(request.request_id());
    body->set_job(job_);
    bool truncated = false;
    for (v1::PartitionTrace& trace : timeline_.Query(
             request.first_step(), request.last_step(), &truncated)) {
      *body->add_partitions() = std::move(trace);
    }
    body->set_truncated(truncated);
    env_.coordinator->Send(std::move(reply));
    return;
  }
  if (state_ == State::kDone) return;
  if (m.has_join_accepted() && m.reply_to() == join_seq_) {
    join_accepted_ = true;
  }
  if (!membership_ && !join_accepted_ && !m.has_error()) return;
  switch (m.body_case()) {
    case v1::CoordinatorMessage::kJoinAccepted:
      if (rejoin_seq_ != 0 && m.reply_to() == rejoin_seq_ &&
          state_ == State::kRunning &&
          membership_->generation() == rejoined_generation_) {
        SendManifest();
      }
      VLOG(1) << JobLogPrefix() << "joined, "
              << m.join_accepted().nodes_joined() << "/"
              << m.join_accepted().expected_nodes() << " nodes";
      break;
    case v1::CoordinatorMessage::kMembership:
      HandleMembership(m.membership());
      break;
    case v1::CoordinatorMessage::kPlan:
      HandlePlan(m.plan());
      break;
    case v1::CoordinatorMessage::kGenerationAborted:
      HandleGenerationAborted(m.generation_aborted());
      break;
    case v1::CoordinatorMessage::kJoinPending:
      if (membership_ && m.join_pending().generation() == generation()) {
        // The trainers admit the nodes at their next commit.
        v1::TrainerEvent event;
        *event.mutable_join_pending() = m.join_pending();
        trainers_.SendToAll(event);
      }
      break;
    case v1::CoordinatorMessage::kError:
      HandleError(m.reply_to(), m.error());
      break;
    case v1::CoordinatorMessage::kJobEnded: {
      const v1::JobEnded& ended = m.job_ended();
      const absl::Status status =
          ended.state() == v1::JOB_STATE_FINISHED
              ? absl::FailedPreconditionError(absl::StrCat(
                    "job \"", job_, "\" finished: ", ended.reason()))
              : absl::AbortedError(absl::StrCat("job \"", job_,
                                                "\" failed: ", ended.reason()));
      callbacks_.end(status);
      break;
    }
    default:
      break;
  }
}

void JobMembership::SendJoin() {
  v1::AgentMessage message;
  v1::JoinJob* join = message.mutable_join();
  join->set_job(job_);
  // Port 0: gloo's ports go through the rendezvous store.
  join->set_data_address(config_.data_host.find(':') == std::string::npos
                             ? config_.data_host + ":0"
                             : "[" + config_.data_host + "]:0");
  join->set_local_size(trainers_.params().local_size());
  join->set_expected_nodes(trainers_.params().expected_nodes());
  join->set_min_nodes(trainers_.params().min_nodes());
  join->set_partition_bytes(trainers_.params().partition_bytes());
  if (trainers_.params().has_node_rank()) {
    join->set_node_rank(trainers_.params().node_rank());
  }
  // Joining again after the session was lost mid re-form: if the run ended
  // meanwhile, the coordinator says so instead of starting a new one.
  if (membership_) join->set_last_generation(membership_->generation());
  join_seq_ = env_.coordinator->Send(std::move(message));
}

void JobMembership::HandleSession(bool restarted) {
  if (state_ == State::kJoining) {
    SendJoin();
    return;
  }
  if (state_ == State::kReforming) {
    // The generation we know was aborted: never ask to rebuild it.
    state_ = State::kJoining;
    SendJoin();
    return;
  }
  if (!membership_ || state_ != State::kRunning) return;
  // Re-report the generation we run; the coordinator rebuilds the job from
  // it (restarted) or tells us it moved on (then we join afresh).
  v1::AgentMessage message;
  v1::RejoinJob* rejoin = message.mutable_rejoin();
  *rejoin->mutable_membership() = *membership_;
  if (plan_) *rejoin->mutable_plan() = *plan_;
  rejoin->set_completed_step(trainers_.CompletedStep());
  rejoin->set_expected_nodes(trainers_.params().expected_nodes());
  rejoin->set_min_nodes(trainers_.params().min_nodes());
  rejoin->set_partition_bytes(partition_bytes_);
  rejoin_seq_ = env_.coordinator->Send(std::move(message));
  rejoined_generation_ = membership_->generation();
  // The declarations follow once the rejoin is accepted: a restarted
  // coordinator may hold the report until node rank 0 or 1 rebuilt the job.
  manifest_sent_ = 0;
  LOG(INFO) << JobLogPrefix()
            << (restarted ? "coordinator restarted" : "session reopened")
            << "; re-reported generation " << membership_->generation();
}

void JobMembership::HandleMembership(const v1::Membership& m) {
  if (membership_ && m.generation() <= membership_->generation()) return;
  // This node's view (common/membership_view.h): its own entry, the runs of
  // local sizes, and the whole table only at node ranks 0 and 1.
  absl::Status valid = ValidateMembershipView(
      "Membership", m, std::numeric_limits<int32_t>::max());
  if (valid.ok() &&
      (m.self().node_name() != config_.node_name ||
       m.self().local_size() != trainers_.params().local_size())) {
    valid = absl::InternalError(
        absl::StrCat("it is addressed to node \"", m.self().node_name(),
                     "\" with ", m.self().local_size(), " trainers"));
  }
  if (!valid.ok()) {
    callbacks_.end(absl::InternalError(absl::StrCat(
        "the coordinator sealed generation ", m.generation(), " of job \"",
        job_, "\" with a membership this node cannot use (", valid.message(),
        "); report this as a bug")));
    return;
  }
  const int32_t node_rank = m.self().node_rank();
  const int32_t rank_offset = m.self().rank_offset();
  if (data_plane_) {
    RetireDataPlane(absl::AbortedError(absl::StrCat(
        "job \"", job_, "\" moved to generation ", m.generation())));
  }
  // Failures held for a previous generation are reported now.
  ReleaseHeld();
  if (membership_) {
    // Nothing a trainer started in the generation this node ran may run in
    // the new one (the fence): whatever of it is left fails now.
    const int64_t previous = membership_->generation();
    const absl::Status* known = aborted(previous);
    callbacks_.fail_generation(
        previous,
        known != nullptr
            ? *known
            : absl::AbortedError(absl::StrCat(
                  "job \"", job_, "\" moved from generation ", previous, " to ",
                  m.generation(),
                  " before this operation ran; re-sync and retry in the "
                  "new generation")),
        /*only_waiting=*/false);
  }
  // The coordinator checks manifests afresh in every generation.
  for (int32_t i = 0; i < trainers_.tensor_count(); ++i) {
    trainers_.tensor(i).mismatch = absl::OkStatus();
  }
  membership_ = m;
  node_rank_ = node_rank;
  rank_offset_ = rank_offset;
  state_ = State::kRunning;
  data_plane_stopped_.reset();
  manifest_sent_ = 0;
  LOG(INFO) << JobLogPrefix() << "generation " << m.generation()
            << " sealed, node rank " << node_rank << " of " << m.num_nodes()
            << ", world size " << m.world_size();
  SendAttached();
  SendManifest();
  ConnectDataPlane();
}

v1::Attached JobMembership::AttachedFor(int32_t local_rank) const {
  v1::Attached a;
  a.set_job(job_);
  a.set_generation(membership_->generation());
  a.set_rank(rank_offset_ + local_rank);
  a.set_size(membership_->world_size());
  a.set_local_rank(local_rank);
  a.set_local_size(trainers_.params().local_size());
  a.set_node_rank(node_rank_);
  a.set_num_nodes(membership_->num_nodes());
  a.set_scheduling(SchedulingModeName(trainers_.mode()));
  trainers_.AddChannel(local_rank, &a);
  return a;
}

void JobMembership::SendAttached() {
  for (int32_t r = 0; r < trainers_.size(); ++r) {
    const JobTrainers::Trainer& trainer = trainers_.trainer(r);
    if (!trainer.sink || trainer.detached) continue;
    v1::TrainerEvent event;
    *event.mutable_attached() = AttachedFor(r);
    trainer.sink->Send(std::move(event));
  }
}

void JobMembership::SendManifest() {
  // Tensors declared after the plan that already has them (on a node that
  // joined a running job, for one) take their ids from it: no new plan
  // version will name them again.
  AssignPlannedIds();
  if (!membership_ || state_ != State::kRunning) return;
  int32_t complete = 0;
  while (complete < trainers_.tensor_count() &&
         trainers_.tensor(complete).declared_by == trainers_.local_size()) {
    ++complete;
  }
  if (complete == manifest_sent_) return;
  v1::AgentMessage message;
  v1::Manifest* manifest = message.mutable_manifest();
  manifest->set_job(job_);
  manifest->set_generation(membership_->generation());
  for (int32_t i = 0; i < complete; ++i) {
    *manifest->add_tensors() = trainers_.tensor(i).spec;
  }
  manifest_seq_ = env_.coordinator->Send(std::move(message));
  manifest_sent_ = complete;
}

void JobMembership::HandlePlan(const v1::TensorPlan& plan) {
  if (plan_ && plan.version() < plan_->version()) return;
  plan_ = plan;
  partition_bytes_ = plan.partition_bytes();
  AssignPlannedIds();
  // Ids are dense from 0; the data plane negotiates over the ids every
  // node knows.
  if (data_plane_) data_plane_->SetKnownTensors(plan.tensors_size());
  MaybeConnectDevices();
  callbacks_.submit_waiting();
}

void JobMembership::AssignPlannedIds() {
  if (!plan_) return;
  absl::flat_hash_map<std::pair<std::string, int32_t>,
                      const v1::TensorPlanEntry*>
      planned;
  for (int32_t i = 0; i < trainers_.tensor_count(); ++i) {
    const LocalTensor& tensor = trainers_.tensor(i);
    if (tensor.tensor_id < 0) {
      planned.emplace(std::make_pair(tensor.spec.name(), tensor.spec.version()),
                      nullptr);
    }
  }
  if (planned.empty()) return;
  for (const v1::TensorPlanEntry& entry : plan_->tensors()) {
    auto it = planned.find(
        std::make_pair(entry.spec().name(), entry.spec().version()));
    if (it != planned.end()) it->second = &entry;
  }
  for (int32_t i = 0; i < trainers_.tensor_count(); ++i) {
    LocalTensor& tensor = trainers_.tensor(i);
    if (tensor.tensor_id >= 0) continue;
    const v1::TensorPlanEntry* entry =
        planned.at(std::make_pair(tensor.spec.name(), tensor.spec.version()));
    if (entry == nullptr) continue;
    tensor.tensor_id = entry->tensor_id();
    tensor.priority = entry->priority();
  }
}

void JobMembership::AdmitJoins(int64_t generation) {
  // Once per generation: every local trainer reaches the same commit.
  if (!membership_ || state_ != State::kRunning ||
      generation != membership_->generation() ||
      admitted_generation_ == generation) {
    return;
  }
  admitted_generation_ = generation;
  v1::AgentMessage message;
  v1::AdmitJoins* admit = message.mutable_admit_joins();
  admit->set_job(job_);
  admit->set_generation(generation);
  env_.coordinator->Send(std::move(message));
}

void JobMembership::HandleGenerationAborted(const v1::GenerationAborted& a) {
  if (!membership_ || a.aborted_generation() != membership_->generation()) {
    return;
  }
  AbortGeneration(
      a, absl::AbortedError(absl::StrCat(
             "generation ", a.aborted_generation(), " of job \"", job_,
             "\" was aborted",
             a.lost_node().empty()
                 ? ""
                 : absl::StrCat(": node ", a.lost_node(), " was lost"),
             a.reason().empty() ? "" : absl::StrCat(" (", a.reason(), ")"),
             "; re-sync and retry in the next generation")));
}

void JobMembership::AbortGeneration(const v1::GenerationAborted& a,
                                    const absl::Status& status) {
  aborted_[a.aborted_generation()] = status;
  LOG(WARNING) << JobLogPrefix() << status.message();
  state_ = State::kReforming;
  if (data_plane_) RetireDataPlane(status);
  // Failures held while waiting for this news now name the lost node.
  ReleaseHeld();
  // Every ready operation of the aborted generation fails now, including
  // those a collective of the old data plane may still hold for a while
  // (their tensors stay leased until it lets go); the trainers retry them in
  // the next generation.
  callbacks_.fail_generation(a.aborted_generation(), status,
                             /*only_waiting=*/false);
  v1::TrainerEvent event;
  *event.mutable_generation_aborted() = a;
  trainers_.SendToAll(event);
}

void JobMembership::HandleError(uint64_t reply_to, const v1::Error& error) {
  const absl::Status status(static_cast<absl::StatusCode>(error.code()),
                            error.message());
  if (error.has_mismatch()) {
    const v1::TensorMismatch& mismatch = error.mismatch();
    for (int32_t i = 0; i < trainers_.tensor_count(); ++i) {
      LocalTensor& tensor = trainers_.tensor(i);
      if (tensor.spec.name() != mismatch.tensor() ||
          tensor.spec.version() != mismatch.version()) {
        continue;
      }
      tensor.mismatch = absl::FailedPreconditionError(error.message());
      callbacks_.mismatch(i, tensor.mismatch);
    }
    LOG(ERROR) << JobLogPrefix() << error.message();
    return;
  }
  if (reply_to != 0 && reply_to == manifest_seq_ &&
      status.code() == absl::StatusCode::kAborted) {
    // The manifest was for a generation that ended before the coordinator
    // read it (a node was lost meanwhile): not a refusal of the
    // declarations. The next generation's membership sends them again.
    LOG(INFO) << JobLogPrefix()
              << "manifest overtaken by a new generation: " << error.message();
    return;
  }
  if (reply_to != 0 && reply_to == manifest_seq_) {
    // The coordinator refused this node's declarations outright (not a
    // mismatch between nodes): nothing declared can ever run.
    LOG(ERROR) << JobLogPrefix() << "manifest refused: " << error.message();
    callbacks_.end(
        absl::Status(status.code(),
                     absl::StrCat("the coordinator refused this node's tensor "
                                  "declarations: ",
                                  error.message())));
    return;
  }
  if (reply_to != 0 && reply_to == join_seq_) {
    LOG(ERROR) << JobLogPrefix() << "join refused: " << error.message();
    callbacks_.end(status);
    return;
  }
  if (reply_to != 0 && reply_to == rejoin_seq_) {
    // The coordinator moved on without us (it declared this node lost while
    // the session was down): drop the generation and join afresh.
    LOG(WARNING) << JobLogPrefix() << "rejoin refused (" << error.message()
                 << "); joining again";
    const absl::Status aborted = absl::AbortedError(
        absl::StrCat("this node lost its coordinator session and generation ",
                     membership_ ? membership_->generation() : 0, " of job \"",
                     job_, "\" moved on without it (", error.message(),
                     "); re-sync and retry in the next generation"));
    if (membership_ && state_ == State::kRunning) {
      // As if the abort the node missed had reached it (a node frozen past
      // the liveness bound wakes up here): every operation of the old
      // generation fails now, held ones included, and the trainers hear
      // of it. Kept waiting, one would be run by the next generation's data
      // plane, where no other node ever runs it.
      v1::GenerationAborted missed;
      missed.set_job(job_);
      missed.set_aborted_generation(membership_->generation());
      missed.set_reason(std::string(error.message()));
      AbortGeneration(missed, aborted);
    }
    state_ = State::kJoining;
    SendJoin();
    return;
  }
  LOG(WARNING) << JobLogPrefix() << "coordinator error: " << error.message();
}

void JobMembership::ConnectDataPlane() {
  const v1::Membership m = *membership_;
  ConnectRequest request;
  request.node_rank = node_rank_;
  request.num_nodes = m.num_nodes();
  request.prefix = m.store_prefix() +
                   (absl::EndsWith(m.store_prefix(), "/") ? "" : "/") + "data";
  request.store = env_.store_factory(job_, m.generation());
  request.count = config_.data_channels;
  request.timeout = config_.op_timeout;
  request.reuse_key = LinkKey("data");
  request.secret = m.data_plane_secret();
  request.negotiation = config_.negotiation;
  const int64_t generation = m.generation();
  connectors_.emplace_back([this, request, generation]() mutable {
    // std::function needs a copyable task: share the move-only result.
    auto comms = std::make_shared<absl::StatusOr<DataConnections>>(
        absl::UnavailableError("not connected"));
    // Node rank 0's --data_channels holds for everyone, so agents started
    // with different values still build the same communicators.
    const LinkCounts before = env_.transport->link_counts();
    absl::StatusOr<int> channels = AgreeOnChannels(request);
    // And its negotiation wire (--negotiation).
    absl::StatusOr<NegotiationChoice> wire =
        channels.ok() ? AgreeOnNegotiation(request) : channels.status();
    if (wire.ok()) request.negotiation = *wire;
    absl::StatusOr<std::unique_ptr<NegotiationWire>> negotiation =
        wire.ok() ? env_.transport->ConnectNegotiation(request) : wire.status();
    if (negotiation.ok()) {
      request.count = *channels;
      absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> data =
          env_.transport->Connect(request);
      if (data.ok()) {
        const LinkCounts after = env_.transport->link_counts();
        *comms = DataConnections{
            std::move(negotiation).value(),
            std::move(data).value(),
            {after.kept - before.kept, after.made - before.made}};
      } else {
        *comms = data.status();
      }
    } else {
      *comms = negotiation.status();
    }
    callbacks_.post([this, generation, comms] {
      OnDataPlaneConnected(generation, std::move(*comms));
    });
  });
}

absl::StatusOr<int> JobMembership::AgreeOnChannels(
    const ConnectRequest& request) const {
  absl::StatusOr<std::string> published = NodeRankZeroValue(
      request, "channels", std::to_string(config_.data_channels));
  if (!published.ok()) return published.status();
  int channels = 0;
  if (!absl::SimpleAtoi(*published, &channels) || channels < 1 ||
      channels > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("node rank 0 published \"", *published,
                     "\" as its data channel count; expected 1..16"));
  }
  if (channels != config_.data_channels) {
    // On a connector thread: membership_ (the generation) is not ours to
    // read here.
    LOG(WARNING) << baton::LogPrefix({job_, 0, config_.node_name})
                 << "using node rank 0's " << channels
                 << " data channels instead of --data_channels="
                 << config_.data_channels;
  }
  return channels;
}

void JobMembership::OnDataPlaneConnected(
    int64_t generation, absl::StatusOr<DataConnections> comms) {
  if (state_ != State::kRunning || !membership_ ||
      membership_->generation() != generation) {
    return;  // a newer generation replaced it; the comms close here
  }
  if (!comms.ok()) {
    if (comms.status().code() == absl::StatusCode::kAborted) return;
    // Whatever went wrong (peers missing, the store unreachable after a
    // coordinator restart), a new generation is the way out: treat it like a
    // transport failure.
    OnDataPlaneStopped(
        nullptr,
        absl::Status(absl::StatusCode::kUnavailable,
                     absl::StrCat("connecting the data plane "
                                  "of generation ",
                                  generation, ": ", comms.status().message())));
    return;
  }
  SchedulerOptions options;
  options.job = job_;
  options.generation = generation;
  options.node_rank = node_rank_;
  options.num_nodes = membership_->num_nodes();
  options.world_size = membership_->world_size();
  options.mode = trainers_.mode();
  options.credit_bytes = config_.credit_bytes;
  // Where tuning starts: the plan's size (the coordinator's
  // --partition_bytes), or its default before the plan arrived.
  options.partition_bytes =
      partition_bytes_ > 0 ? partition_bytes_ : int64_t{4} << 20;
  options.tune_partition_bytes = trainers_.TunesPartitions();
  options.tune_credit_bytes = config_.tune_credit_bytes;
  options.op_timeout = config_.op_timeout;
  options.launch_trace = launch_trace_;
  // --timeline_records=0: nothing is recorded, not even built.
  options.timeline = config_.timeline_records > 0 ? &timeline_ : nullptr;
  // Only node ranks 0 and 1 know every name: elsewhere errors name ranks.
  for (const v1::NodeInfo& node : membership_->nodes()) {
    options.node_names.push_back(node.node_name());
  }
  Scheduler::Callbacks callbacks;
  callbacks.op_done = callbacks_.op_done;
  callbacks.bytes_skipped = [metrics = env_.metrics](int64_t bytes) {
    metrics->BytesSkipped(bytes);
  };
  callbacks.round_exchanged = [metrics = env_.metrics](absl::Duration exchange,
                                                       bool started) {
    metrics->NegotiationRound(absl::ToChronoNanoseconds(exchange), started);
  };
  auto plane_ptr = std::make_shared<Scheduler*>(nullptr);
  callbacks.stopped = [this, plane_ptr](absl::Status status) {
    callbacks_.post([this, plane_ptr, status = std::move(status)] {
      OnDataPlaneStopped(*plane_ptr, status);
    });
  };
  data_plane_ = std::make_unique<Scheduler>(
      std::move(options), std::move(comms->negotiation), std::move(comms->data),
      std::move(callbacks));
  *plane_ptr = data_plane_.get();
  if (plan_) data_plane_->SetKnownTensors(plan_->tensors_size());
  LOG(INFO) << JobLogPrefix() << "data plane of generation " << generation
            << " connected (" << comms->links.kept << " connections kept, "
            << comms->links.made << " made)";
  MaybeConnectDevices();
  callbacks_.submit_waiting();
}

void JobMembership::MaybeConnectDevices() {
  if (!data_plane_ || !plan_ || state_ != State::kRunning || !membership_ ||
      devices_generation_ == membership_->generation()) {
    return;
  }
  bool cuda = false;
  for (const v1::TensorPlanEntry& entry : plan_->tensors()) {
    cuda = cuda || entry.spec().memory() == v1::MEMORY_KIND_CUDA;
  }
  if (!cuda) return;
  const int64_t generation = membership_->generation();
  devices_generation_ = generation;
  devices_failed_.reset();
  // The plan lists only tensors every local trainer declared, so every
  // trainer has its GPU by now.
  const std::vector<int> devices = trainers_.CudaDevices();
  if (env_.gpus->memory == nullptr ||
      std::find(devices.begin(), devices.end(), -1) != devices.end()) {
    OnDevicesConnected(generation,
                       absl::FailedPreconditionError(absl::StrCat(
                           "job \"", job_, "\" has CUDA tensors, but ",
                           env_.gpus->memory == nullptr
                               ? absl::StrCat("agent ", config_.node_name,
                                              " has no GPU transport: ",
                                              env_.gpus->unavailable)
                               : "not every local trainer declared one")));
    return;
  }
  const v1::Membership& m = *membership_;
  ConnectRequest request;
  request.node_rank = node_rank_;
  request.num_nodes = m.num_nodes();
  request.prefix = m.store_prefix() +
                   (absl::EndsWith(m.store_prefix(), "/") ? "" : "/") + "gpu";
  request.store = env_.store_factory(job_, generation);
  request.count = 1;
  request.timeout = config_.op_timeout;
  request.secret = m.data_plane_secret();
  const GpuCrossNode cross_node = config_.gpu_cross_node;
  LOG(INFO) << JobLogPrefix() << "connecting the GPU communicators of "
            << devices.size()
            << " local GPUs (--gpu_cross_node=" << GpuCrossNodeName(cross_node)
            << ")";
  connectors_.emplace_back([this, request, generation, devices, cross_node] {
    auto group = std::make_shared<absl::StatusOr<DeviceGroup>>(
        absl::UnavailableError("not connected"));
    *group = [&]() -> absl::StatusOr<DeviceGroup> {
      auto transport = env_.gpus->transport(devices);
      if (!transport.ok()) return transport.status();
      DeviceGroup connected;
      connected.cross_node = cross_node;
      connected.memory = env_.gpus->memory.get();
      if (cross_node == GpuCrossNode::kNccl) {
        auto comms = (*transport)->ConnectDevices(request);
        if (!comms.ok()) return comms.status();
        connected.comm = std::move(comms->front());
        return connected;
      }
      auto local = (*transport)->ConnectLocal(request.timeout);
      if (!local.ok()) return local.status();
      connected.comm = std::move(*local);
      if (request.num_nodes > 1) {
        ConnectRequest host = request;
        host.prefix += "-host";
        host.reuse_key = LinkKey("gpu-host");
        auto comms = env_.transport->Connect(host);
        if (!comms.ok()) return comms.status();
        connected.host = std::move(comms->front());
      }
      return connected;
    }();
    callbacks_.post([this, generation, group] {
      OnDevicesConnected(generation, std::move(*group));
    });
  });
}

void JobMembership::OnDevicesConnected(int64_t generation,
                                       absl::StatusOr<DeviceGroup> group) {
  if (state_ != State::kRunning || !membership_ ||
      membership_->generation() != generation || !data_plane_) {
    return;  // a newer generation replaced it; the group closes here
  }
  if (!group.ok()) {
    if (group.status().code() == absl::StatusCode::kAborted) return;
    const absl::Status status(
        group.status().code(),
        absl::StrCat("connecting the GPU communicators of job \"", job_,
                     "\" generation ", generation, ": ",
                     group.status().message()));
    LOG(WARNING) << JobLogPrefix() << status.message();
    devices_failed_ = status;
    callbacks_.submit_waiting();  // its CUDA operations fail now
    return;
  }
  data_plane_->AttachDevices(std::move(*group));
  LOG(INFO) << JobLogPrefix() << "GPU communicators of generation "
            << generation << " connected";
  callbacks_.submit_waiting();
}

void JobMembership::OnDataPlaneStopped(Scheduler* plane, absl::Status status) {
  if (plane != nullptr && plane != data_plane_.get()) return;  // retired
  if (state_ != State::kRunning) return;
  LOG(WARNING) << JobLogPrefix() << "data plane stopped: " << status.message();
  if (data_plane_) RetireDataPlane(status);
  const bool transport = status.code() == absl::StatusCode::kUnavailable ||
                         status.code() == absl::StatusCode::kDeadlineExceeded;
  if (!transport) {
    // A node left or the nodes disagree: nothing to wait for, and nothing
    // more can run in this generation.
    // What the data plane holds it finishes itself (launched partitions
    // still complete); what never reached it fails here.
    data_plane_stopped_ = status;
    callbacks_.fail_generation(membership_->generation(), status,
                               /*only_waiting=*/true);
    return;
  }
  // A lost node usually explains this within the liveness bound; until then
  // failures are held so that they can name it.
  data_plane_failure_ = status;
  failure_deadline_ =
      clock_.Now() + absl::FromChrono(env_.coordinator->liveness_timeout());
}

void JobMembership::RetireDataPlane(absl::Status status) {
  data_plane_->Abort(std::move(status));
  retired_.push_back(std::move(data_plane_));
}

void JobMembership::OnTimer(absl::Time now) {
  if (data_plane_failure_ && now >= failure_deadline_) {
    // No lost node was announced: the failure is the data plane's own.
    // Report it to the trainers, then force a new generation (the
    // communicators are rebuilt there) by leaving and joining again.
    const absl::Status status = *data_plane_failure_;
    ReleaseHeld();
    if (state_ == State::kRunning && membership_) {
      aborted_[membership_->generation()] = status;
      callbacks_.fail_generation(membership_->generation(), status,
                                 /*only_waiting=*/false);
      v1::AgentMessage message;
      v1::LeaveJob* leave = message.mutable_leave();
      leave->set_job(job_);
      leave->set_generation(membership_->generation());
      leave->set_reason(std::string(status.message()));
      env_.coordinator->Send(std::move(message));
      state_ = State::kJoining;
      SendJoin();
    }
  }
  // Retired data planes whose threads exited can go.
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [](const std::unique_ptr<Scheduler>& p) {
                                  return p->finished();
                                }),
                 retired_.end());
}

std::optional<absl::Time> JobMembership::failure_deadline() const {
  if (!data_plane_failure_) return std::nullopt;
  return failure_deadline_;
}

void JobMembership::ReleaseHeld() {
  data_plane_failure_.reset();
  callbacks_.release_held();
}

const absl::Status* JobMembership::aborted(int64_t generation) const {
  auto it = aborted_.find(generation);
  return it == aborted_.end() ? nullptr : &it->second;
}

const absl::Status* JobMembership::devices_failed() const {
  if (!devices_failed_ || !membership_ ||
      devices_generation_ != membership_->generation()) {
    return nullptr;
  }
  return &*devices_failed_;
}

std::string JobMembership::JobLogPrefix(int32_t local_rank) const {
  return baton::LogPrefix(
      {job_, membership_ ? membership_->generation() : 0, config_.node_name,
       membership_ && local_rank >= 0 ? rank_offset_ + local_rank : -1});
}

}  // namespace baton::agent
