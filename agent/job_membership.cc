#include "agent/job_membership.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log_context.h"
#include "common/membership_view.h"
#include "common/tensor_retired.h"
#include "glog/logging.h"

namespace baton::agent {

JobMembership::JobMembership(std::string job, const JobEnvironment& env,
                             JobTrainers* trainers, Callbacks callbacks)
    : job_(std::move(job)),
      env_(env),
      config_(*env.config),
      trainers_(*trainers),
      callbacks_(std::move(callbacks)),
      data_plane_(
          job_, env_, trainers,
          {callbacks_.post, callbacks_.op_done, callbacks_.submit_waiting,
           [this](int64_t generation, const absl::Status& status) {
             callbacks_.fail_generation(generation, status,
                                        /*only_waiting=*/true);
           },
           callbacks_.release_held,
           [this](const absl::Status& status) { OnGraceEnded(status); }}) {}

JobMembership::~JobMembership() = default;

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
  if (finished) data_plane_.Leave();
  env_.coordinator->Send(std::move(message));
}

void JobMembership::LoseTrainer(const absl::Status& status) {
  if (state_ == State::kAttaching || state_ == State::kDone) return;
  Leave(status, /*finished=*/false);
  if (membership_) aborted_[membership_->generation()] = status;
  data_plane_.Retire(status);
  state_ = State::kAttaching;
}

void JobMembership::End(const absl::Status& status) {
  state_ = State::kDone;
  data_plane_.Retire(status);
  env_.transport->DropKept(data_plane_.LinkKey(""));
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
    for (v1::PartitionTrace& trace : data_plane_.timeline().Query(
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
  // Failures held for a previous generation are reported now.
  data_plane_.Retire(absl::AbortedError(
      absl::StrCat("job \"", job_, "\" moved to generation ", m.generation())));
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
  manifest_sent_ = 0;
  LOG(INFO) << JobLogPrefix() << "generation " << m.generation()
            << " sealed, node rank " << node_rank << " of " << m.num_nodes()
            << ", world size " << m.world_size();
  SendAttached();
  SendManifest();
  data_plane_.Connect(m);
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
  data_plane_.SetPlan(plan);
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
  // Failures held while waiting for this news now name the lost node.
  data_plane_.Retire(status);
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
      tensor.mismatch = TensorRetiredError(error.message());
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

void JobMembership::OnGraceEnded(const absl::Status& status) {
  if (state_ != State::kRunning || !membership_) return;
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

const absl::Status* JobMembership::aborted(int64_t generation) const {
  auto it = aborted_.find(generation);
  return it == aborted_.end() ? nullptr : &it->second;
}

std::string JobMembership::JobLogPrefix(int32_t local_rank) const {
  return baton::LogPrefix(
      {job_, membership_ ? membership_->generation() : 0, config_.node_name,
       membership_ && local_rank >= 0 ? rank_offset_ + local_rank : -1});
}

}  // namespace baton::agent
