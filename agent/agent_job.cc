#include "agent/agent_job.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_context.h"
#include "common/thread_name.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

JobEnvironment WithClock(JobEnvironment env) {
  if (env.clock == nullptr) env.clock = Clock::Real();
  return env;
}

// A new instance number per AgentJob: a job that ends and is attached
// again under the same name never collides with the old one's names.
std::string NewShmPrefix(const AgentConfig& config, const std::string& job) {
  static std::atomic<uint64_t> instances{0};
  return absl::StrCat("/baton.", config.pid, ".", instances++, ".", job, ".");
}

// The job's doorbell in shared memory; empty when it cannot be created.
SharedMemory CreateDoorbellMemory(const std::string& shm_prefix,
                                  std::optional<gid_t> group,
                                  const std::string& log_prefix) {
  auto doorbell = SharedMemory::Create(shm_prefix + "bell", 4096, group);
  if (doorbell.ok()) return std::move(*doorbell);
  LOG(WARNING) << log_prefix << "no shared-memory fast path ("
               << doorbell.status().message()
               << "); trainers enqueue over gRPC";
  return SharedMemory();
}

}  // namespace

AgentJob::AgentJob(std::string name, Environment env)
    : name_(std::move(name)),
      env_(WithClock(std::move(env))),
      config_(*env_.config),
      clock_(*env_.clock),
      shm_prefix_(NewShmPrefix(config_, name_)),
      doorbell_memory_(
          CreateDoorbellMemory(shm_prefix_, config_.trainer_group,
                               LogPrefix({name_, 0, config_.node_name}))),
      doorbell_(doorbell_memory_.data() != nullptr
                    ? new (doorbell_memory_.data()) Doorbell()
                    : &local_doorbell_),
      trainers_(name_, config_, *env_.gpus, shm_prefix_,
                doorbell_ != &local_doorbell_ ? &doorbell_memory_ : nullptr),
      membership_(name_, env_, &trainers_, MembershipCallbacks()),
      operations_(
          name_, env_, &trainers_, &membership_,
          [this](std::function<void()> task) { Post(std::move(task)); }),
      reporter_(name_, env_, &trainers_, &membership_, &operations_),
      next_report_(clock_.Now()) {
  thread_ = std::thread([this] {
    SetThreadName("baton-job");
    Loop();
  });
}

AgentJob::~AgentJob() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  doorbell_->Ring();
  thread_.join();
  // Data planes report into the operations through Post, which is closed
  // now; they go before the parts they report into.
  membership_.StopDataPlanes();
  if (doorbell_ != &local_doorbell_) {
    SharedMemory::Unlink(doorbell_memory_.name()).IgnoreError();
  }
}

JobMembership::Callbacks AgentJob::MembershipCallbacks() {
  JobMembership::Callbacks callbacks;
  callbacks.post = [this](std::function<void()> task) {
    Post(std::move(task));
  };
  callbacks.end = [this](const absl::Status& status) { End(status); };
  callbacks.op_done = [this](uint64_t id, absl::Status status) {
    operations_.OpDone(id, std::move(status));
  };
  callbacks.submit_waiting = [this] { operations_.SubmitWaiting(); };
  callbacks.fail_generation = [this](int64_t generation,
                                     const absl::Status& status,
                                     bool only_waiting) {
    operations_.FailGeneration(generation, status, only_waiting);
  };
  callbacks.release_held = [this] { operations_.ReleaseHeld(); };
  callbacks.mismatch = [this](int32_t index, const absl::Status& status) {
    operations_.FailUnsubmitted(index, status);
  };
  return callbacks;
}

void AgentJob::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    tasks_.push_back(std::move(task));
  }
  doorbell_->Ring();
}

bool AgentJob::finished(int32_t local_rank) const {
  absl::MutexLock lock(&mu_);
  return finished_ranks_.contains(local_rank);
}

void AgentJob::Loop() {
  while (true) {
    // Taken before looking for work: a producer that publishes after the
    // look rings the bell, and the wait below returns at once.
    const uint32_t seen = doorbell_->Snapshot();
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    const bool drained = trainers_.DrainChannels(
        [this](int32_t rank, const TensorEnqueue& enqueue) {
          operations_.Enqueue(rank, enqueue);
        });
    const absl::Time now = clock_.Now();
    OnTimer(now);
    if (!tasks.empty() || drained) continue;
    const absl::Time deadline = std::min(
        {next_report_,
         membership_.failure_deadline().value_or(absl::InfiniteFuture()),
         restart_deadline_.value_or(absl::InfiniteFuture())});
    // Clock is the wall clock: the wait is for the time left, bounded by
    // the report interval whatever a step of the system clock does.
    const absl::Duration left =
        std::clamp(deadline - now, absl::ZeroDuration(),
                   absl::FromChrono(env_.coordinator->report_interval()));
    doorbell_->Wait(
        seen, absl::ToChronoMicroseconds(left) + std::chrono::microseconds(1));
  }
  // Fail what is left while the streams can still carry it.
  if (membership_.state() != JobMembership::State::kDone) {
    End(absl::CancelledError(absl::StrCat("the agent is shutting down; job \"",
                                          name_, "\" stopped on node ",
                                          config_.node_name)));
  }
}

