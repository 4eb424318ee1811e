#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/transport/key_value_store.h"

namespace baton::agent {

// An in-process KeyValueStore (for agents in one process: the tests, the GPU
// benchmark): the coordinator's store semantics
// (blocking Get with a timeout naming the missing keys, ABORTED once the
// scope is aborted) without the coordinator. Counts requests.
//
// Thread-safe.
class MemoryKeyValueStore : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++requests_;
    if (!aborted_.ok()) return aborted_;
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> Get(
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++requests_;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!aborted_.ok()) return true;
      for (const std::string& key : keys) {
        if (!values_.contains(key)) return false;
      }
      return true;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
    if (!aborted_.ok()) return aborted_;
    std::vector<std::string> values;
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      auto it = values_.find(key);
      if (it == values_.end()) {
        missing.push_back(absl::StrCat("\"", key, "\""));
      } else {
        values.push_back(it->second);
      }
    }
    if (!missing.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out after ", timeout.count(),
                       " ms; still missing ", absl::StrJoin(missing, ", ")));
    }
    return values;
  }

  // Fails waiting and later requests with `status` (ABORTED in tests).
  void Abort(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    aborted_ = status;
  }

  int requests() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton::agent
