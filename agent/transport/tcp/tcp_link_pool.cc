#include "agent/transport/tcp/tcp_link_pool.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"

namespace baton::agent::tcp {

LinkPool::~LinkPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) {
    for (const Link& link : entry.idle) ::close(link.fd);
  }
}

std::vector<Link> LinkPool::Take(const std::string& key, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[key];
  const auto returned = [&entry]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return entry.lent == 0;
  };
  mu_.AwaitWithTimeout(absl::Condition(&returned), wait);
  entry.dropped = false;
  std::vector<Link> taken = std::move(entry.idle);
  entry.idle.clear();
  entry.lent += static_cast<int>(taken.size());
  return taken;
}

void LinkPool::Lend(const std::string& key, int count) {
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[key];
  entry.dropped = false;
  entry.lent += count;
}

void LinkPool::Return(const std::string& key, Link link) {
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[key];
  if (entry.lent > 0) --entry.lent;
  if (link.fd < 0) return;
  if (link.broken || entry.dropped) {
    ::close(link.fd);
    return;
  }
  entry.idle.push_back(link);
}

void LinkPool::Drop(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!absl::StartsWith(it->first, prefix)) {
      ++it;
      continue;
    }
    Entry& entry = it->second;
    for (const Link& link : entry.idle) ::close(link.fd);
    entry.idle.clear();
    if (entry.lent == 0) {
      it = entries_.erase(it);
    } else {
      entry.dropped = true;
      ++it;
    }
  }
}

void LinkPool::Count(int64_t kept, int64_t made) {
  absl::MutexLock lock(&mu_);
  counts_.kept += kept;
  counts_.made += made;
}

LinkCounts LinkPool::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

LentLinks::~LentLinks() { GiveBack(); }

LentLinks& LentLinks::operator=(LentLinks&& other) noexcept {
  if (this != &other) {
    GiveBack();
    links_ = std::move(other.links_);
    other.links_.clear();
    pool_ = other.pool_;
    key_ = std::move(other.key_);
  }
  return *this;
}

void LentLinks::GiveBack() {
  for (Link& link : links_) {
    if (link.fd < 0) continue;
    if (pool_ != nullptr) {
      pool_->Return(key_, link);
    } else {
      ::close(link.fd);
    }
    link.fd = -1;
  }
  links_.clear();
}

}  // namespace baton::agent::tcp
