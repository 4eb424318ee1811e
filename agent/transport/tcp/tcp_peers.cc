#include "agent/transport/tcp/tcp_peers.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/transport/tcp/tcp_introduction.h"
#include "agent/transport/tcp/tcp_publication.h"
#include "agent/transport/tcp/tcp_socket.h"
#include "glog/logging.h"

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

// How long a connect waits for the links the last generation's communicators
// still hold (they let go as their threads see the abort: milliseconds).
constexpr absl::Duration kReturnWait = absl::Seconds(2);
// More unread bytes than socket buffers can hold: the peer's count is wrong.
constexpr uint64_t kMaxUnread = uint64_t{256} << 20;

// "0..3" for consecutive ranks, else "0, 2".
std::string RankList(const std::vector<int>& ranks) {
  if (ranks.size() > 1 &&
      ranks.back() - ranks.front() == static_cast<int>(ranks.size()) - 1) {
    return absl::StrCat(ranks.front(), "..", ranks.back());
  }
  if (ranks.size() == 1) return absl::StrCat(ranks[0], "..", ranks[0]);
  return absl::StrJoin(ranks, ", ");
}

// A new link's id: random, so that two links never share one.
uint64_t NewLinkId() {
  std::random_device random;
  uint64_t id = 0;
  while (id == 0) {
    id = (static_cast<uint64_t>(random()) << 32) ^ random();
  }
  return id;
}

// The links a connect took from the pool. Those it does not keep are closed
// when it ends, however it ends: this node published their counts, so their
// streams are good only to a peer that keeps them too.
class TakenLinks {
 public:
  TakenLinks(LinkPool* pool, const std::string& key, absl::Duration wait)
      : pool_(pool), key_(key) {
    if (pool_ != nullptr) links_ = pool_->Take(key_, wait);
  }
  ~TakenLinks() {
    for (Link& link : links_) {
      if (link.fd < 0) continue;
      link.broken = true;
      pool_->Return(key_, link);
    }
  }
  TakenLinks(const TakenLinks&) = delete;
  TakenLinks& operator=(const TakenLinks&) = delete;

  const std::vector<Link>& links() const { return links_; }

  // The link with the smallest id that a peer kept too (`kept`: the ids it
  // published), now owned by the caller; nullopt when there is none. Both
  // ends choose the same one.
  std::optional<Link> Keep(const std::map<uint64_t, uint64_t>& kept) {
    Link* best = nullptr;
    for (Link& link : links_) {
      if (link.fd >= 0 && kept.count(link.id) != 0 &&
          (best == nullptr || link.id < best->id)) {
        best = &link;
      }
    }
    if (best == nullptr) return std::nullopt;
    Link link = *best;
    best->fd = -1;
    return link;
  }

 private:
  LinkPool* const pool_;
  const std::string key_;
  std::vector<Link> links_;
};

// Reads and drops what the peer sent on a kept link that this node never
// read (`peer_sent` is the peer's count), so that the next byte is the
// peer's first of this generation; then both counts restart at zero.
absl::Status SkipUnread(Link& link, uint64_t peer_sent,
                        const Deadline& deadline) {
  const std::string what = absl::StrCat(
      "the connection kept from the last "
      "generation (link ",
      absl::Hex(link.id), ")");
  if (peer_sent < link.received || peer_sent - link.received > kMaxUnread) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the peer says it sent ", peer_sent,
                     " bytes, this node read ", link.received, " of them"));
  }
  uint64_t left = peer_sent - link.received;
  char scratch[64 << 10];
  while (left > 0) {
    const ssize_t n =
        Receive(link, scratch, std::min<uint64_t>(left, sizeof scratch));
    if (n > 0) {
      left -= static_cast<uint64_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat(what, " was closed by the peer"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat(what, ": ", Errno("recv")));
    }
    struct pollfd pfd = {link.fd, POLLIN, 0};
    if (::poll(&pfd, 1, PollMillis(deadline)) == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": timed out skipping ", left, " unread bytes"));
    }
  }
  link.sent = 0;
  link.received = 0;
  return absl::OkStatus();
}

