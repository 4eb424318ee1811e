#include "agent/transport/tcp_link.h"

#include <sys/socket.h>

#include <cerrno>

namespace baton::agent::tcp {
namespace {

bool Transient(int error) {
  return error == EAGAIN || error == EWOULDBLOCK || error == EINTR;
}

}  // namespace

ssize_t Send(Link& link, const void* data, size_t bytes) {
  const ssize_t n = ::send(link.fd, data, bytes, MSG_NOSIGNAL);
  if (n > 0) {
    link.sent += static_cast<uint64_t>(n);
  } else if (n < 0 && !Transient(errno)) {
    link.broken = true;
  }
  return n;
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
