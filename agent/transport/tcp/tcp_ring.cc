#include "agent/transport/tcp/tcp_ring.h"

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
#include "agent/transport/tcp/zero_blocks.h"

namespace baton::agent {
namespace {

// "BRN2": the first word of every operation (2: allreduce data framed in
// blocks).
constexpr uint32_t kMagic = 0x324e5242;
constexpr uint32_t kAllreduce = 1;
constexpr uint32_t kBroadcast = 2;
constexpr uint32_t kAllgather = 3;
constexpr uint32_t kReduceScatter = 4;
constexpr uint32_t kAlltoall = 5;
// Preamble formats: "DENS" (every byte follows), "SPRS" (a bitmap, then the
// blocks it marks).
constexpr uint32_t kDenseFrame = 0x534e4544;
constexpr uint32_t kSparseFrame = 0x53525053;
// Segments per sendmsg(2).
constexpr int kSendBatch = 64;

// x mod n for x in (-n, 2n).
int Mod(int x, int n) { return ((x % n) + n) % n; }

const char* KindName(uint32_t kind) {
  return kind == kAllreduce       ? "allreduce"
         : kind == kBroadcast     ? "broadcast"
         : kind == kAllgather     ? "allgather"
         : kind == kReduceScatter ? "reduce-scatter"
         : kind == kAlltoall      ? "alltoall"
                                  : "an unknown collective";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpRing>> TcpRing::Connect(
    const ConnectRequest& request, const std::string& address,
    const std::string& name, Clock* clock, tcp::LinkPool* pool,
    bool skip_zero_blocks) {
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
      new TcpRing(name, rank, size, std::move(links).value(), abort_fd, clock,
                  skip_zero_blocks));
}

TcpRing::TcpRing(std::string name, int rank, int size, tcp::LentLinks links,
                 int abort_fd, Clock* clock, bool skip_zero_blocks)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      links_(std::move(links)),
      abort_fd_(abort_fd),
      clock_(clock),
      skip_zero_blocks_(skip_zero_blocks) {}

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
    const std::string detail =
        h.kind == kBroadcast ? absl::StrCat("root ", h.detail)
        : h.kind == kAllgather || h.kind == kAlltoall
            ? absl::StrCat("lengths ", absl::Hex(h.detail))
        : h.kind == kReduceScatter
            ? absl::StrCat("dtype ", h.detail & 0xffu, ", ",
                           ReduceOpName(static_cast<v1::ReduceOp>(
                               h.detail >> 8 & 0xffu)),
                           ", counts ", absl::Hex(h.detail >> 16))
            : absl::StrCat(
                  "dtype ", h.detail & 0xffffu, ", ",
                  ReduceOpName(static_cast<v1::ReduceOp>(h.detail >> 16)));
    return absl::StrCat(KindName(h.kind), " #", h.seq, " of ", h.bytes,
                        " bytes (", detail, ")");
  };
  return Poison(absl::FailedPreconditionError(absl::StrCat(
                    what, ": node rank ", prev, " runs ", describe(theirs),
                    ", this node ", describe(mine),
                    " (the nodes disagree on the order of collectives on this "
                    "communicator)")),
                what);
}

