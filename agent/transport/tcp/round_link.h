#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>

#include "agent/transport/tcp/tcp_link.h"

namespace baton::agent::tcp {

// One negotiation connection's traffic during a round (TcpRounds,
// TcpTreeRounds): the messages queued for the peer, sent in order as the
// socket takes them, and the bytes expected from it, read as they arrive.
// A wire drives every connection of a round at once from one poll(2), so
// that nodes with vectors larger than their socket buffers never wait on
// each other.
//
// Queued messages are views: the caller keeps each buffer unchanged until
// it is sent (or dropped). Used by one thread.
class RoundLink {
 public:
  explicit RoundLink(Link* link) : link_(link) {}

  int fd() const { return link_->fd; }
  Link& link() { return *link_; }

  // Appends `bytes` at `data` to what goes to the peer.
  void Queue(const void* data, size_t bytes);
  // Forgets the queued messages not begun; one partly sent stays, so that
  // the peer never sees half a message followed by another.
  void DropUnstarted();
  bool sending() const { return !queue_.empty(); }

  // What arrives next goes to `into`, until `bytes` have come.
  void Expect(void* into, size_t bytes);
  size_t received() const { return received_; }
  bool receiving() const { return received_ < expected_; }

  // The poll(2) events for what is left: POLLOUT while sending, POLLIN
  // while receiving.
  short events() const;

  // Sends as much as the socket takes now. False on a failure other than
  // EAGAIN/EINTR (errno as send(2) set it; the link is broken).
  bool Send();
  // One recv(2) into the bytes still expected, as tcp::Receive: 0 when the
  // peer closed the connection, -1 with errno on a failure.
  ssize_t Receive();

 private:
  struct Span {
    const char* data;
    size_t bytes;
    size_t sent;
  };

  Link* const link_;
  std::deque<Span> queue_;
  char* into_ = nullptr;
  size_t expected_ = 0;
  size_t received_ = 0;
};

}  // namespace baton::agent::tcp
