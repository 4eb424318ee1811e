#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/channel_mapping.h"
#include "agent/links.h"

namespace baton::agent {

// "tensor "T" step S: <message>", unless `message` names the tensor already:
// every failure a trainer sees names its operation, also those for a reason
// that is not about the tensor (a stopped data plane, a node that left).
std::string OperationFailureMessage(const std::string& tensor, int64_t step,
                                    absl::string_view message);

// The end of one operation of a job on this node (PyTorch c10d's
// Work::finish is the model). It is finished exactly once, under its own
// lock, by whichever comes first: the data plane, on the thread that ran the
// collective (DataPlaneDone with a success), or the job thread (Finish: a
// failure the job explained, a generation abort, a lost node, a stop). The
// call that finishes it tells the trainers, each once, over its channel or
// its stream; every later Finish returns false and changes nothing.
//
// Apart from that it records when the data plane let go of the tensor's
// buffers (DataPlaneDone). That is the lease: the tensor's next operation is
// not submitted before, even when its trainers heard of a failure long
// before (an abort does not wait for a collective still inside an old data
// plane).
//
// Thread-safe.
class OpCompletion {
 public:
  // Whom to tell: a local rank that enqueued the operation.
  struct Target {
    int32_t rank = 0;
    std::shared_ptr<TrainerSink> sink;
    // Enqueued over the trainer's channel: a success is completed there
    // (over the stream when its ring is full); null: over the stream.
    std::shared_ptr<ChannelMapping> mapping;
  };

  // Operation of tensor `tensor` (local index `index`), step `step`, run in
  // `generation`.
  OpCompletion(std::string tensor, int32_t index, int64_t step,
               int64_t generation);

  OpCompletion(const OpCompletion&) = delete;
  OpCompletion& operator=(const OpCompletion&) = delete;

  // Local rank target.rank enqueued it: it hears of the outcome (a second
  // target of the same rank replaces the first).
  void AddTarget(Target target) ABSL_LOCKS_EXCLUDED(mu_);
  // Local rank `rank` detached or is gone: it is told nothing more.
  void Forget(int32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  // The data plane will run it: until DataPlaneDone the buffers are its.
  void Submitted() ABSL_LOCKS_EXCLUDED(mu_);

  // Finishes it at `when` with `status` and tells every target; false when
  // it was finished already (nothing changes then). A failure's message
  // names the operation (OperationFailureMessage).
  bool Finish(const absl::Status& status, absl::Time when)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The data plane no longer touches the buffers. A success finishes it (as
  // Finish, in the same critical section); a failure does not: the job
  // explains it first (a lost node, a generation abort) and then finishes
  // it, unless something else did meanwhile.
  void DataPlaneDone(const absl::Status& status, absl::Time when)
      ABSL_LOCKS_EXCLUDED(mu_);

  bool finished() const ABSL_LOCKS_EXCLUDED(mu_);
  // Not submitted, or the data plane let go.
  bool released() const ABSL_LOCKS_EXCLUDED(mu_);
  // Once finished: how, and when.
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time finished_at() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& tensor() const { return tensor_; }
  int32_t index() const { return index_; }
  int64_t step() const { return step_; }
  int64_t generation() const { return generation_; }

 private:
  bool FinishLocked(const absl::Status& status, absl::Time when)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Tell(const std::vector<Target>& targets,
            const absl::Status& status) const;

  // Constant after construction.
  const std::string tensor_;
  const int32_t index_;
  const int64_t step_;
  const int64_t generation_;

  mutable absl::Mutex mu_;
  std::vector<Target> targets_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time finished_at_ ABSL_GUARDED_BY(mu_);
  bool in_data_plane_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::agent
