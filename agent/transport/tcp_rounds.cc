#include "agent/transport/tcp_rounds.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace baton::agent {
namespace {

using Clock = std::chrono::steady_clock;

// "BRND": the first word a connecting node sends.
constexpr uint32_t kMagic = 0x42524e44;
// The largest vector a round may carry (a plan of millions of tensors).
constexpr size_t kMaxWords = size_t{1} << 24;

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

std::string Errno(const char* call) {
  return absl::StrCat(call, ": ", std::strerror(errno));
}

// Milliseconds left until `deadline` for poll(2), rounded up (a wait never
// ends before the deadline), at least 0.
int PollMillis(Clock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now())
          .count();
  return static_cast<int>(
      std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
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

// Writes exactly `bytes` on a non-blocking socket by `deadline`.
absl::Status SendAll(int fd, const void* data, size_t bytes,
                     Clock::time_point deadline, const std::string& what) {
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
absl::StatusOr<int> Listen(const std::string& address, int backlog, FdList& fds,
                           int* port) {
  absl::StatusOr<AddrInfo> info =
      Resolve(address, "0", AI_PASSIVE,
              absl::StrCat("the negotiation address \"", address,
                           "\" is not a numeric IP address"));
  if (!info.ok()) return info.status();
  absl::StatusOr<int> fd = NewSocket(**info, fds);
  if (!fd.ok()) return fd.status();
  if (::bind(*fd, (*info)->ai_addr, (*info)->ai_addrlen) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "binding the negotiation socket to ", address, ": ", Errno("bind")));
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
                              Clock::time_point deadline, FdList& fds) {
  const std::vector<std::string> parts = absl::StrSplit(published, ' ');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("published negotiation address \"", published,
                     "\" is not \"<host> <port>\""));
  }
  absl::StatusOr<AddrInfo> info = Resolve(
      parts[0], parts[1], 0,
      absl::StrCat("published negotiation address \"", published, "\""));
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

}  // namespace

absl::StatusOr<std::unique_ptr<TcpRounds>> TcpRounds::Connect(
    const ConnectRequest& request, const std::string& address) {
  ConnectRequest checked = request;
  checked.count = 1;
  if (absl::Status valid = ValidateConnectRequest(checked); !valid.ok()) {
    return valid;
  }
  const Clock::time_point deadline = Clock::now() + request.timeout;
  const int rank = request.node_rank;
  const int size = request.num_nodes;
  const std::string what = absl::StrCat(
      "connecting the negotiation of ", size, " nodes (node rank ", rank,
      ", keys under \"", StoreKey(request.prefix, "rounds"), "/\")");
  FdList fds;
  const int interrupt_fd = fds.Add(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (interrupt_fd < 0) {
    return absl::UnavailableError(absl::StrCat(what, ": ", Errno("eventfd")));
  }
  std::vector<Peer> peers(size);
  if (size > 1) {
    int port = 0;
    absl::StatusOr<int> listener = Listen(address, SOMAXCONN, fds, &port);
    if (!listener.ok()) {
      return absl::Status(
          listener.status().code(),
          absl::StrCat(what, ": ", listener.status().message()));
    }
    const auto key = [&](int r) {
      return StoreKey(request.prefix, absl::StrCat("rounds/", r));
    };
    if (absl::Status set =
            request.store->Set(key(rank), absl::StrCat(address, " ", port));
        !set.ok()) {
      return absl::Status(set.code(), absl::StrCat(what, ": ", set.message()));
    }
    const uint64_t prefix_hash = HashPrefix(request.prefix);
    // Every lower rank listens: connect and introduce this node.
    if (rank > 0) {
      std::vector<std::string> keys;
      for (int r = 0; r < rank; ++r) keys.push_back(key(r));
      auto addresses = request.store->Get(
          keys, std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - Clock::now()));
      if (!addresses.ok()) {
        return absl::Status(
            addresses.status().code(),
            absl::StrCat(
                what, ": waiting for node rank(s) 0..", rank - 1,
                " to publish their address: ", addresses.status().message()));
      }
      for (int r = 0; r < rank; ++r) {
        absl::StatusOr<int> fd = ConnectTo((*addresses)[r], deadline, fds);
        Hello hello = {kMagic, rank, prefix_hash};
        absl::Status status = fd.ok()
                                  ? SendAll(*fd, &hello, sizeof hello, deadline,
                                            "introducing this node")
                                  : fd.status();
        if (!status.ok()) {
          return absl::Status(
              status.code(),
              absl::StrCat(what, ": node rank ", r, ": ", status.message()));
        }
        peers[r].fd = *fd;
      }
    }
    // Every higher rank connects here. Introductions are read as they
    // arrive, so a connection that says nothing holds up nobody; one that
    // is not a peer of this round is dropped.
    struct Pending {
      int fd;
      Hello hello;
      size_t received;
    };
    std::vector<Pending> pending;
    for (int accepted = 0; accepted < size - 1 - rank;) {
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
          if (peers[r].fd < 0) missing.push_back(r);
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
            h.rank > rank && h.rank < size && peers[h.rank].fd < 0) {
          SetNoDelay(p.fd);
          peers[h.rank].fd = p.fd;
          ++accepted;
        } else {
          fds.Release(p.fd);
          ::close(p.fd);
        }
      }
      pending.swap(still);
      if (pfds[0].revents != 0) {
        const int fd = fds.Add(::accept4(*listener, nullptr, nullptr,
                                         SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (fd >= 0) pending.push_back({fd, Hello{}, 0});
      }
    }
  }
  for (const Peer& peer : peers) fds.Release(peer.fd);
  fds.Release(interrupt_fd);
  return std::unique_ptr<TcpRounds>(
      new TcpRounds(rank, std::move(peers), interrupt_fd));
}

