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
#include "agent/transport/tcp_peers.h"

namespace baton::agent {
namespace {

// The largest vector a round may carry (a plan of millions of tensors).
constexpr size_t kMaxWords = size_t{1} << 24;

using tcp::Errno;
using tcp::PollMillis;

}  // namespace

absl::StatusOr<std::unique_ptr<TcpRounds>> TcpRounds::Connect(
    const ConnectRequest& request, const std::string& address, Clock* clock,
    tcp::LinkPool* pool) {
  ConnectRequest checked = request;
  checked.count = 1;
  if (absl::Status valid = ValidateConnectRequest(checked); !valid.ok()) {
    return valid;
  }
  const int rank = request.node_rank;
  const int size = request.num_nodes;
  tcp::PeerSet set;
  set.name = "rounds";
  set.kind = "negotiation";
  set.what = absl::StrCat("connecting the negotiation of ", size,
                          " nodes (node rank ", rank, ", keys under \"",
                          StoreKey(request.prefix, set.name), "/\")");
  const int interrupt_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  const int abort_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (interrupt_fd < 0 || abort_fd < 0) {
    const absl::Status error =
        absl::UnavailableError(absl::StrCat(set.what, ": ", Errno("eventfd")));
    if (interrupt_fd >= 0) ::close(interrupt_fd);
    if (abort_fd >= 0) ::close(abort_fd);
    return error;
  }
  absl::StatusOr<tcp::LentLinks> links = tcp::ConnectPeers(
      request, address, set, std::vector<bool>(size, true), *clock, pool);
  if (!links.ok()) {
    ::close(interrupt_fd);
    ::close(abort_fd);
    return links.status();
  }
  return std::unique_ptr<TcpRounds>(new TcpRounds(
      rank, std::move(links).value(), interrupt_fd, abort_fd, clock));
}

TcpRounds::TcpRounds(int rank, tcp::LentLinks links, int interrupt_fd,
                     int abort_fd, Clock* clock)
    : rank_(rank),
      links_(std::move(links)),
      peers_(links_.size()),
      interrupt_fd_(interrupt_fd),
      abort_fd_(abort_fd),
      clock_(clock) {}

TcpRounds::~TcpRounds() {
  ::close(interrupt_fd_);
  ::close(abort_fd_);
}

void TcpRounds::Abort(const absl::Status& status) {
  poison_.Set(status);
  const uint64_t one = 1;
  // Fails only when the counter would overflow: it is set either way.
  (void)!::write(abort_fd_, &one, sizeof one);
}

absl::Status TcpRounds::Aborted(const std::string& what) const {
  const absl::Status cause = poison_.cause();
  return absl::Status(cause.code(), absl::StrCat(what, ": ", cause.message()));
}

std::string TcpRounds::Describe() const {
  return absl::StrCat("negotiation connections of ", size(),
                      " nodes (node rank ", rank_, ")");
}

absl::Status TcpRounds::CheckUsable() const {
  return poison_.Check(Describe(), "new ones");
}

absl::Status TcpRounds::Poison(absl::Status status) {
  poison_.Set(status);
  return status;
}

absl::Status TcpRounds::PoisonPeer(int peer, absl::Status status) {
  tcp::ShutDown(links_[peer]);
  return Poison(std::move(status));
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
  std::vector<int> ranks = {-1, -1};
  pfds.push_back({interrupt_fd_, POLLIN, 0});
  pfds.push_back({abort_fd_, POLLIN, 0});
  for (int r = 0; r < size(); ++r) {
    if (links_[r].fd < 0) continue;
    pfds.push_back({links_[r].fd, POLLIN, 0});
    ranks.push_back(r);
  }
  while (true) {
    const int ready = ::poll(pfds.data(), pfds.size(), -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Poison(absl::UnavailableError(
          absl::StrCat("waiting for a negotiation round on ", Describe(), ": ",
                       Errno("poll"))));
    }
    if (pfds[1].revents != 0) {
      return Aborted(
          absl::StrCat("waiting for a negotiation round on ", Describe()));
    }
    if (pfds[0].revents != 0) {
      uint64_t value = 0;
      (void)!::read(interrupt_fd_, &value, sizeof value);
      return false;
    }
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      // A vector waits in the socket, or the peer is gone (end of stream).
      char byte = 0;
      const ssize_t n = ::recv(pfds[i].fd, &byte, 1, MSG_PEEK);
      if (n > 0) return true;
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      const int peer = ranks[i];
      return PoisonPeer(
          peer,
          absl::UnavailableError(absl::StrCat(
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
  const Deadline deadline(*clock_, absl::FromChrono(options.timeout));

  std::vector<int64_t> out(count + 1);
  out[0] = static_cast<int64_t>(count);
  std::copy(data, data + count, out.begin() + 1);
  const size_t message_bytes = out.size() * sizeof(int64_t);
  // Per peer: bytes of `out` sent; each peer's message is read into its
  // own buffer. Sends and receives interleave, so that two nodes with
  // vectors larger than their socket buffers never wait on each other.
  std::vector<size_t> sent(size(), 0);
  for (Peer& peer : peers_) {
    peer.message.assign(count + 1, 0);
    peer.received = 0;
  }
  const auto peer_error = [&](int peer, const std::string& why) {
    return PoisonPeer(peer, absl::UnavailableError(absl::StrCat(
                                what, ": node rank ", peer, " ", why)));
  };
  std::vector<struct pollfd> pfds;
  std::vector<int> ranks;
  while (true) {
    if (poison_.is_set()) return Aborted(what);
    pfds.clear();
    ranks.clear();
    for (int p = 0; p < size(); ++p) {
      const Peer& peer = peers_[p];
      if (links_[p].fd < 0) continue;
      short events = 0;
      if (sent[p] < message_bytes) events |= POLLOUT;
      if (peer.received < message_bytes) events |= POLLIN;
      if (events != 0) {
        pfds.push_back({links_[p].fd, events, 0});
        ranks.push_back(p);
      }
    }
    if (pfds.empty()) break;
    pfds.push_back({abort_fd_, POLLIN, 0});
    ranks.push_back(-1);
    const int ready = ::poll(pfds.data(), pfds.size(), PollMillis(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Poison(
          absl::UnavailableError(absl::StrCat(what, ": ", Errno("poll"))));
    }
    if (ready > 0 && pfds.back().revents != 0) return Aborted(what);
    if (ready == 0) {
      std::vector<int> missing;
      for (const int r : ranks) {
        if (r >= 0) missing.push_back(r);
      }
      return Poison(absl::DeadlineExceededError(absl::StrCat(
          what, " timed out after ", options.timeout.count(),
          " ms waiting for node rank(s) ", absl::StrJoin(missing, ", "))));
    }
    for (size_t i = 0; i + 1 < pfds.size(); ++i) {
      const int p = ranks[i];
      Peer& peer = peers_[p];
      if ((pfds[i].revents & POLLOUT) != 0 && sent[p] < message_bytes) {
        const ssize_t n = tcp::Send(
            links_[p], reinterpret_cast<const char*>(out.data()) + sent[p],
            message_bytes - sent[p]);
        if (n > 0) {
          sent[p] += static_cast<size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          return peer_error(p, absl::StrCat("is unreachable: ", Errno("send")));
        }
      }
      if ((pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0 &&
          peer.received < message_bytes) {
        // Exactly one message: the next round's may follow in the stream.
        const ssize_t n = tcp::Receive(
            links_[p],
            reinterpret_cast<char*>(peer.message.data()) + peer.received,
            message_bytes - peer.received);
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
          // The streams are out of step: no connection can be kept.
          for (int r = 0; r < size(); ++r) tcp::ShutDown(links_[r]);
          return Poison(absl::FailedPreconditionError(absl::StrCat(
              what, ": node rank ", p, " sent a vector of ", peer.message[0],
              " words, this node one of ", count,
              " (the nodes disagree on the plan: they must run one build "
              "of baton and the same coordinator plan)")));
        }
      }
    }
  }
  for (int p = 0; p < size(); ++p) {
    if (links_[p].fd < 0) continue;
    const Peer& peer = peers_[p];
    for (size_t i = 0; i < count; ++i) {
      data[i] = std::min(data[i], peer.message[i + 1]);
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::agent
