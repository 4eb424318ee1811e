#pragma once

#include <cstdint>
#include <vector>

namespace baton::agent {

// The tree the negotiation rounds follow on large generations (O(N) messages
// and O(log N) hops per round, instead of the all-to-all's N x (N-1)
// messages): node rank 0 is the root, and node rank r's children are ranks
// r * fanout + 1 .. r * fanout + fanout that exist. Every node computes it
// from (rank, size, fanout) alone, so all agree without a message.
class NegotiationTree {
 public:
  // Children per node unless a flag says otherwise.
  static constexpr int kDefaultFanout = 4;

  NegotiationTree(int rank, int size, int fanout);

  // -1 at the root.
  int parent() const { return parent_; }
  // Ascending.
  const std::vector<int>& children() const { return children_; }
  // Edges from the root to the deepest node: 0 for one node.
  int depth() const { return depth_; }
  // The node ranks this node exchanges messages with (parent first, then the
  // children): what its connections must cover.
  std::vector<int> Neighbours() const;

 private:
  int parent_ = -1;
  std::vector<int> children_;
  int depth_ = 0;
};

}  // namespace baton::agent