TcpRounds::TcpRounds(int rank, std::vector<Peer> peers, int interrupt_fd)
    : rank_(rank), peers_(std::move(peers)), interrupt_fd_(interrupt_fd) {}

TcpRounds::~TcpRounds() {
  for (const Peer& peer : peers_) {
    if (peer.fd >= 0) ::close(peer.fd);
  }
  ::close(interrupt_fd_);
}

std::string TcpRounds::Describe() const {
  return absl::StrCat("negotiation connections of ", size(),
                      " nodes (node rank ", rank_, ")");
}

absl::Status TcpRounds::CheckUsable() const {
  if (!poisoned()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return absl::FailedPreconditionError(absl::StrCat(
      Describe(), " poisoned by ", poison_.ToString(), "; build new ones"));
}

absl::Status TcpRounds::Poison(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    poison_ = status;
  }
  poisoned_.store(true, std::memory_order_release);
  for (const Peer& peer : peers_) {
    if (peer.fd >= 0) ::shutdown(peer.fd, SHUT_RDWR);
  }
  return status;
}

absl::Status TcpRounds::AllreduceSum(void*, size_t, v1::DataType,
                                     const CollectiveOptions&) {
  return absl::UnimplementedError(
      absl::StrCat("allreduce on ", Describe(),
                   ": they carry negotiation rounds only; data goes over a "
                   "data communicator"));
}

absl::Status TcpRounds::Broadcast(void*, size_t, int,
                                  const CollectiveOptions&) {
  return absl::UnimplementedError(
      absl::StrCat("broadcast on ", Describe(),
                   ": they carry negotiation rounds only; data goes over a "
                   "data communicator"));
}

void TcpRounds::Interrupt() {
  const uint64_t one = 1;
  // Fails only when the counter would overflow: it is set either way.
  (void)!::write(interrupt_fd_, &one, sizeof one);
}

absl::StatusOr<bool> TcpRounds::AwaitRound(size_t count) {
  if (absl::Status usable = CheckUsable(); !usable.ok()) return usable;
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "waiting for a negotiation round of 0 words on ", Describe()));
  }
  if (size() == 1) return false;  // nobody else can start one
  std::vector<struct pollfd> pfds;
  pfds.push_back({interrupt_fd_, POLLIN, 0});
  for (const Peer& peer : peers_) {
    if (peer.fd >= 0) pfds.push_back({peer.fd, POLLIN, 0});
  }
  while (true) {
    const int ready = ::poll(pfds.data(), pfds.size(), -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Poison(absl::UnavailableError(
          absl::StrCat("waiting for a negotiation round on ", Describe(), ": ",
                       Errno("poll"))));
    }
    if (pfds[0].revents != 0) {
      uint64_t value = 0;
      (void)!::read(interrupt_fd_, &value, sizeof value);
      return false;
    }
    for (size_t i = 1; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      // A vector waits in the socket, or the peer is gone (end of stream).
      char byte = 0;
      const ssize_t n = ::recv(pfds[i].fd, &byte, 1, MSG_PEEK);
      if (n > 0) return true;
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      int peer = 0;
      while (peers_[peer].fd != pfds[i].fd) ++peer;
      return Poison(absl::UnavailableError(absl::StrCat(
          "waiting for a negotiation round on ", Describe(), ": node rank ",
          peer, " closed its connection (its agent left the job or failed)",
          n < 0 ? absl::StrCat(": ", Errno("recv")) : "")));
    }
  }
}

