#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/transport/transport.h"

namespace baton::agent {

// A communicator's poison (Communicator's contract): the error of the
// collective that failed, after which every call fails with
// FAILED_PRECONDITION naming it. Thread-safe; is_set() never blocks.
class PoisonState {
 public:
  bool is_set() const { return set_.load(std::memory_order_acquire); }

  // Records `status`, unless a status was recorded before: the first one
  // stays (an abort, and the error it causes, are one failure).
  void Set(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (set_.load(std::memory_order_relaxed)) return;
    status_ = std::move(status);
    set_.store(true, std::memory_order_release);
  }

  // The status recorded (OK until set).
  absl::Status cause() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  // OK until set; then FAILED_PRECONDITION "<what> poisoned by <error>;
  // build <again>".
  absl::Status Check(const std::string& what = "communicator",
                     const std::string& again = "a new communicator") const
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (!is_set()) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    return absl::FailedPreconditionError(absl::StrCat(
        what, " poisoned by ", status_.ToString(), "; build ", again));
  }

  // What a host allreduce and broadcast check first: CheckUsable, then
  // their arguments (CheckAllreduceArguments, CheckBroadcastArguments).
  absl::Status CheckAllreduce(const void* data, size_t count,
                              v1::DataType dtype,
                              const CollectiveOptions& options,
                              const std::string& on) const {
    if (absl::Status usable = CheckUsable(options, on); !usable.ok()) {
      return usable;
    }
    return CheckAllreduceArguments(data, count, dtype, options, on);
  }
  absl::Status CheckBroadcast(const void* data, size_t bytes, int root,
                              int size, const CollectiveOptions& options,
                              const std::string& on) const {
    if (absl::Status usable = CheckUsable(options, on); !usable.ok()) {
      return usable;
    }
    return CheckBroadcastArguments(data, bytes, root, size, on);
  }
  absl::Status CheckAllgather(const void* data,
                              absl::Span<const size_t> lengths, int size,
                              const CollectiveOptions& options,
                              const std::string& on) const {
    if (absl::Status usable = CheckUsable(options, on); !usable.ok()) {
      return usable;
    }
    return CheckAllgatherArguments(data, lengths, size, on);
  }
  absl::Status CheckAlltoall(const void* send, const void* recv,
                             absl::Span<const size_t> lengths, int rank,
                             int size, const CollectiveOptions& options,
                             const std::string& on) const {
    if (absl::Status usable = CheckUsable(options, on); !usable.ok()) {
      return usable;
    }
    return CheckAlltoallArguments(send, recv, lengths, rank, size, on);
  }
  absl::Status CheckReduceScatter(const void* data,
                                  absl::Span<const size_t> counts,
                                  v1::DataType dtype, int size,
                                  const CollectiveOptions& options,
                                  const std::string& on) const {
    if (absl::Status usable = CheckUsable(options, on); !usable.ok()) {
      return usable;
    }
    return CheckReduceScatterArguments(data, counts, dtype, size, options, on);
  }

  // Check(), then INVALID_ARGUMENT naming `on` for a timeout that is not
  // positive: what every collective checks first.
  absl::Status CheckUsable(const CollectiveOptions& options,
                           const std::string& on) const {
    if (absl::Status poisoned = Check(); !poisoned.ok()) return poisoned;
    if (options.timeout <= std::chrono::milliseconds(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CollectiveOptions.timeout is ", options.timeout.count(),
                       " ms on ", on, ": give a positive timeout"));
    }
    return absl::OkStatus();
  }

 private:
  std::atomic<bool> set_{false};
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::agent
