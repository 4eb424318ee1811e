#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/tcp/connected_rounds.h"
#include "agent/transport/tcp/round_connections.h"
#include "agent/transport/tcp/round_link.h"
#include "agent/transport/tcp/tcp_link_pool.h"
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
// byte order (agents of one job run the same build). Connecting: to every
// other node (RoundConnections).
//
// N x (N-1) messages a round: for large generations, TcpTreeRounds.
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
class TcpRounds : public ConnectedRounds {
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

  absl::Status ExchangeMin(int64_t* data, size_t count,
                           const CollectiveOptions& options) override;
  absl::StatusOr<bool> AwaitRound(size_t count) override;

 private:
  explicit TcpRounds(std::unique_ptr<RoundConnections> connections);

  // By node rank (unused for this node's own).
  std::vector<tcp::RoundLink> links_;
  // This node's count word and vector this round, sent to every peer.
  std::vector<int64_t> out_;
  // By node rank: the count word and the vector each peer sent this round.
  std::vector<std::vector<int64_t>> messages_;
};

}  // namespace baton::agent
