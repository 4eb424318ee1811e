#include "agent/transport/tcp/round_connections.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/transport/tcp/tcp_peers.h"

namespace baton::agent {

absl::StatusOr<std::unique_ptr<RoundConnections>> RoundConnections::Connect(
    const ConnectRequest& request, const std::string& address,
    const std::vector<bool>& wanted, Clock* clock, tcp::LinkPool* pool) {
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
    const absl::Status error = absl::UnavailableError(
        absl::StrCat(set.what, ": ", tcp::Errno("eventfd")));
    if (interrupt_fd >= 0) ::close(interrupt_fd);
    if (abort_fd >= 0) ::close(abort_fd);
    return error;
  }
  absl::StatusOr<tcp::LentLinks> links =
      tcp::ConnectPeers(request, address, set, wanted, *clock, pool);
  if (!links.ok()) {
    ::close(interrupt_fd);
    ::close(abort_fd);
    return links.status();
  }
  return std::unique_ptr<RoundConnections>(new RoundConnections(
      rank, std::move(links).value(), interrupt_fd, abort_fd, clock));
}

RoundConnections::RoundConnections(int rank, tcp::LentLinks links,
                                   int interrupt_fd, int abort_fd, Clock* clock)
    : rank_(rank),
      links_(std::move(links)),
      interrupt_fd_(interrupt_fd),
      abort_fd_(abort_fd),
      clock_(clock) {}

RoundConnections::~RoundConnections() {
  ::close(interrupt_fd_);
  ::close(abort_fd_);
}

std::string RoundConnections::Describe() const {
  return absl::StrCat("negotiation connections of ", size(),
                      " nodes (node rank ", rank_, ")");
}

std::string RoundConnections::DescribeRound(size_t count) const {
  return absl::StrCat("negotiation round of ", count * sizeof(int64_t),
                      " bytes (int64) on ", Describe());
}

absl::Status RoundConnections::CheckRound(
    const int64_t* data, size_t count, const CollectiveOptions& options) const {
  if (absl::Status usable = poison_.Check(Describe(), "new ones");
      !usable.ok()) {
    return usable;
  }
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
  return absl::OkStatus();
}

absl::Status RoundConnections::Poison(absl::Status status) {
  poison_.Set(status);
  return status;
}

absl::Status RoundConnections::PoisonPeer(int peer, absl::Status status) {
  tcp::ShutDown(links_[peer]);
  return Poison(std::move(status));
}

absl::Status RoundConnections::Aborted(const std::string& what) const {
  const absl::Status cause = poison_.cause();
  return absl::Status(cause.code(), absl::StrCat(what, ": ", cause.message()));
}

void RoundConnections::Interrupt() {
  const uint64_t one = 1;
  // Fails only when the counter would overflow: it is set either way.
  (void)!::write(interrupt_fd_, &one, sizeof one);
}

void RoundConnections::Abort(const absl::Status& status) {
  poison_.Set(status);
  const uint64_t one = 1;
  // Fails only when the counter would overflow: it is set either way.
  (void)!::write(abort_fd_, &one, sizeof one);
}

absl::StatusOr<int> RoundConnections::Poll(std::vector<struct pollfd>& pfds,
                                           const Deadline& deadline,
                                           const std::string& what) {
  pfds.push_back({abort_fd_, POLLIN, 0});
  int ready = -1;
  while (ready < 0) {
    ready = ::poll(pfds.data(), pfds.size(), tcp::PollMillis(deadline));
    if (ready < 0 && errno != EINTR) {
      pfds.pop_back();
      return Poison(
          absl::UnavailableError(absl::StrCat(what, ": ", tcp::Errno("poll"))));
    }
  }
  const bool aborted = pfds.back().revents != 0;
  pfds.pop_back();
  if (aborted) return Aborted(what);
  return ready;
}

std::string RoundConnections::WaitWhat() const {
  return absl::StrCat("waiting for a negotiation round on ", Describe());
}

absl::StatusOr<int> RoundConnections::AwaitPeer(size_t count) {
  if (absl::Status usable = poison_.Check(Describe(), "new ones");
      !usable.ok()) {
    return usable;
  }
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "waiting for a negotiation round of 0 words on ", Describe()));
  }
  if (size() == 1) return -1;  // nobody else can start one
  const std::string what = WaitWhat();
  std::vector<struct pollfd> pfds;
  std::vector<int> ranks = {-1, -1};
  pfds.push_back({interrupt_fd_, POLLIN, 0});
  pfds.push_back({abort_fd_, POLLIN, 0});
  for (int r = 0; r < size(); ++r) {
    if (!connected(r)) continue;
    pfds.push_back({links_[r].fd, POLLIN, 0});
    ranks.push_back(r);
  }
  while (true) {
    const int ready = ::poll(pfds.data(), pfds.size(), -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Poison(
          absl::UnavailableError(absl::StrCat(what, ": ", tcp::Errno("poll"))));
    }
    if (pfds[1].revents != 0) return Aborted(what);
    if (pfds[0].revents != 0) {
      uint64_t value = 0;
      (void)!::read(interrupt_fd_, &value, sizeof value);
      return -1;
    }
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (pfds[i].revents != 0) return ranks[i];
    }
  }
}

std::string RoundConnections::PeerFailure(ssize_t n, const char* call) {
  constexpr char kClosed[] =
      "closed its connection (its agent left the job or failed)";
  if (n == 0) return kClosed;
  if (errno == ECONNRESET || errno == EPIPE) {
    return absl::StrCat(kClosed, ": ", tcp::Errno(call));
  }
  return absl::StrCat("is unreachable: ", tcp::Errno(call));
}

}  // namespace baton::agent
