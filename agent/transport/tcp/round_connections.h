#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/collective_options.h"
#include "agent/transport/poison_state.h"
#include "agent/transport/tcp/tcp_link_pool.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// What the negotiation wires on baton's TCP connections (TcpRounds, all to
// all, and TcpTreeRounds, along a NegotiationTree) share: the connections
// to the peers a wire exchanges with, read and written only by the thread
// that runs the rounds, which sleeps in poll(2) on them; the wire's poison;
// and the two eventfds every one of its waits watches besides its peers,
// Interrupt() (ends an AwaitRound) and Abort() (poisons the wire and ends
// any wait at once).
//
// Connecting: each node listens on an ephemeral port of its data-plane
// address, publishes "<host> <port>" under "<prefix>/rounds/<rank>", and
// connects to the peers it wants (tcp::ConnectPeers: to the lower ranks,
// accepting the higher ones, each proving the generation's secret).
//
// Interrupt, Abort and poisoned may be called from any thread; the rest
// from the thread that runs the rounds.
class RoundConnections {
 public:
  // The most words a round carries (a plan of millions of tensors).
  static constexpr size_t kMaxWords = size_t{1} << 24;

  // Connects to every node rank r with wanted[r] (symmetric: r wants this
  // node too). Errors like TcpRounds::Connect.
  static absl::StatusOr<std::unique_ptr<RoundConnections>> Connect(
      const ConnectRequest& request, const std::string& address,
      const std::vector<bool>& wanted, Clock* clock, tcp::LinkPool* pool);
  ~RoundConnections();

  int rank() const { return rank_; }
  int size() const { return links_.size(); }
  // fd -1 for this node and the peers not wanted.
  tcp::Link& link(int rank) { return links_[rank]; }
  bool connected(int rank) const { return links_[rank].fd >= 0; }
  Clock& clock() const { return *clock_; }

  // "negotiation connections of 3 nodes (node rank 0)".
  std::string Describe() const;
  // "negotiation round of 24 bytes (int64) on <Describe()>".
  std::string DescribeRound(size_t count) const;

  // What ExchangeMin checks before any I/O: FAILED_PRECONDITION once
  // poisoned; INVALID_ARGUMENT (the wire stays usable) for a timeout that
  // is not positive, null data with words to exchange, or more than
  // kMaxWords words.
  absl::Status CheckRound(const int64_t* data, size_t count,
                          const CollectiveOptions& options) const;
  // Records `status` as the poison and returns it.
  absl::Status Poison(absl::Status status);
  // The same after an I/O error on node rank `peer`'s connection, which is
  // shut down.
  absl::Status PoisonPeer(int peer, absl::Status status);
  // After Abort: its status, prefixed with `what` (the call it ended).
  absl::Status Aborted(const std::string& what) const;
  bool poisoned() const { return poison_.is_set(); }

  void Interrupt();
  void Abort(const absl::Status& status);
  // Readable once Abort was called: for the wires' own poll(2) calls.
  int abort_fd() const { return abort_fd_; }

  // One wait of a round: poll(2) on `pfds` (the connections' entries; the
  // abort eventfd is watched too) until `deadline`, retried on EINTR.
  // Returns how many entries of `pfds` are ready (0: the deadline passed).
  // Errors start with `what`: Aborted after Abort; UNAVAILABLE when poll(2)
  // fails (poisoned).
  absl::StatusOr<int> Poll(std::vector<struct pollfd>& pfds,
                           const Deadline& deadline, const std::string& what);

  // AwaitRound's wait for a round of `count` words, without a time limit:
  // the lowest node rank whose connection has something to read (or was
  // closed), or -1 once Interrupt was called (taking it) and at once for a
  // single node. Errors start with WaitWhat(): FAILED_PRECONDITION once
  // poisoned; INVALID_ARGUMENT for 0 words; Aborted after Abort;
  // UNAVAILABLE when poll(2) fails (poisoned).
  absl::StatusOr<int> AwaitPeer(size_t count);
  // "waiting for a negotiation round on <Describe()>".
  std::string WaitWhat() const;

  // Why a peer's connection failed, after `call` (recv or send) returned
  // `n`: "closed its connection (its agent left the job or failed)" for the
  // end of the stream (a reset or broken pipe adds ": <call>: <errno
  // text>"), else "is unreachable: <call>: <errno text>".
  static std::string PeerFailure(ssize_t n, const char* call);

 private:
  RoundConnections(int rank, tcp::LentLinks links, int interrupt_fd,
                   int abort_fd, Clock* clock);

  const int rank_;
  // By node rank: given back to the pool, or closed, by the destructor.
  tcp::LentLinks links_;
  // An eventfd: Interrupt() adds to it, AwaitPeer drains it.
  const int interrupt_fd_;
  // An eventfd: Abort() sets it for good; every wait polls it.
  const int abort_fd_;
  Clock* const clock_;
  PoisonState poison_;
};

}  // namespace baton::agent
