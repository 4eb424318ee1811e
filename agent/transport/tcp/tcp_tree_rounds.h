#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/negotiation_tree.h"
#include "agent/transport/tcp/connected_rounds.h"
#include "agent/transport/tcp/round_connections.h"
#include "agent/transport/tcp/round_link.h"
#include "agent/transport/tcp/round_notice.h"
#include "agent/transport/tcp/tcp_link_pool.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// The scheduler's negotiation rounds (NegotiationWire) along a
// NegotiationTree, for large generations: 3 to 4 messages per tree edge
// (about 4N) and 2 x depth hops once every node is in the round (up to
// 4 x depth from one node with news), where the all-to-all (TcpRounds)
// sends N x (N-1) messages in one hop. Each node connects to its tree
// neighbours only (RoundConnections); the agent chooses the wire per generation
// (NegotiationChoice).
//
// A round, on every tree edge, each way: a join word (the round's count),
// sent the moment the node enters the round, then a body (the count again,
// then the vector). Up: the element-wise minimum over the child's subtree,
// sent once the child's own children's bodies came (a leaf's goes with its
// join). Down: the round's result, which the root computes and every node
// forwards to its children. A node that starts a round wakes its parent
// and its children at once; each joins (its AwaitRound returns true) and
// wakes its own neighbours, so the whole tree is in the round within depth
// hops. Every node ends the round with the same vector.
//
// Failures reach every node, though only a lost node's neighbours see its
// connection end: a node that fails a round for a reason of the others'
// (a neighbour gone or unreachable, a count mismatch, a timeout) sends a
// RoundNotice to its other neighbours (after any message it had partly
// sent, within kNoticeTimeout; a neighbour that does not take it in time
// sees its connection shut down), and each that receives one fails with it
// and forwards it. So every node's error names the node at fault:
// "... node rank 7 closed its connection (its agent left the job or
// failed) (reported by node rank 1)". Codes are TcpRounds': UNAVAILABLE,
// FAILED_PRECONDITION for a count mismatch, DEADLINE_EXCEEDED.
//
// Timeouts: a node whose neighbour never joined the round fails at its
// timeout naming it (and tells the others). A node whose neighbours all
// joined, but whose round did not end, waits up to one more timeout for
// that notice (it comes from the nodes next to the silent one, which timed
// out at about the same time), then fails naming the neighbours it still
// waits for. A round thus ends within twice its timeout (and the
// kNoticeTimeout of telling its neighbours).
//
// Like TcpRounds: messages in the host's byte order; at most 2^24 words a
// round; a round is not acknowledged; a failure shuts down only the
// connection it came from (Abort none), so that survivors can keep the
// others through a re-form.
class TcpTreeRounds : public ConnectedRounds {
 public:
  // How long a failing node tries to hand its notice to each neighbour.
  static constexpr std::chrono::milliseconds kNoticeTimeout{1000};

  // Connects the rounds of `request` along the tree of `fanout` (at least
  // 2; INVALID_ARGUMENT otherwise). Otherwise as TcpRounds::Connect.
  static absl::StatusOr<std::unique_ptr<TcpTreeRounds>> Connect(
      const ConnectRequest& request, int fanout, const std::string& address,
      Clock* clock, tcp::LinkPool* pool);

  const NegotiationTree& tree() const { return tree_; }

  absl::Status ExchangeMin(int64_t* data, size_t count,
                           const CollectiveOptions& options) override;
  absl::StatusOr<bool> AwaitRound(size_t count) override;

 private:
  struct Neighbour {
    Neighbour(int rank, bool child, tcp::Link* link)
        : rank(rank), child(child), link(link) {}
    const int rank;
    const bool child;
    tcp::RoundLink link;
    // This round's words from it: the join word, then the body's count and
    // vector.
    std::vector<int64_t> in;
  };

  TcpTreeRounds(std::unique_ptr<RoundConnections> connections,
                NegotiationTree tree);

  // Poisons the wire with `notice` (as an error starting with `what`),
  // tells every neighbour but node rank `except` (-1: all), and returns
  // the error.
  absl::Status Fail(const RoundNotice& notice, const std::string& what,
                    int except);
  // The same for a failure on `from`'s connection (`n`: what recv or send
  // returned, errno set), which is shut down.
  absl::Status FailPeer(Neighbour& from, ssize_t n, const char* call,
                        const std::string& what);
  // The same for a word `from` sent where a message begins that is not
  // this round's count (`count`, 0 while waiting for a round).
  absl::Status FailHeader(Neighbour& from, int64_t word, size_t count,
                          const std::string& what);
  // Reads the notice whose header word `header` came from `from` (`have`
  // bytes of what follows were read into `already`), fails with it and
  // forwards it.
  absl::Status TakeNotice(Neighbour& from, int64_t header,
                          const int64_t* already, size_t have,
                          const std::string& what);
  // Sends `notice` to the neighbours but `except`, within kNoticeTimeout.
  void Tell(const RoundNotice& notice, int except);

  const NegotiationTree tree_;
  // The parent first, then the children.
  std::vector<Neighbour> neighbours_;
  // This node's join word, then its body: the count and the minimum over
  // its subtree so far (at the root, the result).
  std::vector<int64_t> own_;
  // The notice being sent.
  std::vector<int64_t> notice_;
};

}  // namespace baton::agent
