#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/transport/tcp/tcp_link.h"
#include "agent/transport/transport.h"

namespace baton::agent::tcp {

// The connections an agent keeps between generations, so that a re-form
// connects only to new or changed peers (docs/architecture.md, "Elastic
// training"). One per TcpTransport; thread-safe.
//
// Links live under a key, "<job>/<purpose>/<peer set>" (one job's data
// rings, say): a communicator that ends gives its links back (Return), idle
// unless broken, and the next connect under that key takes them all (Take)
// and keeps those its peers kept too. Until then a link is "lent": Take
// waits for the lent links of its key first, since the communicators of the
// generation that just ended are still letting go of them.
class LinkPool {
 public:
  LinkPool() = default;
  ~LinkPool();  // closes the idle links
  LinkPool(const LinkPool&) = delete;
  LinkPool& operator=(const LinkPool&) = delete;

  // Takes every idle link under `key`, after waiting up to `wait` for the
  // links of `key` still lent. The taken links count as lent: each goes back
  // by Return (kept or closed).
  std::vector<Link> Take(const std::string& key, absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);

  // `count` new links of `key` were handed to a communicator.
  void Lend(const std::string& key, int count) ABSL_LOCKS_EXCLUDED(mu_);

  // A communicator is done with `link` (a lent one of `key`): kept idle
  // unless broken or its key was dropped, closed otherwise.
  void Return(const std::string& key, Link link) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes every idle link under a key starting with `prefix`, and those
  // lent now as they come back (a job that ended on this agent). A later
  // Take or Lend of such a key keeps links again.
  void Drop(const std::string& prefix) ABSL_LOCKS_EXCLUDED(mu_);

  // How many links connects kept from an earlier generation, and how many
  // they made anew, since the agent started.
  void Count(int64_t kept, int64_t made) ABSL_LOCKS_EXCLUDED(mu_);
  LinkCounts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::vector<Link> idle;
    int lent = 0;
    // Dropped while links were lent: those are closed as they come back.
    bool dropped = false;
  };

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  LinkCounts counts_ ABSL_GUARDED_BY(mu_);
};

// The links one communicator holds, by node rank (fd -1: none): given back
// to `pool` under `key` when it ends, or closed when there is no pool.
class LentLinks {
 public:
  LentLinks() = default;
  LentLinks(std::vector<Link> links, LinkPool* pool, std::string key)
      : links_(std::move(links)), pool_(pool), key_(std::move(key)) {}
  ~LentLinks();
  LentLinks(LentLinks&& other) noexcept { *this = std::move(other); }
  LentLinks& operator=(LentLinks&& other) noexcept;
  LentLinks(const LentLinks&) = delete;
  LentLinks& operator=(const LentLinks&) = delete;

  Link& operator[](int rank) { return links_[rank]; }
  const Link& operator[](int rank) const { return links_[rank]; }
  int size() const { return static_cast<int>(links_.size()); }

 private:
  void GiveBack();

  std::vector<Link> links_;
  LinkPool* pool_ = nullptr;
  std::string key_;
};

}  // namespace baton::agent::tcp
