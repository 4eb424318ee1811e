#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/transport/tcp/tcp_link_pool.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// The CPU data plane on baton's own TCP connections: every data
// communicator is a TcpRing (ring collectives run by the calling thread),
// the negotiation is TcpRounds or TcpTreeRounds (ConnectTcpNegotiation).
// No thread of its own. The agent's default
// (--data_transport=tcp); GlooTransport is the alternative.
//
// Keeps connections between generations (ConnectRequest.reuse_key, in a
// tcp::LinkPool): after a re-form the survivors go on with the connections
// they have, and connect only to new or changed peers.
//
// Thread-safe.
class TcpTransport : public Transport {
 public:
  // Binds to `hostname` (an IP address, or a name resolving to the
  // interface peers reach this node on); INVALID_ARGUMENT when it does not
  // resolve. Also ignores SIGPIPE for the whole process: a peer that closes
  // its connection must give an error on the survivors, not kill them.
  // `clock` measures every timeout; it must outlive the transport and its
  // communicators. `skip_zero_blocks`: the rings' allreduce steps may leave
  // out blocks that are all zero (TcpRing, ZeroBlocks).
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Create(
      const std::string& hostname, Clock* clock = Clock::Real(),
      bool skip_zero_blocks = true);

  // Connects request.count rings one after the other, communicator i (ring
  // c<i>) under
  // "<prefix>/ring/c<i>"; request.timeout bounds each.
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> Connect(
      const ConnectRequest& request) override;
  absl::StatusOr<std::unique_ptr<NegotiationWire>> ConnectNegotiation(
      const ConnectRequest& request) override;
  void DropKept(const std::string& prefix) override;
  LinkCounts link_counts() const override;

  const std::string& address() const { return address_; }

 private:
  TcpTransport(std::string address, Clock* clock, bool skip_zero_blocks)
      : address_(std::move(address)),
        clock_(clock),
        skip_zero_blocks_(skip_zero_blocks) {}

  const std::string address_;
  Clock* const clock_;
  const bool skip_zero_blocks_;
  // Outlives every communicator it lends to (the transport does).
  tcp::LinkPool pool_;
};

}  // namespace baton::agent
