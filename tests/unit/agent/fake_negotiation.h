#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/transport/negotiation_wire.h"

// An in-process NegotiationWire for the scheduler's tests: N nodes as N
// threads share one hub, each round is a barrier that takes the element-wise
// minimum, and a node that starts a round wakes the others' AwaitRound, as
// TcpRounds does over TCP. A node whose wire is destroyed is gone: its
// peers' rounds and waits fail with UNAVAILABLE naming it, as when TcpRounds
// sees a connection close.

namespace baton::agent {

class FakeNegotiationHub {
 public:
  explicit FakeNegotiationHub(int nodes)
      : nodes_(nodes),
        interrupted_(nodes, false),
        gone_(nodes, false),
        rounds_(nodes, 0) {}

  int nodes() const { return nodes_; }

  absl::Status Exchange(int rank, int64_t* data, size_t count,
                        std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t round = rounds_[rank]++;
    Round& r = round_[round];
    if (r.min.empty()) r.min.assign(data, data + count);
    if (r.min.size() != count) {
      return absl::FailedPreconditionError(
          absl::StrCat("fake negotiation round ", round, ": ", count,
                       " words here, ", r.min.size(), " elsewhere"));
    }
    for (size_t i = 0; i < count; ++i) r.min[i] = std::min(r.min[i], data[i]);
    ++r.arrived;
    cv_.notify_all();
    if (!cv_.wait_for(lock, timeout,
                      [&] { return r.arrived == nodes_ || Gone() >= 0; })) {
      return absl::DeadlineExceededError(absl::StrCat(
          "fake negotiation round ", round, " timed out after ",
          timeout.count(), " ms with ", r.arrived, " of ", nodes_, " nodes"));
    }
    if (r.arrived < nodes_) {
      return absl::UnavailableError(absl::StrCat("fake negotiation round ",
                                                 round, ": node rank ", Gone(),
                                                 " closed its connection"));
    }
    std::copy(r.min.begin(), r.min.end(), data);
    if (++r.left == nodes_) round_.erase(round);
    return absl::OkStatus();
  }

  // True once a peer started this node's next round; false when
  // interrupted.
  absl::StatusOr<bool> Await(int rank) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      return interrupted_[rank] || round_.count(rounds_[rank]) > 0 ||
             Gone() >= 0;
    });
    if (!interrupted_[rank] && round_.count(rounds_[rank]) == 0) {
      return absl::UnavailableError(
          absl::StrCat("waiting for a fake negotiation round: node rank ",
                       Gone(), " closed its connection"));
    }
    if (interrupted_[rank]) {
      interrupted_[rank] = false;
      return false;
    }
    return true;
  }

  void Leave(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    gone_[rank] = true;
    cv_.notify_all();
  }

  void Interrupt(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    interrupted_[rank] = true;
    cv_.notify_all();
  }

 private:
  struct Round {
    std::vector<int64_t> min;
    int arrived = 0;
    int left = 0;
  };
  const int nodes_;
  std::mutex mu_;
  std::condition_variable cv_;
  // A node that left, or -1. Called with mu_ held.
  int Gone() const {
    for (int r = 0; r < nodes_; ++r) {
      if (gone_[r]) return r;
    }
    return -1;
  }

  std::vector<bool> interrupted_;
  std::vector<bool> gone_;
  std::vector<int64_t> rounds_;  // each node's next round
  std::map<int64_t, Round> round_;
};

class FakeNegotiation : public NegotiationWire {
 public:
  FakeNegotiation(std::shared_ptr<FakeNegotiationHub> hub, int rank)
      : hub_(std::move(hub)), rank_(rank) {}
  ~FakeNegotiation() override { hub_->Leave(rank_); }

  int rank() const override { return rank_; }
  int size() const override { return hub_->nodes(); }
  absl::Status ExchangeMin(int64_t* data, size_t count,
                           const CollectiveOptions& options) override {
    if (size() == 1 || count == 0) return absl::OkStatus();
    return hub_->Exchange(rank_, data, count, options.timeout);
  }
  absl::StatusOr<bool> AwaitRound(size_t) override {
    if (size() == 1) return false;
    return hub_->Await(rank_);
  }
  void Interrupt() override { hub_->Interrupt(rank_); }
  bool poisoned() const override { return false; }

 private:
  const std::shared_ptr<FakeNegotiationHub> hub_;
  const int rank_;
};

}  // namespace baton::agent