void AgentJob::OnTimer(absl::Time now) {
  membership_.OnTimer(now);
  if (restart_deadline_ && now >= *restart_deadline_) {
    restart_deadline_.reset();
    LeaveAndEnd(absl::AbortedError(absl::StrCat(
                    "no trainer attached to job \"", name_, "\" on node ",
                    config_.node_name, " in place of the lost one within ",
                    config_.trainer_restart_timeout.count(),
                    " ms (the agent's --trainer_restart_timeout_ms); this "
                    "node left the job: restart the job's trainers")),
                /*finished=*/false);
  }
  if (now >= next_report_) {
    SampleMetrics();
    reporter_.Send();
    next_report_ = now + absl::FromChrono(env_.coordinator->report_interval());
  }
}

void AgentJob::Attach(std::shared_ptr<TrainerSink> sink, uint64_t seq,
                      v1::AttachRequest request) {
  (void)seq;
  Post([this, sink = std::move(sink), request = std::move(request)] {
    HandleAttach(sink, request);
  });
}
void AgentJob::Declare(TrainerSink* sink, uint64_t seq,
                       v1::DeclareRequest request) {
  Post([this, sink, seq, request = std::move(request)] {
    HandleDeclare(sink, seq, request);
  });
}
void AgentJob::Enqueue(TrainerSink* sink, uint64_t seq,
                       v1::EnqueueRequest request) {
  (void)seq;
  Post([this, sink, enqueue = TensorEnqueue::FromRequest(request)] {
    HandleEnqueue(sink, enqueue);
  });
}
void AgentJob::AdmitJoins(int64_t generation) {
  Post([this, generation] { membership_.AdmitJoins(generation); });
}
void AgentJob::Detach(TrainerSink* sink, uint64_t seq,
                      v1::DetachRequest request) {
  (void)seq;
  Post([this, sink, request = std::move(request)] {
    HandleDetach(sink, request);
  });
}
void AgentJob::TrainerGone(TrainerSink* sink) {
  Post([this, sink] { HandleTrainerGone(sink); });
}
void AgentJob::OnCoordinatorMessage(v1::CoordinatorMessage message) {
  Post([this, message = std::move(message)] {
    membership_.HandleCoordinatorMessage(message);
  });
}
void AgentJob::OnCoordinatorSession(bool restarted) {
  Post([this, restarted] { membership_.HandleSession(restarted); });
}

void AgentJob::HandleAttach(const std::shared_ptr<TrainerSink>& sink,
                            const v1::AttachRequest& request) {
  const absl::Status status = trainers_.Attach(
      sink, request,
      /*attaching=*/membership_.state() == JobMembership::State::kAttaching);
  if (!status.ok()) {
    sink->Close(status);
    return;
  }
  SampleMetrics();
  if (trainers_.all_attached()) {
    restart_deadline_.reset();
    membership_.Join();
  }
}

void AgentJob::HandleDeclare(TrainerSink* sink, uint64_t seq,
                             const v1::DeclareRequest& request) {
  const int32_t rank = trainers_.RankOf(sink);
  if (rank < 0) return;
  if (!trainers_.Declare(rank, seq, request, [this](int32_t index) {
        return operations_.NextStep(index);
      })) {
    return;
  }
  operations_.TensorsDeclared();
  membership_.SendManifest();
}

void AgentJob::HandleEnqueue(TrainerSink* sink, const TensorEnqueue& enqueue) {
  const int32_t rank = trainers_.RankOf(sink);
  if (rank < 0) return;
  operations_.Enqueue(rank, enqueue);
}

