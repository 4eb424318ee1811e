#include "agent/transport/tcp/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "agent/transport/tcp/tcp_peers.h"

namespace baton::agent::tcp {
namespace {

using AddrInfo = std::unique_ptr<struct addrinfo, void (*)(struct addrinfo*)>;

// `host` and `port`, both numeric (`flags`: AI_PASSIVE to listen);
// INVALID_ARGUMENT starting with `what` otherwise.
absl::StatusOr<AddrInfo> Resolve(const std::string& host,
                                 const std::string& port, int flags,
                                 const std::string& what) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | flags;
  struct addrinfo* info = nullptr;
  const int rv = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &info);
  if (rv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", ::gai_strerror(rv)));
  }
  return AddrInfo(info, ::freeaddrinfo);
}

// A TCP socket of `info`'s family, held by `fds`.
absl::StatusOr<int> NewSocket(const struct addrinfo& info, FdList& fds) {
  const int fd =
      fds.Add(::socket(info.ai_family, info.ai_socktype | SOCK_CLOEXEC, 0));
  if (fd < 0) return absl::UnavailableError(Errno("socket"));
  return fd;
}

}  // namespace

void SetNonBlocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// A listening socket on `address`, port chosen by the kernel.
absl::StatusOr<int> Listen(const std::string& address, const std::string& kind,
                           int backlog, FdList& fds, int* port) {
  absl::StatusOr<AddrInfo> info =
      Resolve(address, "0", AI_PASSIVE,
              absl::StrCat("the ", kind, " address \"", address,
                           "\" is not a numeric IP address"));
  if (!info.ok()) return info.status();
  absl::StatusOr<int> fd = NewSocket(**info, fds);
  if (!fd.ok()) return fd.status();
  if (::bind(*fd, (*info)->ai_addr, (*info)->ai_addrlen) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "binding the ", kind, " socket to ", address, ": ", Errno("bind")));
  }
  if (::listen(*fd, backlog) != 0) {
    return absl::UnavailableError(Errno("listen"));
  }
  struct sockaddr_storage bound = {};
  socklen_t length = sizeof bound;
  ::getsockname(*fd, reinterpret_cast<sockaddr*>(&bound), &length);
  *port = bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  SetNonBlocking(*fd);
  return *fd;
}

// Connects to `host` and `port` (what a peer published) by `deadline`.
absl::StatusOr<int> ConnectTo(const std::string& host, int port,
                              const std::string& kind, const Deadline& deadline,
                              FdList& fds) {
  const std::string published = absl::StrCat(host, " ", port);
  absl::StatusOr<AddrInfo> info =
      Resolve(host, absl::StrCat(port), 0,
              absl::StrCat("published ", kind, " address \"", published, "\""));
  if (!info.ok()) return info.status();
  absl::StatusOr<int> connecting = NewSocket(**info, fds);
  if (!connecting.ok()) return connecting.status();
  const int fd = *connecting;
  SetNonBlocking(fd);
  if (::connect(fd, (*info)->ai_addr, (*info)->ai_addrlen) != 0 &&
      errno != EINPROGRESS) {
    return absl::UnavailableError(
        absl::StrCat("connecting to ", published, ": ", Errno("connect")));
  }
  struct pollfd pfd = {fd, POLLOUT, 0};
  while (true) {
    const int ready = ::poll(&pfd, 1, PollMillis(deadline));
    if (ready > 0) break;
    if (ready == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("connecting to ", published, ": timed out"));
    }
    if (errno != EINTR) {
      return absl::UnavailableError(Errno("poll"));
    }
  }
  int error = 0;
  socklen_t length = sizeof error;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
  if (error != 0) {
    return absl::UnavailableError(
        absl::StrCat("connecting to ", published, ": ", std::strerror(error)));
  }
  SetNoDelay(fd);
  return fd;
}

// "host:port" ("[host]:port" for IPv6) of an accepted connection's peer.
std::string PeerAddress(const struct sockaddr_storage& address,
                        socklen_t length) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host,
                    sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return address.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                       : absl::StrCat(host, ":", port);
}

}  // namespace baton::agent::tcp
