#include "agent/transport/tcp/tcp_negotiation.h"

#include <utility>

#include "agent/transport/tcp/tcp_rounds.h"
#include "agent/transport/tcp/tcp_tree_rounds.h"
#include "glog/logging.h"

namespace baton::agent {

absl::StatusOr<std::unique_ptr<NegotiationWire>> ConnectTcpNegotiation(
    const ConnectRequest& request, const std::string& address, Clock* clock,
    tcp::LinkPool* pool) {
  const NegotiationChoice choice =
      request.negotiation.Resolve(request.num_nodes);
  if (choice.wire == NegotiationChoice::Wire::kTree) {
    absl::StatusOr<std::unique_ptr<TcpTreeRounds>> tree =
        TcpTreeRounds::Connect(request, choice.fanout, address, clock, pool);
    if (!tree.ok()) return tree.status();
    LOG(INFO) << "negotiation of " << request.num_nodes << " nodes (node rank "
              << request.node_rank << ", keys under \""
              << StoreKey(request.prefix, "rounds") << "/\"): along a tree of "
              << "fanout " << choice.fanout << ", depth "
              << (*tree)->tree().depth();
    return std::unique_ptr<NegotiationWire>(std::move(tree).value());
  }
  absl::StatusOr<std::unique_ptr<TcpRounds>> rounds =
      TcpRounds::Connect(request, address, clock, pool);
  if (!rounds.ok()) return rounds.status();
  return std::unique_ptr<NegotiationWire>(std::move(rounds).value());
}

}  // namespace baton::agent
