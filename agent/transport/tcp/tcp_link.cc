#include "agent/transport/tcp/tcp_link.h"

#include <sys/socket.h>

#include <cerrno>

namespace baton::agent::tcp {
namespace {

bool Transient(int error) {
  return error == EAGAIN || error == EWOULDBLOCK || error == EINTR;
}

// What every send does with its result.
ssize_t Counted(Link& link, ssize_t n) {
  if (n > 0) {
    link.sent += static_cast<uint64_t>(n);
  } else if (n < 0 && !Transient(errno)) {
    link.broken = true;
  }
  return n;
}

}  // namespace

ssize_t Send(Link& link, const void* data, size_t bytes) {
  return Counted(link, ::send(link.fd, data, bytes, MSG_NOSIGNAL));
}

ssize_t SendVector(Link& link, const iovec* buffers, int count) {
  msghdr message = {};
  message.msg_iov = const_cast<iovec*>(buffers);
  message.msg_iovlen = static_cast<size_t>(count);
  return Counted(link, ::sendmsg(link.fd, &message, MSG_NOSIGNAL));
}

ssize_t Receive(Link& link, void* data, size_t bytes) {
  const ssize_t n = ::recv(link.fd, data, bytes, 0);
  if (n > 0) {
    link.received += static_cast<uint64_t>(n);
  } else if (n == 0 || !Transient(errno)) {
    link.broken = true;
  }
  return n;
}

void ShutDown(Link& link) {
  link.broken = true;
  if (link.fd >= 0) ::shutdown(link.fd, SHUT_RDWR);
}

}  // namespace baton::agent::tcp
