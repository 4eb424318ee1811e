#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "agent/transport/negotiation_tree.h"

namespace baton::agent {

struct ConnectRequest;

// Which wire carries a generation's negotiation rounds (--negotiation,
// --negotiation_fanout): every node of a generation must use the same one,
// so node rank 0's holds (AgreeOnNegotiation).
struct NegotiationChoice {
  enum class Wire {
    // The all-to-all up to kAllToAllUpTo nodes, the tree above.
    kAuto = 0,
    // TcpRounds: N x (N-1) messages a round, one hop.
    kAllToAll = 1,
    // TcpTreeRounds along a NegotiationTree of `fanout`.
    kTree = 2,
  };
  // The largest generation kAuto runs all-to-all. On loopback the tree is
  // slower at 2 nodes and faster from 4 (docs/benchmarks.md, "Negotiation
  // at scale"); up to 4 nodes keep the one-hop all-to-all they had, whose
  // single hop counts for more on a real network.
  static constexpr int kAllToAllUpTo = 4;
  static constexpr int kMaxFanout = 64;

  Wire wire = Wire::kAuto;
  int fanout = NegotiationTree::kDefaultFanout;

  // kAuto made concrete for a generation of `num_nodes`.
  NegotiationChoice Resolve(int num_nodes) const;

  // "auto", "all_to_all" or "tree".
  static const char* WireName(Wire wire);
  // The wire a --negotiation value names; INVALID_ARGUMENT otherwise.
  static absl::StatusOr<Wire> ParseWire(const std::string& name);

  // What node rank 0 publishes: "all_to_all" or "tree <fanout>" (auto
  // resolved first, by the caller).
  std::string Publication() const;
  // The choice a publication names; INVALID_ARGUMENT otherwise.
  static absl::StatusOr<NegotiationChoice> FromPublication(
      const std::string& text);

  bool operator==(const NegotiationChoice& other) const {
    return wire == other.wire &&
           (wire != Wire::kTree || fanout == other.fanout);
  }
  bool operator!=(const NegotiationChoice& other) const {
    return !(*this == other);
  }
};

// Node rank 0's request.negotiation, resolved for request.num_nodes, on
// every node, so that agents started with different flags still build the
// same wire: node rank 0 publishes it under "<prefix>/negotiation" (as the
// data channel count under "<prefix>/channels"), the others read it
// (request.timeout bounds the wait; a node whose own choice differs logs a
// warning). Errors: the store's; INVALID_ARGUMENT for a publication that
// does not parse.
absl::StatusOr<NegotiationChoice> AgreeOnNegotiation(
    const ConnectRequest& request);

}  // namespace baton::agent