absl::Status TcpRounds::ExchangeMin(int64_t* data, size_t count,
                                    const CollectiveOptions& options) {
  if (absl::Status usable = CheckUsable(); !usable.ok()) return usable;
  if (options.timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CollectiveOptions.timeout is ", options.timeout.count(),
                     " ms on ", Describe(), ": give a positive timeout"));
  }
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("negotiation round of ", count, " int64 on ", Describe(),
                     ": data is null"));
  }
  if (count > kMaxWords) {
    return absl::InvalidArgumentError(
        absl::StrCat("negotiation round of ", count, " int64 on ", Describe(),
                     ": more than ", kMaxWords, " words"));
  }
  if (size() == 1) return absl::OkStatus();
  const std::string what =
      absl::StrCat("negotiation round of ", count * sizeof(int64_t),
                   " bytes (int64) on ", Describe());
  const Clock::time_point deadline = Clock::now() + options.timeout;

  std::vector<int64_t> out(count + 1);
  out[0] = static_cast<int64_t>(count);
  std::copy(data, data + count, out.begin() + 1);
  const size_t message_bytes = out.size() * sizeof(int64_t);
  // Per peer: bytes of `out` sent; each peer's message is read into its
  // own buffer. Sends and receives interleave, so that two nodes with
  // vectors larger than their socket buffers never wait on each other.
  std::vector<size_t> sent(peers_.size(), 0);
  for (Peer& peer : peers_) {
    peer.message.assign(count + 1, 0);
    peer.received = 0;
  }
  const auto peer_error = [&](int peer, const std::string& why) {
    return Poison(absl::UnavailableError(
        absl::StrCat(what, ": node rank ", peer, " ", why)));
  };
  std::vector<struct pollfd> pfds;
  std::vector<int> ranks;
  while (true) {
    pfds.clear();
    ranks.clear();
    for (int p = 0; p < size(); ++p) {
      const Peer& peer = peers_[p];
      if (peer.fd < 0) continue;
      short events = 0;
      if (sent[p] < message_bytes) events |= POLLOUT;
      if (peer.received < message_bytes) events |= POLLIN;
      if (events != 0) {
        pfds.push_back({peer.fd, events, 0});
        ranks.push_back(p);
      }
    }
    if (pfds.empty()) break;
    const int ready = ::poll(pfds.data(), pfds.size(), PollMillis(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Poison(
          absl::UnavailableError(absl::StrCat(what, ": ", Errno("poll"))));
    }
    if (ready == 0) {
      std::vector<int> missing;
      for (size_t i = 0; i < ranks.size(); ++i) missing.push_back(ranks[i]);
      return Poison(absl::DeadlineExceededError(absl::StrCat(
          what, " timed out after ", options.timeout.count(),
          " ms waiting for node rank(s) ", absl::StrJoin(missing, ", "))));
    }
    for (size_t i = 0; i < pfds.size(); ++i) {
      const int p = ranks[i];
      Peer& peer = peers_[p];
      if ((pfds[i].revents & POLLOUT) != 0 && sent[p] < message_bytes) {
        const ssize_t n =
            ::send(peer.fd, reinterpret_cast<const char*>(out.data()) + sent[p],
                   message_bytes - sent[p], MSG_NOSIGNAL);
        if (n > 0) {
          sent[p] += static_cast<size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          return peer_error(p, absl::StrCat("is unreachable: ", Errno("send")));
        }
      }
      if ((pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0 &&
          peer.received < message_bytes) {
        // Exactly one message: the next round's may follow in the stream.
        const ssize_t n =
            ::recv(peer.fd,
                   reinterpret_cast<char*>(peer.message.data()) + peer.received,
                   message_bytes - peer.received, 0);
        if (n == 0) {
          return peer_error(
              p, "closed its connection (its agent left the job or failed)");
        }
        if (n < 0) {
          if (errno == EAGAIN || errno == EINTR) continue;
          return peer_error(p, absl::StrCat("is unreachable: ", Errno("recv")));
        }
        const size_t before = peer.received;
        peer.received += static_cast<size_t>(n);
        if (before < sizeof(int64_t) && peer.received >= sizeof(int64_t) &&
            peer.message[0] != static_cast<int64_t>(count)) {
          return Poison(absl::FailedPreconditionError(absl::StrCat(
              what, ": node rank ", p, " sent a vector of ", peer.message[0],
              " words, this node one of ", count,
              " (the nodes disagree on the plan: they must run one build "
              "of baton and the same coordinator plan)")));
        }
      }
    }
  }
  for (const Peer& peer : peers_) {
    if (peer.fd < 0) continue;
    for (size_t i = 0; i < count; ++i) {
      data[i] = std::min(data[i], peer.message[i + 1]);
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::agent
