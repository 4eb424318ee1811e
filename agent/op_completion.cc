#include "agent/op_completion.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "baton/v1/trainer.pb.h"
#include "common/shm_channel.h"
#include "common/tensor_retired.h"

namespace baton::agent {

std::string OperationFailureMessage(const std::string& tensor, int64_t step,
                                    absl::string_view message) {
  if (absl::StrContains(message, absl::StrCat("\"", tensor, "\""))) {
    return std::string(message);
  }
  return absl::StrCat("tensor \"", tensor, "\" step ", step, ": ", message);
}

OpCompletion::OpCompletion(std::string tensor, int32_t index, int64_t step,
                           int64_t generation)
    : tensor_(std::move(tensor)),
      index_(index),
      step_(step),
      generation_(generation) {}

void OpCompletion::AddTarget(Target target) {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  for (Target& t : targets_) {
    if (t.rank == target.rank) {
      t = std::move(target);
      return;
    }
  }
  targets_.push_back(std::move(target));
}

void OpCompletion::Forget(int32_t rank) {
  absl::MutexLock lock(&mu_);
  targets_.erase(
      std::remove_if(targets_.begin(), targets_.end(),
                     [rank](const Target& t) { return t.rank == rank; }),
      targets_.end());
}

void OpCompletion::Submitted() {
  absl::MutexLock lock(&mu_);
  in_data_plane_ = true;
}

bool OpCompletion::Finish(const absl::Status& status, absl::Time when) {
  std::vector<Target> targets;
  {
    absl::MutexLock lock(&mu_);
    if (!FinishLocked(status, when)) return false;
    targets = std::move(targets_);
    targets_.clear();
  }
  // Outside the lock: only the call that finished it gets here.
  Tell(targets, status);
  return true;
}

void OpCompletion::DataPlaneDone(const absl::Status& status, absl::Time when) {
  std::vector<Target> targets;
  {
    absl::MutexLock lock(&mu_);
    in_data_plane_ = false;
    if (!status.ok() || !FinishLocked(status, when)) return;
    targets = std::move(targets_);
    targets_.clear();
  }
  Tell(targets, status);
}

bool OpCompletion::FinishLocked(const absl::Status& status, absl::Time when) {
  if (finished_) return false;
  finished_ = true;
  status_ = status;
  finished_at_ = when;
  return true;
}

void OpCompletion::Tell(const std::vector<Target>& targets,
                        const absl::Status& status) const {
  if (status.ok()) {
    const ChannelEntry entry{index_, 0, step_, generation_, 0};
    for (const Target& target : targets) {
      if (target.mapping != nullptr && target.mapping->Complete(entry)) {
        continue;
      }
      // A stream rank, or a full ring: the stream carries it.
      v1::TrainerEvent event;
      v1::Completion* c = event.mutable_completion();
      c->set_index(index_);
      c->set_tensor(tensor_);
      c->set_step(step_);
      c->set_generation(generation_);
      target.sink->Send(std::move(event));
    }
    return;
  }
  v1::TrainerEvent event;
  v1::OperationFailed* f = event.mutable_failed();
  f->set_index(index_);
  f->set_tensor(tensor_);
  f->set_step(step_);
  f->set_generation(generation_);
  f->set_code(static_cast<int32_t>(status.code()));
  f->set_message(OperationFailureMessage(tensor_, step_, status.message()));
  f->set_retired(IsTensorRetired(status));
  for (const Target& target : targets) target.sink->Send(event);
}

bool OpCompletion::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

bool OpCompletion::released() const {
  absl::MutexLock lock(&mu_);
  return !in_data_plane_;
}

absl::Status OpCompletion::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Time OpCompletion::finished_at() const {
  absl::MutexLock lock(&mu_);
  return finished_at_;
}

}  // namespace baton::agent
