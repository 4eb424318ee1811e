#pragma once

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "agent/transport/negotiation_wire.h"
#include "agent/transport/tcp/round_connections.h"

namespace baton::agent {

// A negotiation wire over RoundConnections: its place among the nodes,
// Interrupt, Abort and the poison are the connections'. The subclasses
// differ in how a round travels: TcpRounds to every peer at once,
// TcpTreeRounds along a tree.
class ConnectedRounds : public NegotiationWire {
 public:
  int rank() const override { return connections_->rank(); }
  int size() const override { return connections_->size(); }
  void Interrupt() override { connections_->Interrupt(); }
  void Abort(const absl::Status& status) override {
    connections_->Abort(status);
  }
  bool poisoned() const override { return connections_->poisoned(); }

 protected:
  explicit ConnectedRounds(std::unique_ptr<RoundConnections> connections)
      : connections_(std::move(connections)) {}

  const std::unique_ptr<RoundConnections> connections_;
};

}  // namespace baton::agent
