#include "agent/transport/tcp/tcp_transport.h"

#include <signal.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/transport/tcp/tcp_negotiation.h"
#include "agent/transport/tcp/tcp_peers.h"
#include "agent/transport/tcp/tcp_ring.h"

namespace baton::agent {

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(
    const std::string& hostname, Clock* clock, bool skip_zero_blocks) {
  if (hostname.empty()) {
    return absl::InvalidArgumentError(
        "the TCP transport needs the hostname or IP address to bind");
  }
  ::signal(SIGPIPE, SIG_IGN);
  absl::StatusOr<std::vector<std::string>> addresses =
      tcp::NumericAddresses(hostname);
  if (!addresses.ok()) return addresses.status();
  return std::unique_ptr<TcpTransport>(
      new TcpTransport(std::move(addresses->front()), clock, skip_zero_blocks));
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
TcpTransport::Connect(const ConnectRequest& request) {
  if (absl::Status valid = ValidateConnectRequest(request); !valid.ok()) {
    return valid;
  }
  std::vector<std::unique_ptr<Communicator>> rings;
  rings.reserve(request.count);
  for (int i = 0; i < request.count; ++i) {
    absl::StatusOr<std::unique_ptr<TcpRing>> ring =
        TcpRing::Connect(request, address_, absl::StrCat("c", i), clock_,
                         &pool_, skip_zero_blocks_);
    if (!ring.ok()) return ring.status();
    rings.push_back(std::move(ring).value());
  }
  return rings;
}

absl::StatusOr<std::unique_ptr<NegotiationWire>>
TcpTransport::ConnectNegotiation(const ConnectRequest& request) {
  return ConnectTcpNegotiation(request, address_, clock_, &pool_);
}

void TcpTransport::DropKept(const std::string& prefix) { pool_.Drop(prefix); }

LinkCounts TcpTransport::link_counts() const { return pool_.counts(); }

}  // namespace baton::agent
