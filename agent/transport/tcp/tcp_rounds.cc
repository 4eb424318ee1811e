#include "agent/transport/tcp/tcp_rounds.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/transport/tcp/tcp_peers.h"

namespace baton::agent {

absl::StatusOr<std::unique_ptr<TcpRounds>> TcpRounds::Connect(
    const ConnectRequest& request, const std::string& address, Clock* clock,
    tcp::LinkPool* pool) {
  absl::StatusOr<std::unique_ptr<RoundConnections>> connections =
      RoundConnections::Connect(request, address,
                                std::vector<bool>(request.num_nodes, true),
                                clock, pool);
  if (!connections.ok()) return connections.status();
  return std::unique_ptr<TcpRounds>(
      new TcpRounds(std::move(connections).value()));
}

TcpRounds::TcpRounds(std::unique_ptr<RoundConnections> connections)
    : ConnectedRounds(std::move(connections)), messages_(connections_->size()) {
  links_.reserve(connections_->size());
  for (int r = 0; r < connections_->size(); ++r) {
    links_.emplace_back(&connections_->link(r));
  }
}

absl::StatusOr<bool> TcpRounds::AwaitRound(size_t count) {
  const std::string what = connections_->WaitWhat();
  while (true) {
    const absl::StatusOr<int> peer = connections_->AwaitPeer(count);
    if (!peer.ok()) return peer.status();
    if (*peer < 0) return false;
    // A vector waits in the socket, or the peer is gone (end of stream).
    char byte = 0;
    const ssize_t n = ::recv(links_[*peer].fd(), &byte, 1, MSG_PEEK);
    if (n > 0) return true;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    return connections_->PoisonPeer(
        *peer, absl::UnavailableError(
                   absl::StrCat(what, ": node rank ", *peer, " ",
                                RoundConnections::PeerFailure(n, "recv"))));
  }
}

absl::Status TcpRounds::ExchangeMin(int64_t* data, size_t count,
                                    const CollectiveOptions& options) {
  if (absl::Status valid = connections_->CheckRound(data, count, options);
      !valid.ok()) {
    return valid;
  }
  if (count == 0 || size() == 1) return absl::OkStatus();
  const std::string what = connections_->DescribeRound(count);
  const Deadline deadline(connections_->clock(),
                          absl::FromChrono(options.timeout));

  out_.resize(count + 1);
  out_[0] = static_cast<int64_t>(count);
  std::copy(data, data + count, out_.begin() + 1);
  const size_t message_bytes = out_.size() * sizeof(int64_t);
  // Every peer gets `out_` and sends its own message into its buffer, both
  // at once (RoundLink).
  for (int p = 0; p < size(); ++p) {
    if (!connections_->connected(p)) continue;
    messages_[p].assign(count + 1, 0);
    links_[p].Queue(out_.data(), message_bytes);
    links_[p].Expect(messages_[p].data(), message_bytes);
  }
  const auto peer_error = [&](int peer, ssize_t n, const char* call) {
    links_[peer].DropUnstarted();
    return connections_->PoisonPeer(
        peer, absl::UnavailableError(
                  absl::StrCat(what, ": node rank ", peer, " ",
                               RoundConnections::PeerFailure(n, call))));
  };
  std::vector<struct pollfd> pfds;
  std::vector<int> ranks;
  while (true) {
    if (connections_->poisoned()) return connections_->Aborted(what);
    pfds.clear();
    ranks.clear();
    for (int p = 0; p < size(); ++p) {
      if (!connections_->connected(p) || links_[p].events() == 0) continue;
      pfds.push_back({links_[p].fd(), links_[p].events(), 0});
      ranks.push_back(p);
    }
    if (pfds.empty()) break;
    const absl::StatusOr<int> ready = connections_->Poll(pfds, deadline, what);
    if (!ready.ok()) return ready.status();
    if (*ready == 0) {
      return connections_->Poison(absl::DeadlineExceededError(absl::StrCat(
          what, " timed out after ", options.timeout.count(),
          " ms waiting for node rank(s) ", absl::StrJoin(ranks, ", "))));
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int p = ranks[i];
      tcp::RoundLink& link = links_[p];
      if ((pfds[i].revents & POLLOUT) != 0 && link.sending() && !link.Send()) {
        return peer_error(p, -1, "send");
      }
      if ((pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0 ||
          !link.receiving()) {
        continue;
      }
      // Exactly one message: the next round's may follow in the stream.
      const size_t before = link.received();
      const ssize_t n = link.Receive();
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                     errno != EINTR)) {
        return peer_error(p, n, "recv");
      }
      if (before < sizeof(int64_t) && link.received() >= sizeof(int64_t) &&
          messages_[p][0] != static_cast<int64_t>(count)) {
        // The streams are out of step: no connection can be kept.
        for (int r = 0; r < size(); ++r) {
          if (connections_->connected(r)) tcp::ShutDown(connections_->link(r));
        }
        return connections_->Poison(absl::FailedPreconditionError(absl::StrCat(
            what, ": node rank ", p, " sent a vector of ", messages_[p][0],
            " words, this node one of ", count,
            " (the nodes disagree on the plan: they must run one build "
            "of baton and the same coordinator plan)")));
      }
    }
  }
  for (int p = 0; p < size(); ++p) {
    if (!connections_->connected(p)) continue;
    const std::vector<int64_t>& message = messages_[p];
    for (size_t i = 0; i < count; ++i) {
      data[i] = std::min(data[i], message[i + 1]);
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::agent
