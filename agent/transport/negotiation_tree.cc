#include "agent/transport/negotiation_tree.h"

#include <algorithm>

#include "glog/logging.h"

namespace baton::agent {

NegotiationTree::NegotiationTree(int rank, int size, int fanout) {
  CHECK_GE(fanout, 2) << "a negotiation tree needs a fanout of at least 2";
  CHECK_GE(size, 1);
  CHECK(rank >= 0 && rank < size) << "node rank " << rank << " of " << size;
  parent_ = rank == 0 ? -1 : (rank - 1) / fanout;
  const int64_t first = int64_t{rank} * fanout + 1;
  for (int64_t c = first; c < first + fanout && c < size; ++c) {
    children_.push_back(static_cast<int>(c));
  }
  // The deepest node is the last one: count its steps to the root.
  for (int r = size - 1; r > 0; r = (r - 1) / fanout) ++depth_;
}

std::vector<int> NegotiationTree::Neighbours() const {
  std::vector<int> out;
  if (parent_ >= 0) out.push_back(parent_);
  out.insert(out.end(), children_.begin(), children_.end());
  return out;
}

}  // namespace baton::agent
