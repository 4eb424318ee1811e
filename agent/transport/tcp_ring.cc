#include "agent/transport/tcp_ring.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton::agent {
namespace {

// "BRNG": the first word of every operation.
constexpr uint32_t kMagic = 0x42524e47;
constexpr uint32_t kAllreduce = 1;
constexpr uint32_t kBroadcast = 2;

// x mod n for x in (-n, 2n).
int Mod(int x, int n) { return ((x % n) + n) % n; }

const char* KindName(uint32_t kind) {
  return kind == kAllreduce   ? "allreduce"
         : kind == kBroadcast ? "broadcast"
                              : "an unknown collective";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpRing>> TcpRing::Connect(
    const ConnectRequest& request, const std::string& address,
    const std::string& name, Clock* clock, tcp::LinkPool* pool) {
  ConnectRequest checked = request;
  checked.count = 1;
  if (absl::Status valid = ValidateConnectRequest(checked); !valid.ok()) {
    return valid;
  }
  const int rank = request.node_rank;
  const int size = request.num_nodes;
  tcp::PeerSet set;
  set.name = absl::StrCat("ring/", name);
  set.kind = "data";
  set.what = absl::StrCat("connecting communicator ", name, " of ", size,
                          " nodes (node rank ", rank, ", keys under \"",
                          StoreKey(request.prefix, set.name), "/\")");
  std::vector<bool> wanted(size, false);
  if (size > 1) {
    wanted[Mod(rank - 1, size)] = true;
    wanted[Mod(rank + 1, size)] = true;
  }
  const int abort_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (abort_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(set.what, ": ", tcp::Errno("eventfd")));
  }
  absl::StatusOr<tcp::LentLinks> links =
      tcp::ConnectPeers(request, address, set, wanted, *clock, pool);
  if (!links.ok()) {
    ::close(abort_fd);
    return links.status();
  }
  return std::unique_ptr<TcpRing>(
      new TcpRing(name, rank, size, std::move(links).value(), abort_fd, clock));
}

TcpRing::TcpRing(std::string name, int rank, int size, tcp::LentLinks links,
                 int abort_fd, Clock* clock)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      links_(std::move(links)),
      abort_fd_(abort_fd),
      clock_(clock) {}

TcpRing::~TcpRing() { ::close(abort_fd_); }

int TcpRing::Wrap(int x) const { return Mod(x, size_); }

std::string TcpRing::Describe() const {
  return absl::StrCat("communicator ", name_, " of ", size_,
                      " nodes (node rank ", rank_, ")");
}

absl::Status TcpRing::Poison(absl::Status status, const std::string& what) {
  poison_.Set(status);
  // After Abort the collective that fails because of it reports the abort.
  const absl::Status cause = poison_.cause();
  if (cause == status) return status;
  return absl::Status(cause.code(), absl::StrCat(what, ": ", cause.message()));
}

absl::Status TcpRing::PoisonLink(tcp::Link& link, absl::Status status,
                                 const std::string& what) {
  tcp::ShutDown(link);
  return Poison(std::move(status), what);
}

void TcpRing::Abort(const absl::Status& status) {
  poison_.Set(status);
  const uint64_t one = 1;
  // Fails only when the counter would overflow: it is set either way.
  (void)!::write(abort_fd_, &one, sizeof one);
}

absl::Status TcpRing::HeaderMismatch(const Header& mine, const Header& theirs,
                                     const std::string& what) {
  const int prev = Wrap(rank_ - 1);
  // The streams are out of step: neither connection can be kept.
  tcp::ShutDown(this->prev());
  tcp::ShutDown(this->next());
  if (theirs.magic != kMagic) {
    return Poison(absl::InternalError(absl::StrCat(
                      what, ": node rank ", prev,
                      " sent something that is not an operation header (the "
                      "stream is out "
                      "of step; the nodes must run one build of baton)")),
                  what);
  }
  const auto describe = [](const Header& h) {
    return absl::StrCat(KindName(h.kind), " #", h.seq, " of ", h.bytes,
                        " bytes (", h.kind == kBroadcast ? "root " : "dtype ",
                        h.detail, ")");
  };
  return Poison(absl::FailedPreconditionError(absl::StrCat(
                    what, ": node rank ", prev, " runs ", describe(theirs),
                    ", this node ", describe(mine),
                    " (the nodes disagree on the order of collectives on this "
                    "communicator)")),
                what);
}

absl::Status TcpRing::Run(const Step& step, const Deadline& deadline,
                          const std::string& what,
                          const CollectiveOptions& options) {
  const int prev = Wrap(rank_ - 1);
  const int next = Wrap(rank_ + 1);
  tcp::Link& from = this->prev();
  tcp::Link& to = this->next();
  Header theirs = {};
  size_t header_sent = step.send_header ? 0 : sizeof(Header);
  size_t header_received = step.recv_header ? 0 : sizeof(Header);
  size_t sent = 0;
  size_t received = 0;
  size_t filled = 0;  // received bytes in scratch_, not yet added
  const auto fail = [&](tcp::Link& link, int peer, const char* doing,
                        const char* call) {
    return PoisonLink(link,
                      absl::UnavailableError(absl::StrCat(
                          what, ": node rank ", peer, " is unreachable while ",
                          doing, ": ", tcp::Errno(call))),
                      what);
  };
  while (true) {
    bool progress = false;
    // Send: the header, then the data (a relay only what it has).
    const size_t send_limit = step.forward ? received : step.send_bytes;
    if (header_sent < sizeof(Header)) {
      const ssize_t n = tcp::Send(
          to, reinterpret_cast<const char*>(step.header) + header_sent,
          sizeof(Header) - header_sent);
      if (n > 0) {
        header_sent += static_cast<size_t>(n);
        progress = true;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return fail(to, next, "sending", "send");
      }
    } else if (sent < send_limit) {
      const ssize_t n = tcp::Send(to, step.send + sent, send_limit - sent);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        progress = true;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return fail(to, next, "sending", "send");
      }
    }
    // Receive: the header, then exactly this step's bytes (the next
    // step's may follow in the stream).
    ssize_t n = 1;
    if (header_received < sizeof(Header)) {
      n = tcp::Receive(from, reinterpret_cast<char*>(&theirs) + header_received,
                       sizeof(Header) - header_received);
      if (n > 0) {
        header_received += static_cast<size_t>(n);
        progress = true;
        if (header_received == sizeof(Header) &&
            std::memcmp(&theirs, step.header, sizeof(Header)) != 0) {
          return HeaderMismatch(*step.header, theirs, what);
        }
      }
    } else if (received < step.recv_bytes) {
      if (step.sum == nullptr) {
        n = tcp::Receive(from, step.recv + received,
                         step.recv_bytes - received);
        if (n > 0) received += static_cast<size_t>(n);
      } else {
        const size_t room =
            std::min(kSegmentBytes - filled, step.recv_bytes - received);
        n = tcp::Receive(from, scratch_.data() + filled, room);
        if (n > 0) {
          filled += static_cast<size_t>(n);
          received += static_cast<size_t>(n);
          if (filled == kSegmentBytes || received == step.recv_bytes) {
            const size_t at = received - filled;
            step.sum(step.recv + at, step.addend + at, scratch_.data(),
                     filled / step.element);
            filled = 0;
          }
        }
      }
      if (n > 0) progress = true;
    }
    if (n == 0) {
      return PoisonLink(from,
                        absl::UnavailableError(absl::StrCat(
                            what, ": node rank ", prev,
                            " closed its connection (its agent left the job or "
                            "failed)")),
                        what);
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return fail(from, prev, "receiving", "recv");
    }
    const bool send_done =
        header_sent == sizeof(Header) && sent == step.send_bytes;
    const bool recv_done =
        header_received == sizeof(Header) && received == step.recv_bytes;
    if (send_done && recv_done) return absl::OkStatus();
    if (progress && !poison_.is_set()) continue;

    // Nothing moved: sleep until a connection is ready or Abort.
    short send_events = 0;
    if (header_sent < sizeof(Header) || sent < send_limit) {
      send_events = POLLOUT;
    }
    const short recv_events = recv_done ? 0 : POLLIN;
    struct pollfd pfds[3];
    nfds_t count = 0;
    pfds[count++] = {abort_fd_, POLLIN, 0};
    if (&from == &to) {
      pfds[count++] = {from.fd, static_cast<short>(send_events | recv_events),
                       0};
    } else {
      if (recv_events != 0) pfds[count++] = {from.fd, recv_events, 0};
      if (send_events != 0) pfds[count++] = {to.fd, send_events, 0};
    }
    const int ready = ::poll(pfds, count, tcp::PollMillis(deadline));
    if (ready < 0 && errno != EINTR) {
      return Poison(
          absl::UnavailableError(absl::StrCat(what, ": ", tcp::Errno("poll"))),
          what);
    }
    if (poison_.is_set() || (ready > 0 && pfds[0].revents != 0)) {
      // Aborted: the poison is the abort's status.
      return Poison(absl::AbortedError("aborted"), what);
    }
    if (ready == 0) {
      const bool waiting_to_receive = !recv_done;
      return Poison(
          absl::DeadlineExceededError(absl::StrCat(
              what, " timed out after ", options.timeout.count(), " ms ",
              waiting_to_receive
                  ? absl::StrCat("waiting for node rank ", prev, " (received ",
                                 received, " of ", step.recv_bytes, " bytes)")
                  : absl::StrCat("sending to node rank ", next, " (sent ", sent,
                                 " of ", step.send_bytes, " bytes)"))),
          what);
    }
  }
}

