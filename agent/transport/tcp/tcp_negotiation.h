#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/transport/negotiation_wire.h"
#include "agent/transport/tcp/tcp_link_pool.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// The negotiation wire request.negotiation names (kAuto resolved for
// request.num_nodes) on baton's own TCP connections: TcpRounds (all to all)
// or TcpTreeRounds. What every transport's ConnectNegotiation returns.
// Errors like TcpRounds::Connect; INVALID_ARGUMENT for a tree fanout below
// 2.
absl::StatusOr<std::unique_ptr<NegotiationWire>> ConnectTcpNegotiation(
    const ConnectRequest& request, const std::string& address, Clock* clock,
    tcp::LinkPool* pool);

}  // namespace baton::agent
