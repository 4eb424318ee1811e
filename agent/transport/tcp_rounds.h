#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/scheduler/negotiation_wire.h"
#include "agent/transport/poison_state.h"
#include "agent/transport/tcp_link_pool.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// The scheduler's negotiation rounds (NegotiationWire) on TCP connections
// of their own: one per pair of nodes, read
// and written only by the thread that runs the rounds, which sleeps in
// poll(2) on them.
//
// Why not gloo: gloo's event-loop thread reads every connection and hands
// each message to the waiting thread (two wake-ups per message), and it
// busy-polls while an application thread holds the connection's lock (its
// own send). When every node sends its vector at once, as a round does, a
// sender that is preempted inside that lock keeps the peer's loop thread
// spinning until the next scheduler tick: on a 2-core machine, rounds took
// 2-5 ms instead of 0.2 ms one time in ten (docs/benchmarks.md).
//
// Messages: an 8-byte word count, then that many int64 words, in the host's
// byte order (agents of one job run the same build). Connecting: each node
// listens on an ephemeral port of its data-plane address, publishes
// "<host> <port>" under "<prefix>/rounds/<rank>", connects to every lower
// rank, and accepts every higher one, which introduces itself (magic, its
// rank, a hash of the prefix).
//
// A round carries at most 2^24 words (INVALID_ARGUMENT above that).
//
// A round is not acknowledged: a node that joins a round after the others
// gave up on it (their ExchangeMin timed out) may still complete it from the
// vectors they had sent.
//
// A failure poisons the rounds and shuts down only the connection it came
// from (all of them when the nodes disagree on a round's size), so that
// survivors can keep the others through a re-form (tcp::LinkPool).
class TcpRounds : public NegotiationWire {
 public:
  // Connects the rounds of `request` (request.count is ignored) through
  // request.store, listening on `address` (a numeric IP address of this
  // node). Errors like Transport::Connect: DEADLINE_EXCEEDED naming the node
  // ranks that never published or connected; the store's own code (ABORTED:
  // the generation ended); UNAVAILABLE for a socket error; INVALID_ARGUMENT
  // for a bad request. `clock` measures every timeout; it must outlive the
  // rounds.
  static absl::StatusOr<std::unique_ptr<TcpRounds>> Connect(
      const ConnectRequest& request, const std::string& address, Clock* clock,
      tcp::LinkPool* pool);

  ~TcpRounds() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }

  absl::Status ExchangeMin(int64_t* data, size_t count,
                           const CollectiveOptions& options) override;
  absl::StatusOr<bool> AwaitRound(size_t count) override;
  void Interrupt() override;
  void Abort(const absl::Status& status) override;
  bool poisoned() const override { return poison_.is_set(); }

 private:
  // The vector being read from one peer.
  struct Peer {
    std::vector<int64_t> message;  // count word + the vector
    size_t received = 0;           // bytes of `message` read so far
  };
  TcpRounds(int rank, tcp::LentLinks links, int interrupt_fd, int abort_fd,
            Clock* clock);
  // After Abort: its status, prefixed with `what` (the call it ended).
  absl::Status Aborted(const std::string& what) const;

  // "negotiation connections of 3 nodes (node rank 0)".
  std::string Describe() const;
  // FAILED_PRECONDITION once poisoned.
  absl::Status CheckUsable() const;
  // Records `status` as the poison and returns it.
  absl::Status Poison(absl::Status status);
  // The same after an I/O error on node rank `peer`'s connection, which is
  // shut down.
  absl::Status PoisonPeer(int peer, absl::Status status);

  const int rank_;
  // By node rank (fd -1 for this node's own slot): given back to the pool,
  // or closed, by the destructor.
  tcp::LentLinks links_;
  std::vector<Peer> peers_;
  // An eventfd: Interrupt() adds to it, AwaitRound drains it.
  const int interrupt_fd_;
  // An eventfd: Abort() sets it for good; every wait polls it.
  const int abort_fd_;
  Clock* const clock_;

  PoisonState poison_;
};

}  // namespace baton::agent
