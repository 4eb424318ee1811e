#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/transport/tcp/tcp_link.h"

namespace baton::agent::tcp {

// What a node publishes in the rendezvous store for a peer set (ConnectPeers,
// tcp_peers.h): where it listens, and the links of the last generation it
// kept, each with the bytes it sent on it. The text is
// "<host> <port>[ <link id hex>:<bytes sent>]...". Every peer parses every
// other peer's publication, so the parser takes any bytes (it is fuzzed:
// tests/fuzz/introduction_fuzz.cc). Pure functions.
struct Published {
  std::string host;
  int port = 0;
  // Link id -> bytes the publisher sent on it.
  std::map<uint64_t, uint64_t> kept;
};

// This node's publication.
std::string Publication(const std::string& host, int port,
                        const std::vector<Link>& kept);

// A peer's publication. INVALID_ARGUMENT quoting `text` (and naming `kind`,
// "negotiation" or "data") when it is not one: no host, a port outside
// 1..65535, a link id that is 0 or not hex, a count that is not a number,
// or a link id listed twice.
absl::StatusOr<Published> ParsePublication(const std::string& text,
                                           const std::string& kind);

}  // namespace baton::agent::tcp