void TcpRing::PlanSend(const Step& step) {
  std::vector<iovec>& out = send_segments_;
  out.clear();
  const auto push = [&out](const void* data, size_t bytes) {
    out.push_back({const_cast<void*>(data), bytes});
  };
  if (step.send_header) push(step.header, sizeof(Header));
  if (!step.framed) {
    if (step.send_bytes > 0) push(step.send, step.send_bytes);
    return;
  }
  const size_t bytes = step.send_bytes;
  bool sparse = false;
  size_t present = 0;
  if (skip_zero_blocks_ && !step.dense && bytes > 0) {
    present = ZeroBlocks::Scan(step.send, bytes, &send_bitmap_);
    sparse = ZeroBlocks::WorthSkipping(bytes, present);
  }
  if (!sparse) {
    send_preamble_ = {kDenseFrame, 0};
    push(&send_preamble_, sizeof send_preamble_);
    if (bytes > 0) push(step.send, bytes);
    return;
  }
  send_preamble_ = {kSparseFrame, static_cast<uint32_t>(present)};
  push(&send_preamble_, sizeof send_preamble_);
  push(send_bitmap_.data(), send_bitmap_.size());
  // Runs of consecutive blocks go as one segment.
  const size_t count = ZeroBlocks::Count(bytes);
  size_t sent = 0;
  const auto marked = [this](size_t b) {
    return (send_bitmap_[b / 8] >> (b % 8) & 1) != 0;
  };
  for (size_t b = 0; b < count;) {
    if (!marked(b)) {
      ++b;
      continue;
    }
    size_t e = b + 1;
    while (e < count && marked(e)) ++e;
    const size_t from = b * ZeroBlocks::kBlockBytes;
    const size_t to = std::min(e * ZeroBlocks::kBlockBytes, bytes);
    push(step.send + from, to - from);
    sent += to - from;
    b = e;
  }
  skipped_bytes_ += bytes - sent - send_bitmap_.size();
}

void TcpRing::ScatterBlocks(const Step& step, size_t at, size_t bytes) {
  size_t k = at / ZeroBlocks::kBlockBytes;
  for (size_t done = 0; done < bytes; ++k) {
    const size_t block = recv_blocks_[k];
    const size_t length = ZeroBlocks::Length(step.recv_bytes, block);
    const size_t to = block * ZeroBlocks::kBlockBytes;
    if (step.sum != nullptr) {
      step.sum(step.recv + to, step.addend + to, scratch_.data() + done,
               length / step.element);
    } else {
      std::memcpy(step.recv + to, scratch_.data() + done, length);
    }
    done += length;
  }
}

void TcpRing::FillSkippedBlocks(const Step& step) {
  const size_t count = ZeroBlocks::Count(step.recv_bytes);
  size_t next_present = 0;
  for (size_t block = 0; block < count; ++block) {
    if (next_present < recv_blocks_.size() &&
        recv_blocks_[next_present] == block) {
      ++next_present;
      continue;
    }
    const size_t at = block * ZeroBlocks::kBlockBytes;
    const size_t length = ZeroBlocks::Length(step.recv_bytes, block);
    if (step.sum == nullptr) {
      std::memset(step.recv + at, 0, length);
    } else if (step.recv != step.addend) {
      std::memcpy(step.recv + at, step.addend + at, length);
    }
  }
}

absl::Status TcpRing::MalformedFrame(const std::string& detail,
                                     const std::string& what) {
  tcp::ShutDown(prev());
  tcp::ShutDown(next());
  return Poison(absl::InternalError(absl::StrCat(
                    what, ": node rank ", Wrap(rank_ - 1),
                    " sent a step that cannot be: ", detail,
                    " (the stream is out of step; the nodes must run one "
                    "build of baton)")),
                what);
}

