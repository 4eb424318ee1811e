#include "agent/transport/tcp/round_link.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>

namespace baton::agent::tcp {

void RoundLink::Queue(const void* data, size_t bytes) {
  if (bytes == 0) return;
  queue_.push_back({static_cast<const char*>(data), bytes, 0});
}

void RoundLink::DropUnstarted() {
  const bool begun = !queue_.empty() && queue_.front().sent > 0;
  queue_.erase(queue_.begin() + (begun ? 1 : 0), queue_.end());
}

void RoundLink::Expect(void* into, size_t bytes) {
  into_ = static_cast<char*>(into);
  expected_ = bytes;
  received_ = 0;
}

short RoundLink::events() const {
  short events = 0;
  if (sending()) events |= POLLOUT;
  if (receiving()) events |= POLLIN;
  return events;
}

bool RoundLink::Send() {
  while (!queue_.empty()) {
    Span& span = queue_.front();
    const ssize_t n =
        tcp::Send(*link_, span.data + span.sent, span.bytes - span.sent);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (n == 0) return true;
    span.sent += static_cast<size_t>(n);
    if (span.sent < span.bytes) return true;  // the socket is full
    queue_.pop_front();
  }
  return true;
}

ssize_t RoundLink::Receive() {
  const ssize_t n =
      tcp::Receive(*link_, into_ + received_, expected_ - received_);
  if (n > 0) received_ += static_cast<size_t>(n);
  return n;
}

}  // namespace baton::agent::tcp
