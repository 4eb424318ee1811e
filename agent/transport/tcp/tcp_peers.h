#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/transport/tcp/tcp_link_pool.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// TCP connections between the agents of one job for one generation, made
// through the rendezvous store: what the negotiation rounds (TcpRounds) and
// the host collectives (TcpRing) share.
namespace tcp {

// "<call>: <strerror(errno)>".
std::string Errno(const char* call);

// Milliseconds left until `deadline` for poll(2), rounded up (a wait never
// ends before the deadline), at least 0. Each poll(2) waits for the time left
// when it starts, never longer than the operation's timeout (Deadline).
int PollMillis(const Deadline& deadline);

// Writes exactly `bytes` on a non-blocking socket by `deadline`;
// UNAVAILABLE or DEADLINE_EXCEEDED starting with `what` otherwise.
absl::Status SendAll(int fd, const void* data, size_t bytes,
                     const Deadline& deadline, const std::string& what);

// The numeric addresses `hostname` resolves to, in resolver order;
// INVALID_ARGUMENT naming it when it resolves to nothing. Sockets (and gloo,
// whose own lookup ignores getaddrinfo's error codes and crashes on a name
// that does not resolve) only ever see a numeric address.
absl::StatusOr<std::vector<std::string>> NumericAddresses(
    const std::string& hostname);

// What a set of connections is called in errors and in the store.
struct PeerSet {
  // The keys live under "<request.prefix>/<name>/<rank>".
  std::string name;
  // "negotiation" or "data": "binding the <kind> socket", "published <kind>
  // address".
  std::string kind;
  // Starts every error: "connecting the negotiation of 3 nodes (...)".
  std::string what;
};

// Connects this node to every node rank r with wanted[r] (this node's own
// entry is ignored; `wanted` must be symmetric: r wants this node too).
//
// With a `pool` and request.reuse_key, the links this node kept from earlier
// generations under "<reuse_key>/<set name>" are kept where the peer kept
// the same link (LinkPool, Link): what the peer sent on it that this node
// never read is skipped, and the link carries on. Only the other wanted
// peers get a new connection. Links not kept are closed.
//
// Each node listens on an ephemeral port of `address` (a numeric IP address
// of this node) and publishes "<host> <port>" followed by "<id>:<sent>" for
// each link it kept, under the set's key; reads every wanted peer's entry;
// connects to each wanted lower rank it keeps no link with and introduces
// itself (its rank, a hash of the key prefix, the new link's id, and a MAC
// with request.secret: tcp_introduction.h); and accepts the same from the
// higher ones, answering each with its own proof of the secret.
// Introductions are read as they arrive, so a connection that says nothing
// holds up nobody; one that is not a wanted peer of this set is dropped, one
// whose MAC does not verify is dropped and logged (once per connect). The
// answers to this node's introductions are read after its own accept phase,
// before it returns. Links kept from earlier generations are not introduced
// again: they were proven when made.
//
// Returns one link per node rank (fd -1 for this node and the ones not
// wanted): non-blocking, TCP_NODELAY, lent from `pool` (given back when the
// LentLinks end) or owned outright without one. Errors like
// Transport::Connect: DEADLINE_EXCEEDED naming the node ranks that never
// published or connected by request.timeout (measured on `clock`); the
// store's own code (ABORTED: the generation ended); UNAVAILABLE for a
// socket error or a peer that did not prove the secret ("node rank <r> at
// <host>:<port> did not prove this generation's secret: ...");
// INVALID_ARGUMENT for a bad request (an empty secret included), address or
// publication.
absl::StatusOr<LentLinks> ConnectPeers(const ConnectRequest& request,
                                       const std::string& address,
                                       const PeerSet& set,
                                       const std::vector<bool>& wanted,
                                       Clock& clock, LinkPool* pool);

}  // namespace tcp
}  // namespace baton::agent