void AgentJob::HandleDetach(TrainerSink* sink,
                            const v1::DetachRequest& request) {
  const int32_t rank = trainers_.RankOf(sink);
  if (rank < 0) return;
  if (!request.reason().empty()) {
    LOG(INFO) << membership_.JobLogPrefix(rank) << "local rank " << rank
              << " detached (" << request.reason() << ")";
  }
  if (!request.finished()) {
    // A trainer that gives up with work unfinished (an error, Ctrl-C) says
    // so: no restart of it is coming, so this node leaves the job at once
    // and the other nodes hear it, instead of waiting for a trainer that
    // will not come back. Only a trainer that vanished without a word (a
    // kill) is waited for (HandleTrainerGone).
    if (membership_.state() == JobMembership::State::kDone) return;
    operations_.DropDeliveries(rank);
    std::string reason =
        absl::StrCat(TrainerText(rank), " left with work unfinished");
    if (!request.reason().empty()) {
      absl::StrAppend(&reason, " (", request.reason(), ")");
    }
    return LeaveForTrainer(rank, reason);
  }
  trainers_.Detach(rank);
  operations_.DropDeliveries(rank);
  {
    absl::MutexLock lock(&mu_);
    finished_ranks_.insert(rank);
  }
  const std::shared_ptr<TrainerSink> sink_of_rank =
      trainers_.trainer(rank).sink;
  if (trainers_.all_detached()) {
    LeaveAndEnd(
        absl::FailedPreconditionError(absl::StrCat(
            "job \"", name_, "\" finished on node ", config_.node_name)),
        /*finished=*/true);
  }
  // After the job is marked ended: a trainer that hears the close and
  // attaches again under this name gets a fresh job, not this one (which
  // would refuse it as already running).
  sink_of_rank->Close(absl::OkStatus());
}

void AgentJob::HandleTrainerGone(TrainerSink* sink) {
  const int32_t rank = trainers_.RankOf(sink);
  if (rank < 0 || membership_.state() == JobMembership::State::kDone) return;
  operations_.DropDeliveries(rank);
  const std::string reason = absl::StrCat(TrainerText(rank), " disconnected");
  if (!membership_.membership()) {
    // Never formed: nothing to go on with.
    return LeaveForTrainer(rank, reason);
  }
  const int32_t min_nodes = trainers_.params().min_nodes();
  if (min_nodes > 0 && min_nodes < trainers_.params().expected_nodes()) {
    // An elastic job goes on without this node at once; trainers started
    // again here join it as a new node (baton.torch.elastic brings them
    // the state), instead of taking the lost trainer's place.
    return LeaveForTrainer(
        rank,
        absl::StrCat(reason, "; the job is elastic (min_nodes ", min_nodes,
                     " of ", trainers_.params().expected_nodes(),
                     "), so its other nodes go on without this one"));
  }
  // The job goes on once a trainer attaches again as this local rank (a
  // restarted trainer); until then nothing can run, here or on the other
  // nodes, which the generation's end tells.
  LOG(WARNING) << membership_.JobLogPrefix(rank) << reason << "; waiting up to "
               << config_.trainer_restart_timeout.count()
               << " ms for a trainer to attach again as local rank " << rank;
  const absl::Status status = absl::AbortedError(absl::StrCat(
      reason, "; the job goes on once a trainer attaches again as local rank ",
      rank, " of node ", config_.node_name, ": retry then"));
  trainers_.Lose(rank);
  membership_.LoseTrainer(status);
  operations_.FailAll(status);
  if (!restart_deadline_) {
    restart_deadline_ =
        clock_.Now() + absl::FromChrono(config_.trainer_restart_timeout);
  }
  SampleMetrics();
}

std::string AgentJob::TrainerText(int32_t rank) const {
  return absl::StrCat("trainer local rank ", rank, " (pid ",
                      trainers_.trainer(rank).pid, ") of job \"", name_,
                      "\" on node ", config_.node_name);
}

void AgentJob::LeaveForTrainer(int32_t rank, const std::string& reason) {
  trainers_.Detach(rank);
  LOG(WARNING) << membership_.JobLogPrefix(rank) << reason
               << "; this node leaves the job";
  LeaveAndEnd(absl::AbortedError(absl::StrCat(
                  reason,
                  "; this node left the job: restart the job's trainers on "
                  "this node")),
              /*finished=*/false);
}

void AgentJob::LeaveAndEnd(const absl::Status& status, bool finished) {
  // The last progress first, so the job's global step counts this node's
  // final steps (a short job may end before its first periodic report).
  if (finished) reporter_.Send();
  membership_.Leave(status, finished);
  End(status);
}

void AgentJob::End(const absl::Status& status) {
  if (membership_.state() == JobMembership::State::kDone) return;
  ended_ = true;
  membership_.End(status);
  operations_.FailAll(status);
  trainers_.CloseAll(status);
  SampleMetrics();
  if (!done_reported_ && env_.on_done) {
    done_reported_ = true;
    env_.on_done();
  }
}

void AgentJob::SampleMetrics() {
  env_.metrics->SetTrainersAttached(trainers_.connected());
  if (const Scheduler* data_plane = membership_.data_plane()) {
    const Scheduler::Stats stats = data_plane->stats();
    env_.metrics->SetDataPlane(stats.queue_depth, stats.bytes_in_flight);
  } else {
    env_.metrics->SetDataPlane(0, 0);
  }
}

}  // namespace baton::agent
