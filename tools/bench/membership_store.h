// MembershipStore: the memberships the simulated agents received, kept so
// that each can report its own in a RejoinJob after a coordinator restart.

#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "baton/v1/common.pb.h"

namespace baton::bench {

// Keeps one copy of each distinct membership: thousands of agents that got
// the same bytes share one message, while agents that got memberships of
// their own (a coordinator that sends each agent only what it needs) keep
// theirs. Thread-safe; the messages it hands out are never changed.
class MembershipStore {
 public:
  std::shared_ptr<const v1::Membership> Keep(const v1::Membership& membership) {
    std::string bytes;
    membership.SerializeToString(&bytes);
    absl::MutexLock lock(&mu_);
    std::shared_ptr<const v1::Membership>& kept = kept_[bytes];
    if (kept == nullptr) kept = std::make_shared<v1::Membership>(membership);
    return kept;
  }

 private:
  absl::Mutex mu_;
  // By serialized bytes.
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::Membership>> kept_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::bench
