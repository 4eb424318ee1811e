#include "agent/transport/tcp_peers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace baton::agent::tcp {

std::string Errno(const char* call) {
  return absl::StrCat(call, ": ", std::strerror(errno));
}

int PollMillis(const Deadline& deadline) {
  const int64_t left = absl::ToInt64Milliseconds(
      absl::Ceil(deadline.Left(), absl::Milliseconds(1)));
  return static_cast<int>(
      std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

// Writes exactly `bytes` on a non-blocking socket by `deadline`.
absl::Status SendAll(int fd, const void* data, size_t bytes,
                     const Deadline& deadline, const std::string& what) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
      return absl::UnavailableError(absl::StrCat(what, ": ", Errno("send")));
    }
    struct pollfd pfd = {fd, POLLOUT, 0};
    const int ready = ::poll(&pfd, 1, PollMillis(deadline));
    if (ready == 0) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(what, ": ", Errno("poll")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> NumericAddresses(
    const std::string& hostname) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int rv = ::getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve the data-plane address \"", hostname,
                     "\": ", ::gai_strerror(rv)));
  }
  std::vector<std::string> addresses;
  for (const struct addrinfo* rp = result; rp != nullptr; rp = rp->ai_next) {
    char host[NI_MAXHOST];
    if (::getnameinfo(rp->ai_addr, rp->ai_addrlen, host, sizeof host, nullptr,
                      0, NI_NUMERICHOST) != 0) {
      continue;
    }
    if (std::find(addresses.begin(), addresses.end(), host) ==
        addresses.end()) {
      addresses.push_back(host);
    }
  }
  ::freeaddrinfo(result);
  if (addresses.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data-plane address \"", hostname, "\" resolves to nothing"));
  }
  return addresses;
}

namespace {

// "BRND": the first word a connecting node sends.
constexpr uint32_t kMagic = 0x42524e44;
// What a connecting node says first.
struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t prefix_hash;
};
static_assert(sizeof(Hello) == 16);

// FNV-1a: the same on every node, unlike std::hash.
uint64_t HashPrefix(const std::string& prefix) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : prefix) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

void SetNonBlocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// Closes the fds it holds unless released.
class FdList {
 public:
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

// Connects to "<host> <port>" (what a peer published) by `deadline`.
absl::StatusOr<int> ConnectTo(const std::string& published,
                              const std::string& kind, const Deadline& deadline,
                              FdList& fds) {
  const std::vector<std::string> parts = absl::StrSplit(published, ' ');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("published ", kind, " address \"", published,
                     "\" is not \"<host> <port>\""));
  }
  absl::StatusOr<AddrInfo> info =
      Resolve(parts[0], parts[1], 0,
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

// "0..3" for consecutive ranks, else "0, 2".
std::string RankList(const std::vector<int>& ranks) {
  if (ranks.size() > 1 &&
      ranks.back() - ranks.front() == static_cast<int>(ranks.size()) - 1) {
    return absl::StrCat(ranks.front(), "..", ranks.back());
  }
  if (ranks.size() == 1) return absl::StrCat(ranks[0], "..", ranks[0]);
  return absl::StrJoin(ranks, ", ");
}

}  // namespace