absl::Status TcpRing::Run(const Step& step, const Deadline& deadline,
                          const std::string& what,
                          const CollectiveOptions& options) {
  const int prev = Wrap(rank_ - 1);
  const int next = Wrap(rank_ + 1);
  tcp::Link& from = this->prev();
  tcp::Link& to = this->next();

  // Sending: send_segments_ in order, `sent` bytes of them so far (a relay
  // only as far as it has received).
  PlanSend(step);
  size_t total = 0;
  for (const iovec& segment : send_segments_) total += segment.iov_len;
  const size_t header_bytes = step.send_header ? sizeof(Header) : 0;
  size_t sent = 0;
  size_t segment = 0;  // the segment `sent` is in, and how far into it
  size_t within = 0;

  // Receiving: the header, the preamble and bitmap of a framed step, then
  // the data: `data_bytes` in all (a sparse step's blocks only), of which
  // `received` arrived; with a sum, or sparse, through scratch_ (`filled`
  // bytes not yet added or placed).
  enum class Stage { kHeader, kPreamble, kBitmap, kData, kDone };
  const auto data_stage = [&](size_t bytes) {
    return bytes > 0 ? Stage::kData : Stage::kDone;
  };
  Stage stage = step.recv_header ? Stage::kHeader
                : step.framed    ? Stage::kPreamble
                                 : data_stage(step.recv_bytes);
  Header theirs = {};
  Preamble preamble = {};
  size_t stage_received = 0;  // of the header, preamble or bitmap
  bool sparse = false;
  size_t data_bytes = step.recv_bytes;
  size_t received = 0;
  size_t filled = 0;
  if (step.framed) recv_blocks_.clear();

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
    const size_t send_limit = step.forward ? header_bytes + received : total;
    if (sent < send_limit) {
      iovec batch[kSendBatch];
      int count = 0;
      size_t room = send_limit - sent;
      for (size_t i = segment, skip = within;
           i < send_segments_.size() && count < kSendBatch && room > 0;
           ++i, skip = 0) {
        const size_t length = std::min(send_segments_[i].iov_len - skip, room);
        batch[count++] = {
            static_cast<uint8_t*>(send_segments_[i].iov_base) + skip, length};
        room -= length;
      }
      const ssize_t n = tcp::SendVector(to, batch, count);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        for (size_t left = static_cast<size_t>(n); left > 0;) {
          const size_t take =
              std::min(left, send_segments_[segment].iov_len - within);
          within += take;
          left -= take;
          if (within == send_segments_[segment].iov_len) {
            ++segment;
            within = 0;
          }
        }
        progress = true;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return fail(to, next, "sending", "send");
      }
    }

    ssize_t n = 1;
    const bool receiving = stage != Stage::kDone;
    // Reads on into the header, preamble or bitmap: true once it is whole.
    const auto whole = [&](void* into, size_t size) {
      n = tcp::Receive(from, static_cast<char*>(into) + stage_received,
                       size - stage_received);
      if (n <= 0 || (stage_received += static_cast<size_t>(n)) < size) {
        return false;
      }
      stage_received = 0;
      return true;
    };
    switch (stage) {
      case Stage::kHeader:
        if (whole(&theirs, sizeof(Header))) {
          if (std::memcmp(&theirs, step.header, sizeof(Header)) != 0) {
            return HeaderMismatch(*step.header, theirs, what);
          }
          stage = step.framed ? Stage::kPreamble : data_stage(step.recv_bytes);
        }
        break;
      case Stage::kPreamble:
        if (whole(&preamble, sizeof(Preamble))) {
          if (preamble.format == kDenseFrame && preamble.blocks == 0) {
            stage = data_stage(step.recv_bytes);
          } else if (preamble.format == kSparseFrame &&
                     preamble.blocks <= ZeroBlocks::Count(step.recv_bytes)) {
            sparse = true;
            recv_bitmap_.resize(ZeroBlocks::BitmapBytes(step.recv_bytes));
            stage = recv_bitmap_.empty() ? Stage::kDone : Stage::kBitmap;
          } else {
            return MalformedFrame(
                absl::StrCat("a preamble of format ", preamble.format, " with ",
                             preamble.blocks, " blocks for ", step.recv_bytes,
                             " bytes"),
                what);
          }
        }
        break;
      case Stage::kBitmap:
        if (whole(recv_bitmap_.data(), recv_bitmap_.size())) {
          absl::StatusOr<std::vector<uint32_t>> blocks = ZeroBlocks::Present(
              recv_bitmap_, step.recv_bytes, preamble.blocks);
          if (!blocks.ok()) {
            return MalformedFrame(std::string(blocks.status().message()), what);
          }
          recv_blocks_ = std::move(blocks).value();
          data_bytes = 0;
          for (uint32_t block : recv_blocks_) {
            data_bytes += ZeroBlocks::Length(step.recv_bytes, block);
          }
          stage = data_stage(data_bytes);
        }
        break;
      case Stage::kData:
        // Exactly this step's bytes: the next step's may follow.
        if (step.sum == nullptr && !sparse) {
          n = tcp::Receive(from, step.recv + received,
                           step.recv_bytes - received);
          if (n > 0) received += static_cast<size_t>(n);
        } else {
          const size_t room =
              std::min(kSegmentBytes - filled, data_bytes - received);
          n = tcp::Receive(from, scratch_.data() + filled, room);
          if (n > 0) {
            filled += static_cast<size_t>(n);
            received += static_cast<size_t>(n);
            if (filled == kSegmentBytes || received == data_bytes) {
              const size_t at = received - filled;
              if (sparse) {
                ScatterBlocks(step, at, filled);
              } else {
                step.sum(step.recv + at, step.addend + at, scratch_.data(),
                         filled / step.element);
              }
              filled = 0;
            }
          }
        }
        if (received == data_bytes) stage = Stage::kDone;
        break;
      case Stage::kDone:
        break;
    }
    if (receiving && n > 0) {
      progress = true;
      // A sparse step's last block is in: the others are known now.
      if (sparse && stage == Stage::kDone) FillSkippedBlocks(step);
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
    const bool recv_done = stage == Stage::kDone;
    if (sent == total && recv_done) return absl::OkStatus();
    if (progress && !poison_.is_set()) continue;

    // Nothing moved: sleep until a connection is ready or Abort.
    const short send_events = sent < send_limit ? POLLOUT : 0;
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
      return Poison(
          absl::DeadlineExceededError(absl::StrCat(
              what, " timed out after ", options.timeout.count(), " ms ",
              !recv_done
                  ? absl::StrCat("waiting for node rank ", prev, " (received ",
                                 received, " of ", data_bytes, " bytes)")
                  : absl::StrCat("sending to node rank ", next, " (sent ", sent,
                                 " of ", total, " bytes)"))),
          what);
    }
  }
}

