#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace baton::agent::tcp {

// The sockets ConnectPeers makes: listening, connecting and naming peers.

void SetNonBlocking(int fd);
void SetNoDelay(int fd);

// Closes the fds it holds unless released.
class FdList {
 public:
  FdList() = default;
  FdList(const FdList&) = delete;
  FdList& operator=(const FdList&) = delete;
  ~FdList() {
    for (int fd : fds_) ::close(fd);
  }
  int Add(int fd) {
    if (fd >= 0) fds_.push_back(fd);
    return fd;
  }
  void Release(int fd) {
    fds_.erase(std::remove(fds_.begin(), fds_.end(), fd), fds_.end());
  }

 private:
  std::vector<int> fds_;
};

// A non-blocking listening socket on `address` (a numeric IP address),
// port chosen by the kernel (set in `*port`), held by `fds`. `kind` names it
// in errors: INVALID_ARGUMENT when `address` is not numeric, UNAVAILABLE
// when it cannot be bound.
absl::StatusOr<int> Listen(const std::string& address, const std::string& kind,
                           int backlog, FdList& fds, int* port);

// A non-blocking, TCP_NODELAY connection to `host` and `port` (what a peer
// published), held by `fds`, by `deadline`.
absl::StatusOr<int> ConnectTo(const std::string& host, int port,
                              const std::string& kind, const Deadline& deadline,
                              FdList& fds);

// "host:port" ("[host]:port" for IPv6) of an accepted connection's peer.
std::string PeerAddress(const struct sockaddr_storage& address,
                        socklen_t length);

}  // namespace baton::agent::tcp