absl::StatusOr<std::vector<int>> ConnectPeers(const ConnectRequest& request,
                                              const std::string& address,
                                              const PeerSet& set,
                                              const std::vector<bool>& wanted,
                                              Clock& clock) {
  const Deadline deadline(clock, absl::FromChrono(request.timeout));
  const int rank = request.node_rank;
  const int size = request.num_nodes;
  const std::string& what = set.what;
  if (static_cast<int>(wanted.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", wanted.size(), " peer flags for ", size, " nodes"));
  }
  std::vector<int> lower;
  int higher = 0;
  for (int r = 0; r < size; ++r) {
    if (r == rank || !wanted[r]) continue;
    if (r < rank) {
      lower.push_back(r);
    } else {
      ++higher;
    }
  }
  FdList fds;
  std::vector<int> peers(size, -1);
  if (lower.empty() && higher == 0) return peers;
  int port = 0;
  absl::StatusOr<int> listener =
      Listen(address, set.kind, SOMAXCONN, fds, &port);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat(what, ": ", listener.status().message()));
  }
  const std::string key_prefix = StoreKey(request.prefix, set.name);
  const auto key = [&](int r) { return StoreKey(key_prefix, absl::StrCat(r)); };
  if (absl::Status published =
          request.store->Set(key(rank), absl::StrCat(address, " ", port));
      !published.ok()) {
    return absl::Status(published.code(),
                        absl::StrCat(what, ": ", published.message()));
  }
  const uint64_t prefix_hash = HashPrefix(key_prefix);
  // Every wanted lower rank listens: connect and introduce this node.
  if (!lower.empty()) {
    std::vector<std::string> keys;
    for (int r : lower) keys.push_back(key(r));
    auto addresses =
        request.store->Get(keys, absl::ToChronoMilliseconds(deadline.Left()));
    if (!addresses.ok()) {
      return absl::Status(
          addresses.status().code(),
          absl::StrCat(
              what, ": waiting for node rank(s) ", RankList(lower),
              " to publish their address: ", addresses.status().message()));
    }
    for (size_t i = 0; i < lower.size(); ++i) {
      const int r = lower[i];
      absl::StatusOr<int> fd =
          ConnectTo((*addresses)[i], set.kind, deadline, fds);
      Hello hello = {kMagic, rank, prefix_hash};
      absl::Status status = fd.ok() ? SendAll(*fd, &hello, sizeof hello,
                                              deadline, "introducing this node")
                                    : fd.status();
      if (!status.ok()) {
        return absl::Status(
            status.code(),
            absl::StrCat(what, ": node rank ", r, ": ", status.message()));
      }
      peers[r] = *fd;
    }
  }
  // Every wanted higher rank connects here.
  struct Pending {
    int fd;
    Hello hello;
    size_t received;
  };
  std::vector<Pending> pending;
  for (int accepted = 0; accepted < higher;) {
    std::vector<struct pollfd> pfds = {{*listener, POLLIN, 0}};
    for (const Pending& p : pending) pfds.push_back({p.fd, POLLIN, 0});
    const int ready = ::poll(pfds.data(), pfds.size(), PollMillis(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      return absl::UnavailableError(absl::StrCat(what, ": ", Errno("poll")));
    }
    if (ready == 0) {
      std::vector<int> missing;
      for (int r = rank + 1; r < size; ++r) {
        if (wanted[r] && peers[r] < 0) missing.push_back(r);
      }
      return absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", request.timeout.count(),
                       " ms: node rank(s) ", absl::StrJoin(missing, ", "),
                       " did not connect"));
    }
    std::vector<Pending> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (pfds[i + 1].revents == 0) {
        still.push_back(p);
        continue;
      }
      const ssize_t n =
          ::recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.received,
                 sizeof(Hello) - p.received, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        still.push_back(p);
        continue;
      }
      if (n > 0) p.received += static_cast<size_t>(n);
      if (n > 0 && p.received < sizeof(Hello)) {
        still.push_back(p);
        continue;
      }
      const Hello& h = p.hello;
      if (n > 0 && h.magic == kMagic && h.prefix_hash == prefix_hash &&
          h.rank > rank && h.rank < size && wanted[h.rank] &&
          peers[h.rank] < 0) {
        SetNoDelay(p.fd);
        peers[h.rank] = p.fd;
        ++accepted;
      } else {
        fds.Release(p.fd);
        ::close(p.fd);
      }
    }
    pending.swap(still);
    if (pfds[0].revents != 0) {
      const int fd = fds.Add(
          ::accept4(*listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd >= 0) pending.push_back({fd, Hello{}, 0});
    }
  }
  for (int fd : peers) fds.Release(fd);
  return peers;
}

}  // namespace baton::agent::tcp