absl::Status TcpRing::AllreduceSum(void* data, size_t count, v1::DataType dtype,
                                   const CollectiveOptions& options) {
  if (absl::Status valid =
          poison_.CheckAllreduce(data, count, dtype, options, Describe());
      !valid.ok()) {
    return valid;
  }
  if (count == 0) return absl::OkStatus();
  const size_t element = ElementSize(dtype);
  const PairwiseSum sum = PairwiseSumFor(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  const auto* input = options.input == nullptr
                          ? bytes
                          : static_cast<const uint8_t*>(options.input);
  if (size_ == 1) {
    if (input != bytes) std::memcpy(bytes, input, count * element);
    if (options.divisor > 1) {
      DivideInPlace(dtype, bytes, count, options.divisor);
    }
    return absl::OkStatus();
  }
  const std::string what =
      absl::StrCat("allreduce of ", count * element, " bytes (",
                   DataTypeName(dtype), ") on ", Describe());
  if (scratch_.empty()) scratch_.resize(kSegmentBytes);
  const Header header = {kMagic, kAllreduce, count * element,
                         static_cast<uint32_t>(dtype), seq_++};
  const Deadline deadline(*clock_, absl::FromChrono(options.timeout));
  // Chunk c: elements [begin(c), begin(c + 1)).
  const size_t base = count / size_;
  const size_t extra = count % size_;
  const auto begin = [&](int c) {
    return base * c + std::min<size_t>(c, extra);
  };
  const auto offset = [&](int c) { return begin(c) * element; };
  const auto length = [&](int c) { return offset(c + 1) - offset(c); };
  for (int phase = 0; phase < 2; ++phase) {
    for (int s = 0; s < size_ - 1; ++s) {
      // Reduce-scatter: chunk r - s goes on (the input's at the first step,
      // then the sum received the step before), chunk r - s - 1 comes in
      // and is added to the input's into the result. Allgather: the
      // finished chunk r + 1 - s goes on, chunk r - s comes in finished.
      // The input is only ever read.
      const int out = phase == 0 ? Wrap(rank_ - s) : Wrap(rank_ + 1 - s);
      const int in = phase == 0 ? Wrap(rank_ - s - 1) : Wrap(rank_ - s);
      Step step;
      step.header = &header;
      step.send_header = step.recv_header = phase == 0 && s == 0;
      step.element = element;
      step.send = (phase == 0 && s == 0 ? input : bytes) + offset(out);
      step.send_bytes = length(out);
      step.recv = bytes + offset(in);
      step.recv_bytes = length(in);
      if (phase == 0) {
        step.sum = sum;
        step.addend = input + offset(in);
      }
      if (absl::Status status = Run(step, deadline, what, options);
          !status.ok()) {
        return status;
      }
    }
    // This node finished chunk r + 1: it alone divides it, before sending.
    if (phase == 0 && options.divisor > 1) {
      const int done = Wrap(rank_ + 1);
      DivideInPlace(dtype, bytes + offset(done), length(done) / element,
                    options.divisor);
    }
  }
  return absl::OkStatus();
}

absl::Status TcpRing::Broadcast(void* data, size_t bytes, int root,
                                const CollectiveOptions& options) {
  if (absl::Status valid =
          poison_.CheckBroadcast(data, bytes, root, size_, options, Describe());
      !valid.ok()) {
    return valid;
  }
  if (bytes == 0) return absl::OkStatus();
  if (size_ == 1) return absl::OkStatus();
  const std::string what =
      absl::StrCat("broadcast of ", bytes, " bytes from node rank ", root,
                   " on ", Describe());
  const Header header = {kMagic, kBroadcast, bytes, static_cast<uint32_t>(root),
                         seq_++};
  // Every node sends its header to the next and checks the previous one's,
  // the root's previous node included (it sends no data), so that nodes
  // that disagree on the root or the size all fail.
  Step step;
  step.header = &header;
  step.send_header = step.recv_header = true;
  auto* buffer = static_cast<uint8_t*>(data);
  if (rank_ == root) {
    step.send = buffer;
    step.send_bytes = bytes;
  } else {
    step.recv = buffer;
    step.recv_bytes = bytes;
    // Every node but the root's previous one relays to the next.
    if (Wrap(rank_ + 1) != root) {
      step.send = buffer;
      step.send_bytes = bytes;
      step.forward = true;
    }
  }
  return Run(step, Deadline(*clock_, absl::FromChrono(options.timeout)), what,
             options);
}

}  // namespace baton::agent
