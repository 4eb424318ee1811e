#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/transport/key_value_store.h"
#include "common/clock.h"
#include "gloo/rendezvous/store.h"

namespace baton::agent {

// gloo's rendezvous::Store over a KeyValueStore: gloo's key K lives at
// "<prefix>/K". Used for one connectFullMesh; nothing else in baton sees it.
//
// gloo expects a store to report failure by exception, so every failure
// throws gloo::IoException carrying the KeyValueStore's message, and the
// first failure's absl::Status is kept (first_error()) so that the caller
// catching gloo's exception can return the store's own code (ABORTED when
// the generation ended, DEADLINE_EXCEEDED naming the missing keys).
//
// No call blocks past `deadline`, whatever timeout gloo asks for: get() and
// wait() without a timeout wait until it, wait(keys, timeout) until the
// earlier of the two.
//
// Thread-safe.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<KeyValueStore> store, std::string prefix,
            const Deadline& deadline);

  void set(const std::string& key, const std::vector<char>& data) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until the key is set (connectFullMesh calls get before wait).
  // Values fetched by an earlier wait() are served from memory once.
  std::vector<char> get(const std::string& key) override
      ABSL_LOCKS_EXCLUDED(mu_);

  void wait(const std::vector<std::string>& keys) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // OK, or the status of the first failed call.
  absl::Status first_error() const ABSL_LOCKS_EXCLUDED(mu_);

  // "<prefix>/<key>".
  std::string FullKey(const std::string& key) const;

 private:
  // Fetches `keys`, waiting up to min(timeout, deadline); throws on failure.
  std::vector<std::string> Fetch(const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records `status` as first_error_ if it is the first, then throws it.
  [[noreturn]] void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const std::shared_ptr<KeyValueStore> store_;
  const std::string prefix_;
  const Deadline deadline_;

  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  // Values wait() fetched that get() has not consumed yet, by gloo key.
  absl::flat_hash_map<std::string, std::string> fetched_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::agent
