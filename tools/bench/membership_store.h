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
  // Runs on the completion queue threads while the seal's memberships
  // arrive, so the common case (the same membership as the one kept last)
  // is compared field by field, without serializing it.
  std::shared_ptr<const v1::Membership> Keep(const v1::Membership& membership) {
    std::shared_ptr<const v1::Membership> last;
    {
      absl::MutexLock lock(&mu_);
      last = last_;
    }
    if (last != nullptr && Same(*last, membership)) return last;
    std::string bytes;
    membership.SerializeToString(&bytes);
    absl::MutexLock lock(&mu_);
    std::shared_ptr<const v1::Membership>& kept = kept_[bytes];
    if (kept == nullptr) kept = std::make_shared<v1::Membership>(membership);
    last_ = kept;
    return kept;
  }

 private:
  // Every field equal. False, so that Keep compares bytes, when the
  // messages have fields this function does not know (the protocol grew).
  static bool Same(const v1::Membership& a, const v1::Membership& b) {
    static const bool known =
        v1::Membership::descriptor()->field_count() == 7 &&
        v1::NodeInfo::descriptor()->field_count() == 5;
    if (!known || a.generation() != b.generation() ||
        a.sealed_unix_ms() != b.sealed_unix_ms() ||
        a.world_size() != b.world_size() || a.nodes_size() != b.nodes_size() ||
        a.job() != b.job() || a.store_prefix() != b.store_prefix() ||
        a.data_plane_secret() != b.data_plane_secret()) {
      return false;
    }
    for (int i = 0; i < a.nodes_size(); ++i) {
      const v1::NodeInfo& x = a.nodes(i);
      const v1::NodeInfo& y = b.nodes(i);
      if (x.node_rank() != y.node_rank() || x.local_size() != y.local_size() ||
          x.rank_offset() != y.rank_offset() ||
          x.node_name() != y.node_name() ||
          x.data_address() != y.data_address()) {
        return false;
      }
    }
    return true;
  }

  absl::Mutex mu_;
  // By serialized bytes.
  absl::flat_hash_map<std::string, std::shared_ptr<const v1::Membership>> kept_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const v1::Membership> last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::bench