absl::Status TcpRing::Allreduce(void* data, size_t count, v1::DataType dtype,
                                const CollectiveOptions& options) {
  if (absl::Status valid =
          poison_.CheckAllreduce(data, count, dtype, options, Describe());
      !valid.ok()) {
    return valid;
  }
  if (count == 0) return absl::OkStatus();
  const size_t element = ElementSize(dtype);
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
      absl::StrCat(AllreduceName(options.op), " of ", count * element,
                   " bytes (", DataTypeName(dtype), ") on ", Describe());
  if (scratch_.empty()) scratch_.resize(kSegmentBytes);
  // Nodes that disagree on the dtype or the op fail at the first step.
  const Header header = {
      kMagic, kAllreduce, count * element,
      static_cast<uint32_t>(dtype) | static_cast<uint32_t>(options.op) << 16,
      seq_++};
  const Deadline deadline(*clock_, absl::FromChrono(options.timeout));
  // Chunk c: elements [begin(c), begin(c + 1)).
  const size_t base = count / size_;
  const size_t extra = count % size_;
  const auto begin = [&](int c) {
    return base * c + std::min<size_t>(c, extra);
  };
  const auto offset = [&](int c) { return begin(c) * element; };
  const auto length = [&](int c) { return offset(c + 1) - offset(c); };
  std::vector<size_t> offsets(size_ + 1);
  for (int c = 0; c <= size_; ++c) offsets[c] = offset(c);
  // The reduce-scatter steps leave chunk r + 1 finished here.
  if (absl::Status status =
          ReduceSteps(header, bytes, input, offsets,
                      /*shift=*/0, dtype, deadline, what, options);
      !status.ok()) {
    return status;
  }
  for (int s = 0; s < size_ - 1; ++s) {
    // Allgather: the finished chunk r + 1 - s goes on, chunk r - s comes
    // in finished.
    const int out = Wrap(rank_ + 1 - s);
    const int in = Wrap(rank_ - s);
    Step step;
    step.header = &header;
    step.element = element;
    step.framed = true;
    step.send = bytes + offset(out);
    step.send_bytes = length(out);
    step.recv = bytes + offset(in);
    step.recv_bytes = length(in);
    if (absl::Status status = Run(step, deadline, what, options);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status TcpRing::ReduceSteps(const Header& header, uint8_t* bytes,
                                  const uint8_t* input,
                                  absl::Span<const size_t> offsets, int shift,
                                  v1::DataType dtype, const Deadline& deadline,
                                  const std::string& what,
                                  const CollectiveOptions& options) {
  const size_t element = ElementSize(dtype);
  const PairwiseSum sum = PairwiseFor(options.op, dtype);
  const auto length = [&](int c) { return offsets[c + 1] - offsets[c]; };
  for (int s = 0; s < size_ - 1; ++s) {
    // Chunk r + shift - s goes on (the input's at the first step, then the
    // sum received the step before), chunk r + shift - s - 1 comes in and
    // is added to the input's into the result. The input is only read.
    const int out = Wrap(rank_ + shift - s);
    const int in = Wrap(rank_ + shift - s - 1);
    Step step;
    step.header = &header;
    step.send_header = step.recv_header = s == 0;
    step.element = element;
    step.framed = true;
    step.send = (s == 0 ? input : bytes) + offsets[out];
    step.send_bytes = length(out);
    step.recv = bytes + offsets[in];
    step.recv_bytes = length(in);
    step.sum = sum;
    step.addend = input + offsets[in];
    step.dense = options.op != v1::REDUCE_OP_SUM;
    if (absl::Status status = Run(step, deadline, what, options);
        !status.ok()) {
      return status;
    }
  }
  // This node finished chunk r + 1 + shift: it alone divides it.
  if (options.divisor > 1) {
    const int done = Wrap(rank_ + 1 + shift);
    DivideInPlace(dtype, bytes + offsets[done], length(done) / element,
                  options.divisor);
  }
  return absl::OkStatus();
}

absl::Status TcpRing::ReduceScatter(void* data, absl::Span<const size_t> counts,
                                    v1::DataType dtype,
                                    const CollectiveOptions& options) {
  if (absl::Status valid = poison_.CheckReduceScatter(
          data, counts, dtype, size_, options, Describe());
      !valid.ok()) {
    return valid;
  }
  const size_t element = ElementSize(dtype);
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) {
    offsets[i + 1] = offsets[i] + counts[i] * element;
  }
  auto* bytes = static_cast<uint8_t*>(data);
  const auto* input = options.input == nullptr
                          ? bytes
                          : static_cast<const uint8_t*>(options.input);
  if (size_ == 1) {
    if (input != bytes) std::memcpy(bytes, input, offsets.back());
    if (options.divisor > 1) {
      DivideInPlace(dtype, bytes, counts[0], options.divisor);
    }
    return absl::OkStatus();
  }
  if (offsets.back() == 0) return absl::OkStatus();
  const std::string what = absl::StrCat(
      "reduce-scatter (", ReduceOpName(options.op), ") of ", offsets.back(),
      " bytes (", DataTypeName(dtype), ") on ", Describe());
  if (scratch_.empty()) scratch_.resize(kSegmentBytes);
  // Nodes that disagree on the dtype, the op or the counts fail at the
  // first step.
  const Header header = {kMagic, kReduceScatter, offsets.back(),
                         static_cast<uint32_t>(dtype) |
                             static_cast<uint32_t>(options.op) << 8 |
                             (LengthsHash(counts) & 0xffffu) << 16,
                         seq_++};
  // Shifted by one from the allreduce's, so that this node ends with its
  // own chunk.
  return ReduceSteps(header, bytes, input, offsets, /*shift=*/-1, dtype,
                     Deadline(*clock_, absl::FromChrono(options.timeout)), what,
                     options);
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

absl::Status TcpRing::Allgather(void* data, absl::Span<const size_t> lengths,
                                const CollectiveOptions& options) {
  if (absl::Status valid =
          poison_.CheckAllgather(data, lengths, size_, options, Describe());
      !valid.ok()) {
    return valid;
  }
  std::vector<size_t> offsets(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    offsets[i + 1] = offsets[i] + lengths[i];
  }
  const size_t total = offsets.back();
  if (size_ == 1 || total == 0) return absl::OkStatus();
  const std::string what =
      absl::StrCat("allgather of ", total, " bytes on ", Describe());
  // Sparse steps arrive through it.
  if (scratch_.empty()) scratch_.resize(kSegmentBytes);
  // Every node checks its previous node's header, lengths included.
  const Header header = {kMagic, kAllgather, total, LengthsHash(lengths),
                         seq_++};
  const Deadline deadline(*clock_, absl::FromChrono(options.timeout));
  auto* bytes = static_cast<uint8_t*>(data);
  for (int s = 0; s < size_ - 1; ++s) {
    // Chunk r - s goes on (this node's own at the first step), chunk
    // r - s - 1 comes in.
    const int out = Wrap(rank_ - s);
    const int in = Wrap(rank_ - s - 1);
    Step step;
    step.header = &header;
    step.send_header = step.recv_header = s == 0;
    step.framed = true;
    step.send = bytes + offsets[out];
    step.send_bytes = lengths[out];
    step.recv = bytes + offsets[in];
    step.recv_bytes = lengths[in];
    if (absl::Status status = Run(step, deadline, what, options);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status TcpRing::Alltoall(const void* send, void* recv,
                               absl::Span<const size_t> lengths,
                               const CollectiveOptions& options) {
  if (absl::Status valid = poison_.CheckAlltoall(send, recv, lengths, rank_,
                                                 size_, options, Describe());
      !valid.ok()) {
    return valid;
  }
  const size_t n = static_cast<size_t>(size_);
  const auto length = [&](int from, int to) {
    return lengths[static_cast<size_t>(from) * n + static_cast<size_t>(to)];
  };
  // Where this node's chunk for d sits in `send`, and where the chunk from
  // s goes in `recv`.
  std::vector<size_t> send_at(n, 0);
  std::vector<size_t> recv_at(n, 0);
  size_t total = 0;
  size_t widest = 0;  // the most one node sends
  for (int s = 0; s < size_; ++s) {
    size_t row = 0;
    for (int d = 0; d < size_; ++d) row += length(s, d);
    widest = std::max(widest, row);
    total += row;
  }
  for (int i = 1; i < size_; ++i) {
    send_at[i] = send_at[i - 1] + length(rank_, i - 1);
    recv_at[i] = recv_at[i - 1] + length(i - 1, rank_);
  }
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (length(rank_, rank_) > 0) {
    std::memcpy(out + recv_at[rank_], in + send_at[rank_],
                length(rank_, rank_));
  }
  if (size_ == 1 || total == 0) return absl::OkStatus();
  const std::string what =
      absl::StrCat("alltoall of ", total, " bytes on ", Describe());
  if (scratch_.empty()) scratch_.resize(kSegmentBytes);
  for (std::vector<uint8_t>& relay : relay_) {
    if (relay.size() < widest) relay.resize(widest);
  }
  // The first step sends this node's chunks for the nodes after it, in
  // ring order.
  uint8_t* sending = relay_[0].data();
  size_t send_bytes = 0;
  for (int k = 1; k < size_; ++k) {
    const int d = Wrap(rank_ + k);
    std::memcpy(sending + send_bytes, in + send_at[d], length(rank_, d));
    send_bytes += length(rank_, d);
  }
  const Header header = {kMagic, kAlltoall, total, LengthsHash(lengths),
                         seq_++};
  const Deadline deadline(*clock_, absl::FromChrono(options.timeout));
  for (int k = 1; k < size_; ++k) {
    // Node r - k's chunks for this node and the N - k - 1 after it come
    // in; the first is this node's, the rest go on at the next step.
    const int from = Wrap(rank_ - k);
    uint8_t* receiving = relay_[k % 2].data();
    size_t recv_bytes = 0;
    for (int j = 0; j < size_ - k; ++j) {
      recv_bytes += length(from, Wrap(rank_ + j));
    }
    Step step;
    step.header = &header;
    step.send_header = step.recv_header = k == 1;
    step.framed = true;
    step.send = sending;
    step.send_bytes = send_bytes;
    step.recv = receiving;
    step.recv_bytes = recv_bytes;
    if (absl::Status status = Run(step, deadline, what, options);
        !status.ok()) {
      return status;
    }
    const size_t mine = length(from, rank_);
    if (mine > 0) std::memcpy(out + recv_at[from], receiving, mine);
    sending = receiving + mine;
    send_bytes = recv_bytes - mine;
  }
  return absl::OkStatus();
}

}  // namespace baton::agent
