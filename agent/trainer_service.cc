#include "agent/trainer_service.h"

#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_job.h"
#include "agent/links.h"
#include "common/grpc_util.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

class TrainerReactor;

// Outlives the reactor: jobs may hold it after the stream ended, and then
// their events are dropped.
class StreamSink final : public TrainerSink {
 public:
  explicit StreamSink(TrainerReactor* reactor) : reactor_(reactor) {}
  void Send(v1::TrainerEvent event) override ABSL_LOCKS_EXCLUDED(mu_);
  void Close(absl::Status status) override ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  TrainerReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class TrainerReactor final
    : public grpc::ServerBidiReactor<v1::TrainerRequest, v1::TrainerEvent> {
 public:
  explicit TrainerReactor(const TrainerService::JobFinder& find_job)
      : find_job_(find_job), sink_(std::make_shared<StreamSink>(this)) {
    StartRead(&request_);
  }

  void Send(v1::TrainerEvent event) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    outbox_.push_back(std::move(event));
    if (!writing_) {
      writing_ = true;
      StartWrite(&outbox_.front());
    }
  }

  void Close(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (closing_ || finished_) return;
    closing_ = true;
    close_status_ = ToGrpcStatus(status);
    if (!writing_) FinishLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The trainer closed its side or the connection broke. After a
      // finished detach the job closes the stream, once it has handled the
      // detach: a trainer that hears the close and attaches again under the
      // job's name then never reaches the ending job (which would refuse it
      // as already running).
      if (detached_) return;
      if (job_) job_->TrainerGone(sink_.get());
      Close(absl::OkStatus());
      return;
    }
    Dispatch();
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    outbox_.pop_front();
    if (!ok) {
      outbox_.clear();
      writing_ = false;
      if (!finished_) FinishLocked();
      return;
    }
    if (!outbox_.empty()) {
      StartWrite(&outbox_.front());
      return;
    }
    writing_ = false;
    if (closing_ && !finished_) FinishLocked();
  }

  // No OnCancel: it may run while a read reaction is using job_, and OnDone,
  // which always follows, reports the trainer gone.
  void OnDone() override {
    sink_->Detach();
    if (job_ && !detached_) job_->TrainerGone(sink_.get());
    delete this;
  }

 private:
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    Finish(close_status_);
  }

  void Dispatch() {
    const uint64_t seq = request_.seq();
    if (!job_) {
      if (!request_.has_attach()) {
        Close(absl::InvalidArgumentError(
            "the first TrainerRequest of a session must be attach"));
        return;
      }
      auto job =
          find_job_(request_.attach().job(), request_.attach().local_rank());
      if (!job.ok()) {
        Close(job.status());
        return;
      }
      job_ = *job;
      job_->Attach(sink_, seq, std::move(*request_.mutable_attach()));
      return;
    }
    switch (request_.body_case()) {
      case v1::TrainerRequest::kDeclare:
        job_->Declare(sink_.get(), seq, std::move(*request_.mutable_declare()));
        break;
      case v1::TrainerRequest::kEnqueue:
        job_->Enqueue(sink_.get(), seq, std::move(*request_.mutable_enqueue()));
        break;
      case v1::TrainerRequest::kAdmitJoins:
        job_->AdmitJoins(request_.admit_joins().generation());
        break;
      case v1::TrainerRequest::kDetach:
        detached_ = request_.detach().finished();
        job_->Detach(sink_.get(), seq, std::move(*request_.mutable_detach()));
        break;
      case v1::TrainerRequest::kAttach:
        Close(absl::FailedPreconditionError(
            "this session is already attached; open a new session to attach "
            "again"));
        break;
      default:
        Close(absl::InvalidArgumentError(
            "TrainerRequest has no body: give attach, declare, enqueue, "
            "admit_joins or detach"));
        break;
    }
  }

  const TrainerService::JobFinder& find_job_;
  const std::shared_ptr<StreamSink> sink_;
  // Reads are sequential: only the reaction thread touches these.
  v1::TrainerRequest request_;
  std::shared_ptr<AgentJob> job_;
  bool detached_ = false;

  absl::Mutex mu_;
  std::deque<v1::TrainerEvent> outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
};

void StreamSink::Send(v1::TrainerEvent event) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Send(std::move(event));
}

void StreamSink::Close(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Close(std::move(status));
}

}  // namespace

grpc::ServerBidiReactor<v1::TrainerRequest, v1::TrainerEvent>*
TrainerService::TrainerSession(grpc::CallbackServerContext* context) {
  (void)context;
  return new TrainerReactor(find_job_);
}

}  // namespace baton::agent
