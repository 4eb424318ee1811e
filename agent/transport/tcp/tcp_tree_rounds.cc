#include "agent/transport/tcp/tcp_tree_rounds.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/transport/tcp/tcp_peers.h"

namespace baton::agent {
namespace {

constexpr size_t kWord = sizeof(int64_t);

bool Transient(int error) {
  return error == EAGAIN || error == EWOULDBLOCK || error == EINTR;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpTreeRounds>> TcpTreeRounds::Connect(
    const ConnectRequest& request, int fanout, const std::string& address,
    Clock* clock, tcp::LinkPool* pool) {
  ConnectRequest checked = request;
  checked.count = 1;
  if (absl::Status valid = ValidateConnectRequest(checked); !valid.ok()) {
    return valid;
  }
  if (fanout < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a negotiation tree of fanout ", fanout, ": give at least 2"));
  }
  NegotiationTree tree(request.node_rank, request.num_nodes, fanout);
  std::vector<bool> wanted(request.num_nodes, false);
  for (const int neighbour : tree.Neighbours()) wanted[neighbour] = true;
  absl::StatusOr<std::unique_ptr<RoundConnections>> connections =
      RoundConnections::Connect(request, address, wanted, clock, pool);
  if (!connections.ok()) return connections.status();
  return std::unique_ptr<TcpTreeRounds>(
      new TcpTreeRounds(std::move(connections).value(), std::move(tree)));
}

TcpTreeRounds::TcpTreeRounds(std::unique_ptr<RoundConnections> connections,
                             NegotiationTree tree)
    : ConnectedRounds(std::move(connections)), tree_(std::move(tree)) {
  const std::vector<int> ranks = tree_.Neighbours();
  neighbours_.reserve(ranks.size());
  for (const int r : ranks) {
    neighbours_.emplace_back(r, r != tree_.parent(), &connections_->link(r));
  }
}

absl::StatusOr<bool> TcpTreeRounds::AwaitRound(size_t count) {
  const std::string what = connections_->WaitWhat();
  while (true) {
    const absl::StatusOr<int> peer = connections_->AwaitPeer(count);
    if (!peer.ok()) return peer.status();
    if (*peer < 0) return false;
    Neighbour& from =
        *std::find_if(neighbours_.begin(), neighbours_.end(),
                      [&](const Neighbour& n) { return n.rank == *peer; });
    // A neighbour's join word, a notice of a failure, or the end of the
    // stream.
    int64_t word = 0;
    const ssize_t n = ::recv(from.link.fd(), &word, kWord, MSG_PEEK);
    if (n == static_cast<ssize_t>(kWord) && word < 0) {
      from.link.Expect(&word, kWord);
      from.link.Receive();  // the kWord bytes just seen
      return TakeNotice(from, word, nullptr, 0, what);
    }
    // Part of a word: a message is coming (ExchangeMin reads it).
    if (n > 0) return true;
    if (n < 0 && Transient(errno)) continue;
    return FailPeer(from, n, "recv", what);
  }
}

absl::Status TcpTreeRounds::ExchangeMin(int64_t* data, size_t count,
                                        const CollectiveOptions& options) {
  if (absl::Status valid = connections_->CheckRound(data, count, options);
      !valid.ok()) {
    return valid;
  }
  if (count == 0 || size() == 1) return absl::OkStatus();
  const std::string what = connections_->DescribeRound(count);
  Clock& clock = connections_->clock();
  const Deadline deadline(clock, absl::FromChrono(options.timeout));
  std::optional<Deadline> grace;

  const int64_t header = static_cast<int64_t>(count);
  const size_t round_bytes = (count + 2) * kWord;
  const size_t body_bytes = round_bytes - kWord;
  own_.resize(count + 2);
  own_[0] = header;
  own_[1] = header;
  std::copy(data, data + count, own_.begin() + 2);
  size_t waiting_children = tree_.children().size();
  // Join: every neighbour gets the join word at once; a leaf's body goes
  // with it.
  for (Neighbour& n : neighbours_) {
    n.in.assign(count + 2, 0);
    n.link.Expect(n.in.data(), round_bytes);
    const bool with_body = !n.child && waiting_children == 0;
    n.link.Queue(own_.data(), with_body ? round_bytes : kWord);
  }
  const int64_t* result = nullptr;  // the count word, then the vector
  const auto send_down = [&](const int64_t* body) {
    result = body;
    for (Neighbour& n : neighbours_) {
      if (n.child) n.link.Queue(body, body_bytes);
    }
  };

  std::vector<struct pollfd> pfds;
  std::vector<Neighbour*> polled;
  while (true) {
    if (connections_->poisoned()) return connections_->Aborted(what);
    pfds.clear();
    polled.clear();
    for (Neighbour& n : neighbours_) {
      if (n.link.events() == 0) continue;
      pfds.push_back({n.link.fd(), n.link.events(), 0});
      polled.push_back(&n);
    }
    if (pfds.empty()) break;
    const absl::StatusOr<int> ready =
        connections_->Poll(pfds, grace ? *grace : deadline, what);
    if (!ready.ok()) return ready.status();
    if (*ready == 0) {
      RoundNotice notice;
      notice.reporter = rank();
      notice.reason = RoundNotice::Reason::kTimedOut;
      notice.a = options.timeout.count();
      for (const Neighbour* n : polled) {
        if (n->link.received() < kWord) notice.subjects.push_back(n->rank);
      }
      if (notice.subjects.empty() && !grace) {
        // Every neighbour joined: the node that waits for the silent one
        // will say which it is.
        grace.emplace(clock, absl::FromChrono(options.timeout));
        continue;
      }
      if (notice.subjects.empty()) {
        for (const Neighbour* n : polled) notice.subjects.push_back(n->rank);
      }
      std::sort(notice.subjects.begin(), notice.subjects.end());
      return Fail(notice, what, -1);
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      Neighbour& n = *polled[i];
      if ((pfds[i].revents & POLLOUT) != 0 && n.link.sending() &&
          !n.link.Send()) {
        return FailPeer(n, -1, "send", what);
      }
      if ((pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0 ||
          !n.link.receiving()) {
        continue;
      }
      const size_t before = n.link.received();
      const ssize_t got = n.link.Receive();
      if (got < 0 && Transient(errno)) continue;
      if (got <= 0) return FailPeer(n, got, "recv", what);
      // The join word and the body's count word begin messages: a notice
      // may stand in either place.
      for (size_t word = 0; word < 2; ++word) {
        const size_t end = (word + 1) * kWord;
        if (before >= end || n.link.received() < end) continue;
        if (n.in[word] < 0) {
          return TakeNotice(n, n.in[word], n.in.data() + word + 1,
                            n.link.received() - end, what);
        }
        if (n.in[word] != header) return FailHeader(n, n.in[word], count, what);
      }
      if (n.link.receiving()) continue;
      if (!n.child) {
        send_down(n.in.data() + 1);
        continue;
      }
      for (size_t j = 2; j < count + 2; ++j) {
        own_[j] = std::min(own_[j], n.in[j]);
      }
      if (--waiting_children > 0) continue;
      if (tree_.parent() < 0) {
        send_down(own_.data() + 1);
      } else {
        neighbours_.front().link.Queue(own_.data() + 1, body_bytes);
      }
    }
  }
  std::copy(result + 1, result + 1 + count, data);
  return absl::OkStatus();
}

absl::Status TcpTreeRounds::Fail(const RoundNotice& notice,
                                 const std::string& what, int except) {
  const absl::Status status = notice.ToStatus(what, rank());
  (void)connections_->Poison(status);
  Tell(notice, except);
  return status;
}

absl::Status TcpTreeRounds::FailPeer(Neighbour& from, ssize_t n,
                                     const char* call,
                                     const std::string& what) {
  const int error = errno;
  RoundNotice notice;
  notice.reporter = rank();
  notice.reason = n == 0 || error == ECONNRESET || error == EPIPE
                      ? RoundNotice::Reason::kClosed
                      : RoundNotice::Reason::kUnreachable;
  notice.subjects = {from.rank};
  notice.detail = RoundConnections::PeerFailure(n, call);
  from.link.DropUnstarted();
  tcp::ShutDown(from.link.link());
  return Fail(notice, what, from.rank);
}

absl::Status TcpTreeRounds::FailHeader(Neighbour& from, int64_t word,
                                       size_t count, const std::string& what) {
  RoundNotice notice;
  notice.reporter = rank();
  notice.reason = word > 0 ? RoundNotice::Reason::kMismatch
                           : RoundNotice::Reason::kUnreadable;
  notice.a = word;
  notice.b = static_cast<int64_t>(count);
  notice.subjects = {from.rank};
  // The stream from it is out of step: the connection cannot be kept.
  from.link.DropUnstarted();
  tcp::ShutDown(from.link.link());
  return Fail(notice, what, from.rank);
}

absl::Status TcpTreeRounds::TakeNotice(Neighbour& from, int64_t header,
                                       const int64_t* already, size_t have,
                                       const std::string& what) {
  const uint64_t words = -static_cast<uint64_t>(header);
  if (words < RoundNotice::kFixedWords ||
      words > RoundNotice::kFixedWords + static_cast<uint64_t>(size())) {
    return FailHeader(from, header, 0, what);
  }
  std::vector<int64_t> rest(words);
  const size_t bytes = words * kWord;
  have = std::min(have, bytes);
  if (have > 0) std::memcpy(rest.data(), already, have);
  // The sender wrote the notice at once: it is here or on its way.
  from.link.Expect(reinterpret_cast<char*>(rest.data()) + have, bytes - have);
  const Deadline deadline(connections_->clock(),
                          absl::FromChrono(kNoticeTimeout));
  std::vector<struct pollfd> pfds;
  while (from.link.receiving()) {
    pfds = {{from.link.fd(), POLLIN, 0}};
    const absl::StatusOr<int> ready = connections_->Poll(pfds, deadline, what);
    if (!ready.ok()) return ready.status();
    if (*ready == 0) {
      RoundNotice stalled;
      stalled.reporter = rank();
      stalled.reason = RoundNotice::Reason::kUnreachable;
      stalled.subjects = {from.rank};
      stalled.detail =
          absl::StrCat("sent part of a failure notice, then nothing for ",
                       kNoticeTimeout.count(), " ms");
      tcp::ShutDown(from.link.link());
      return Fail(stalled, what, from.rank);
    }
    const ssize_t got = from.link.Receive();
    if (got < 0 && Transient(errno)) continue;
    if (got <= 0) return FailPeer(from, got, "recv", what);
  }
  absl::StatusOr<RoundNotice> notice =
      RoundNotice::Decode(rest.data(), rest.size(), size());
  if (!notice.ok()) return FailHeader(from, header, 0, what);
  return Fail(*notice, what, from.rank);
}

void TcpTreeRounds::Tell(const RoundNotice& notice, int except) {
  notice_ = notice.Encode();
  std::vector<Neighbour*> told;
  for (Neighbour& n : neighbours_) {
    n.link.Expect(nullptr, 0);
    if (n.rank == except || n.link.link().broken) {
      n.link.DropUnstarted();
      continue;
    }
    n.link.DropUnstarted();
    n.link.Queue(notice_.data(), notice_.size() * kWord);
    told.push_back(&n);
  }
  const Deadline deadline(connections_->clock(),
                          absl::FromChrono(kNoticeTimeout));
  std::vector<struct pollfd> pfds;
  std::vector<Neighbour*> polled;
  while (true) {
    pfds.clear();
    polled.clear();
    for (Neighbour* n : told) {
      if (!n->link.sending() || n->link.link().broken) continue;
      pfds.push_back({n->link.fd(), POLLOUT, 0});
      polled.push_back(n);
    }
    if (pfds.empty()) return;
    pfds.push_back({connections_->abort_fd(), POLLIN, 0});
    const int ready =
        ::poll(pfds.data(), pfds.size(), tcp::PollMillis(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || pfds.back().revents != 0) break;
    for (size_t i = 0; i < polled.size(); ++i) {
      // A failed send breaks the link: that neighbour is gone too.
      if (pfds[i].revents != 0) polled[i]->link.Send();
    }
  }
  // Whoever did not take the notice in time sees its connection end.
  for (Neighbour* n : told) {
    if (!n->link.sending() || n->link.link().broken) continue;
    n->link.DropUnstarted();
    tcp::ShutDown(n->link.link());
  }
}

}  // namespace baton::agent