// What the accepting side of one connect checks introductions against.
struct Acceptance {
  int rank;
  std::string key_prefix;
  std::string secret;
  const Deadline* deadline;
  std::chrono::milliseconds timeout;
  const std::string* what;
};

// Introductions refused in one connect for a MAC that does not verify:
// logged once per connect, and named in its timeout error.
struct Refusals {
  int count = 0;
  std::string first_from;
  int first_rank = 0;

  std::string Note() const {
    if (count == 0) return "";
    return absl::StrCat(" (refused ", count,
                        " introduction(s) that did not prove this "
                        "generation's secret, the first from ",
                        first_from, " claiming node rank ", first_rank, ")");
  }
};

// Accepts `count` introductions on `listener` from the ranks with
// fresh[rank] (all higher than this node's), into links[rank], and answers
// each authentic one with this node's proof (ReadIntroduction,
// EncodeIntroductionReply). Connections that are not a wanted peer's are
// dropped; one whose MAC does not verify is dropped and logged.
absl::Status AcceptPeers(int listener, const Acceptance& acceptance,
                         const std::vector<bool>& fresh, int count, FdList& fds,
                         std::vector<Link>& links) {
  const int rank = acceptance.rank;
  const int size = static_cast<int>(fresh.size());
  const std::string& what = *acceptance.what;
  struct Pending {
    int fd;
    std::string from;
    std::array<char, kIntroductionBytes> bytes;
    size_t received;
  };
  std::vector<Pending> pending;
  Refusals refusals;
  const auto drop = [&fds](int fd) {
    fds.Release(fd);
    ::close(fd);
  };
  for (int accepted = 0; accepted < count;) {
    std::vector<struct pollfd> pfds = {{listener, POLLIN, 0}};
    for (const Pending& p : pending) pfds.push_back({p.fd, POLLIN, 0});
    const int ready =
        ::poll(pfds.data(), pfds.size(), PollMillis(*acceptance.deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      return absl::UnavailableError(absl::StrCat(what, ": ", Errno("poll")));
    }
    if (ready == 0) {
      std::vector<int> missing;
      for (int r = rank + 1; r < size; ++r) {
        if (fresh[r] && links[r].fd < 0) missing.push_back(r);
      }
      return absl::DeadlineExceededError(
          absl::StrCat(what, " timed out after ", acceptance.timeout.count(),
                       " ms: node rank(s) ", absl::StrJoin(missing, ", "),
                       " did not connect", refusals.Note()));
    }
    std::vector<Pending> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (pfds[i + 1].revents == 0) {
        still.push_back(p);
        continue;
      }
      const ssize_t n = ::recv(p.fd, p.bytes.data() + p.received,
                               p.bytes.size() - p.received, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        still.push_back(p);
        continue;
      }
      if (n > 0) p.received += static_cast<size_t>(n);
      if (n > 0 && p.received < p.bytes.size()) {
        still.push_back(p);
        continue;
      }
      if (n <= 0) {
        drop(p.fd);
        continue;
      }
      const ReceivedIntroduction received =
          ReadIntroduction(std::string_view(p.bytes.data(), p.bytes.size()),
                           acceptance.key_prefix, acceptance.secret);
      const Introduction& h = received.introduction;
      if (received.verdict == ReceivedIntroduction::Verdict::kBadMac) {
        if (refusals.count++ == 0) {
          refusals.first_from = p.from;
          refusals.first_rank = h.rank;
          LOG(WARNING) << what << ": refused a connection from " << p.from
                       << " claiming to be node rank " << h.rank
                       << ": its introduction did not prove this "
                          "generation's secret (a peer of another generation, "
                          "or not a member of this job)";
        }
        drop(p.fd);
        continue;
      }
      if (received.verdict != ReceivedIntroduction::Verdict::kAuthentic ||
          h.rank <= rank || h.rank >= size || !fresh[h.rank] ||
          links[h.rank].fd >= 0 || h.link_id == 0) {
        drop(p.fd);
        continue;
      }
      absl::StatusOr<std::string> reply = EncodeIntroductionReply(
          acceptance.key_prefix, rank, h.link_id, acceptance.secret);
      if (!reply.ok()) {
        return absl::Status(reply.status().code(),
                            absl::StrCat(what, ": ", reply.status().message()));
      }
      if (!SendAll(p.fd, reply->data(), reply->size(), *acceptance.deadline,
                   "answering an introduction")
               .ok()) {
        drop(p.fd);  // the peer is gone: it fails its own connect
        continue;
      }
      SetNoDelay(p.fd);
      links[h.rank].fd = p.fd;
      links[h.rank].id = h.link_id;
      ++accepted;
    }
    pending.swap(still);
    if (pfds[0].revents != 0) {
      struct sockaddr_storage address = {};
      socklen_t length = sizeof address;
      const int fd =
          fds.Add(::accept4(listener, reinterpret_cast<sockaddr*>(&address),
                            &length, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd >= 0) {
        pending.push_back({fd, PeerAddress(address, length), {}, 0});
      }
    }
  }
  return absl::OkStatus();
}

// A link this node made by connecting to a lower rank, whose reply it has
// yet to read.
struct Introduced {
  int rank;
  std::string published;  // "host:port", for errors
};

// Reads each lower rank's answer to this node's introduction (in rank
// order) and checks it proves the generation's secret. Called after this
// node's own accept phase: a peer answers as soon as it reads the
// introduction, so waiting here right after connecting would only chain
// each node's start behind its lower neighbour's accept phase.
absl::Status ReadReplies(const std::vector<Introduced>& introduced,
                         const Acceptance& acceptance,
                         std::vector<Link>& links) {
  const std::string& what = *acceptance.what;
  for (const Introduced& peer : introduced) {
    Link& link = links[peer.rank];
    const std::string who =
        absl::StrCat(what, ": node rank ", peer.rank, " at ", peer.published);
    std::array<char, kIntroductionReplyBytes> reply;
    size_t received = 0;
    while (received < reply.size()) {
      const ssize_t n =
          ::recv(link.fd, reply.data() + received, reply.size() - received, 0);
      if (n > 0) {
        received += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        return absl::UnavailableError(absl::StrCat(
            who,
            " did not prove this generation's secret: it closed the "
            "connection instead of answering this node's introduction (it "
            "holds another secret, or its own connect failed: see its log)"));
      }
      struct pollfd pfd = {link.fd, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, PollMillis(*acceptance.deadline));
      if (ready == 0) {
        return absl::DeadlineExceededError(absl::StrCat(
            who, " did not answer this node's introduction within ",
            acceptance.timeout.count(), " ms"));
      }
      if (ready < 0 && errno != EINTR) {
        return absl::UnavailableError(absl::StrCat(who, ": ", Errno("poll")));
      }
    }
    if (!VerifyIntroductionReply(std::string_view(reply.data(), reply.size()),
                                 acceptance.key_prefix, peer.rank, link.id,
                                 acceptance.secret)) {
      return absl::UnavailableError(absl::StrCat(
          who,
          " did not prove this generation's secret: its answer to this "
          "node's introduction does not verify (it holds another secret)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LentLinks> ConnectPeers(const ConnectRequest& request,
                                       const std::string& address,
                                       const PeerSet& set,
                                       const std::vector<bool>& wanted,
                                       Clock& clock, LinkPool* pool) {
  const Deadline deadline(clock, absl::FromChrono(request.timeout));
  const int rank = request.node_rank;
  const int size = request.num_nodes;
  const std::string& what = set.what;
  if (static_cast<int>(wanted.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", wanted.size(), " peer flags for ", size, " nodes"));
  }
  if (request.secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": ConnectRequest.secret is empty: every new data-plane "
        "connection is authenticated with the generation's secret "
        "(Membership.data_plane_secret, drawn by the coordinator at each "
        "seal)"));
  }
  std::vector<int> others;
  for (int r = 0; r < size; ++r) {
    if (r != rank && wanted[r]) others.push_back(r);
  }
  if (pool != nullptr && request.reuse_key.empty()) pool = nullptr;
  const std::string pool_key =
      pool == nullptr ? "" : StoreKey(request.reuse_key, set.name);
  if (others.empty()) {
    return LentLinks(std::vector<Link>(size), pool, pool_key);
  }
  // Links of earlier generations under this key; the ones not kept are
  // closed, on every path.
  TakenLinks taken(pool, pool_key, std::min(kReturnWait, deadline.Left()));
  FdList fds;
  int port = 0;
  absl::StatusOr<int> listener =
      Listen(address, set.kind, SOMAXCONN, fds, &port);
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat(what, ": ", listener.status().message()));
  }
  const std::string key_prefix = StoreKey(request.prefix, set.name);
  const auto key = [&](int r) { return StoreKey(key_prefix, absl::StrCat(r)); };
  if (absl::Status published = request.store->Set(
          key(rank), Publication(address, port, taken.links()));
      !published.ok()) {
    return absl::Status(published.code(),
                        absl::StrCat(what, ": ", published.message()));
  }
  const uint64_t hash = PrefixHash(key_prefix);
  const Acceptance acceptance = {rank,      key_prefix,      request.secret,
                                 &deadline, request.timeout, &what};
  std::vector<std::string> keys;
  for (int r : others) keys.push_back(key(r));
  auto entries =
      request.store->Get(keys, absl::ToChronoMilliseconds(deadline.Left()));
  if (!entries.ok()) {
    return absl::Status(
        entries.status().code(),
        absl::StrCat(what, ": waiting for the addresses of node rank(s) ",
                     RankList(others), ": ", entries.status().message()));
  }
  std::vector<Link> links(size);
  std::vector<Introduced> introduced;
  int higher = 0;  // fresh links the higher ranks make
  int kept = 0;
  for (size_t i = 0; i < others.size(); ++i) {
    const int r = others[i];
    absl::StatusOr<Published> peer = ParsePublication((*entries)[i], set.kind);
    if (!peer.ok()) {
      return absl::Status(
          peer.status().code(),
          absl::StrCat(what, ": node rank ", r, ": ", peer.status().message()));
    }
    if (std::optional<Link> link = taken.Keep(peer->kept)) {
      absl::Status skipped =
          SkipUnread(*link, peer->kept.at(link->id), deadline);
      if (!skipped.ok()) {
        return absl::Status(
            skipped.code(),
            absl::StrCat(what, ": node rank ", r, ": ", skipped.message()));
      }
      links[r] = *link;
      ++kept;
    } else if (r < rank) {
      // Every wanted lower rank listens: connect and introduce this node.
      absl::StatusOr<int> fd =
          ConnectTo(peer->host, peer->port, set.kind, deadline, fds);
      const Introduction introduction = {rank, hash, NewLinkId()};
      absl::StatusOr<std::string> bytes =
          EncodeIntroduction(introduction, key_prefix, request.secret);
      absl::Status status = !fd.ok() ? fd.status()
                            : !bytes.ok()
                                ? bytes.status()
                                : SendAll(*fd, bytes->data(), bytes->size(),
                                          deadline, "introducing this node");
      if (!status.ok()) {
        return absl::Status(
            status.code(),
            absl::StrCat(what, ": node rank ", r, ": ", status.message()));
      }
      links[r].fd = *fd;
      links[r].id = introduction.link_id;
      introduced.push_back(
          {r, peer->host.find(':') == std::string::npos
                  ? absl::StrCat(peer->host, ":", peer->port)
                  : absl::StrCat("[", peer->host, "]:", peer->port)});
    } else {
      ++higher;
    }
  }
  std::vector<bool> fresh(size, false);
  for (int r : others) fresh[r] = r > rank && links[r].fd < 0;
  absl::Status accepted =
      AcceptPeers(*listener, acceptance, fresh, higher, fds, links);
  if (!accepted.ok()) return accepted;
  absl::Status proven = ReadReplies(introduced, acceptance, links);
  if (!proven.ok()) return proven;
  const int made = static_cast<int>(others.size()) - kept;
  for (const Link& link : links) fds.Release(link.fd);
  if (pool != nullptr) {
    pool->Lend(pool_key, made);
    pool->Count(kept, made);
  }
  return LentLinks(std::move(links), pool, pool_key);
}

}  // namespace baton::agent::tcp
