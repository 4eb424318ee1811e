#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/reduce.h"
#include "agent/transport/poison_state.h"
#include "agent/transport/tcp/tcp_link_pool.h"
#include "agent/transport/tcp/tcp_peers.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// Host collectives (Allreduce, Broadcast) on TCP connections between ring
// neighbours, run entirely by the calling thread, which sleeps in poll(2):
// no event-loop thread, no hand-over per message, no busy polling.
//
// Why not gloo (docs/architecture.md, "Data plane transports"): gloo's TCP
// transport reads every connection on an event-loop thread and hands each
// message to the waiting thread; its epoll is level-triggered and its
// handler only try_locks the connection, so while an application thread is
// inside its own send the loop thread spins, and freeing an operation's
// buffers spins in sched_yield until the loop thread lets go of them. On 2
// cores that CPU comes out of the trainers' backward pass: on ResNet-50 the
// agents spent 3 ms of CPU per MiB of gradients, against 2 ms that DDP's
// gloo adds to a trainer (docs/benchmarks.md).
//
// Allreduce is the ring algorithm: the buffer is cut into one chunk per
// node (on element boundaries); N-1 reduce-scatter steps then N-1 allgather
// steps, each sending one chunk to the next node while receiving another
// from the previous one, so every node sends and receives 2(N-1)/N of the
// bytes. Received bytes that are to be added go through a scratch segment
// of kSegmentBytes and are added as each segment arrives (in float32 for
// FLOAT16 and BFLOAT16, rounded once per addition, like gloo). With
// CollectiveOptions.input the input is only read (no copy into `data`);
// with a divisor each node divides only the chunk it finished, before the
// allgather sends it on. Broadcast is
// a pipeline along the ring from the root: each node forwards what it has
// received while the rest arrives.
//
// Every operation starts with a 24-byte header to the next node (magic,
// collective, bytes, data type or root, sequence number); a node whose
// header differs from its own fails the operation with FAILED_PRECONDITION
// naming both, instead of reading the stream as something it is not.
//
// Each allreduce step's data starts with an 8-byte preamble: either every
// byte follows, or a bitmap of the 1 KiB blocks that are not all zero and
// those blocks only (ZeroBlocks; the sender chooses per step, when at least
// one block in eight is zero). A preamble or bitmap that cannot be fails
// the operation (INTERNAL) and shuts both connections.
//
// Not thread-safe, like every Communicator. Errors name the node ranks and
// poison the ring. A connection that failed is shut down; so are both when
// the neighbours disagree (a header mismatch: the streams are out of step).
// Otherwise the connections stay as they are, so that survivors can keep
// them through a re-form (tcp::LinkPool): a neighbour blocked on this node
// ends when its own data plane aborts it (the generation changed) or at its
// timeout.
class TcpRing : public Communicator {
 public:
  // Connects communicator `name` ("c0") of `request` (request.count is
  // ignored): keys under "<prefix>/ring/<name>/<rank>", connections to the
  // previous and the next node rank only, kept in `pool` (may be null)
  // across generations. Errors as tcp::ConnectPeers. `clock` measures every
  // timeout; it must outlive the ring, and `pool` the ring's end.
  // `skip_zero_blocks`: allreduce steps may leave out the blocks that are
  // all zero (ZeroBlocks); what it receives, a ring reads either way.
  static absl::StatusOr<std::unique_ptr<TcpRing>> Connect(
      const ConnectRequest& request, const std::string& address,
      const std::string& name, Clock* clock, tcp::LinkPool* pool,
      bool skip_zero_blocks = true);

  ~TcpRing() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status Allreduce(void* data, size_t count, v1::DataType dtype,
                         const CollectiveOptions& options) override;
  absl::Status Broadcast(void* data, size_t bytes, int root,
                         const CollectiveOptions& options) override;
  // N-1 steps, each passing on the chunk received the step before (this
  // node's own first), in blocks whose zeros are left out as an
  // allreduce's are. Nodes whose lengths differ fail at the first step.
  absl::Status Allgather(void* data, absl::Span<const size_t> lengths,
                         const CollectiveOptions& options) override;
  // The allreduce's first N-1 steps, shifted so that each node ends with
  // its own chunk: half the bytes of an allreduce.
  absl::Status ReduceScatter(void* data, absl::Span<const size_t> counts,
                             v1::DataType dtype,
                             const CollectiveOptions& options) override;
  // A relay along the ring in N-1 steps: at step k each node passes on
  // what node r - k + 1 sent for the nodes after this one (its own chunks
  // at the first step), keeping the chunk meant for itself of what it
  // receives; each link carries N(N-1)/2 chunks, in blocks whose zeros are
  // left out as an allgather's are. Nodes whose lengths differ fail at the
  // first step.
  absl::Status Alltoall(const void* send, void* recv,
                        absl::Span<const size_t> lengths,
                        const CollectiveOptions& options) override;
  bool poisoned() const override { return poison_.is_set(); }
  // Thread-safe: a collective in flight fails at once with `status`. The
  // connections stay open (a re-form may keep them).
  void Abort(const absl::Status& status) override;

  // What its allreduce steps left out: the zero blocks, less the bitmaps.
  uint64_t skipped_bytes() const override { return skipped_bytes_; }

  // The unit in which received bytes are added (and the scratch's size).
  static constexpr size_t kSegmentBytes = size_t{256} << 10;

 private:
  // What every operation says first.
  struct Header {
    uint32_t magic;
    uint32_t kind;
    uint64_t bytes;
    // Data type and op (allreduce), root (broadcast), a hash of the
    // lengths (allgather, alltoall), data type, op and 16 bits of the
    // counts' hash (reduce-scatter).
    uint32_t detail;
    uint32_t seq;
  };
  static_assert(sizeof(Header) == 24);

  // What an allreduce step's data starts with (ZeroBlocks): the format,
  // and for kSparseFrame the number of blocks that follow the bitmap.
  struct Preamble {
    uint32_t format;
    uint32_t blocks;
  };
  static_assert(sizeof(Preamble) == 8);

  // One step: send `send_bytes` from `send` to the next node while
  // receiving `recv_bytes` from the previous one into `recv` (with `sum`
  // set: recv = addend + received, where addend may equal recv; else the
  // received bytes themselves). `header`: this operation's header,
  // sent before the data and checked against the one received first.
  // `framed`: an allreduce step, whose data goes in blocks (a preamble,
  // then every byte or only the blocks that are not all zero, each side
  // choosing for what it sends). `forward`: a broadcast's relay, which
  // sends what it has received (send == recv), never more.
  struct Step {
    const uint8_t* send = nullptr;
    size_t send_bytes = 0;
    uint8_t* recv = nullptr;
    size_t recv_bytes = 0;
    PairwiseSum sum = nullptr;
    const uint8_t* addend = nullptr;
    size_t element = 1;
    const Header* header = nullptr;
    bool send_header = false;
    bool recv_header = false;
    bool framed = false;
    // Never sparse: a block of zeros left out is only the identity of a sum
    // (the receiver then keeps its addend).
    bool dense = false;
    bool forward = false;
  };

  TcpRing(std::string name, int rank, int size, tcp::LentLinks links,
          int abort_fd, Clock* clock, bool skip_zero_blocks);

  // x mod size_ for x in (-size_, 2 size_): a node rank.
  int Wrap(int x) const;
  tcp::Link& prev() { return links_[Wrap(rank_ - 1)]; }
  tcp::Link& next() { return links_[Wrap(rank_ + 1)]; }

  // "communicator c0 of 3 nodes (node rank 1)".
  std::string Describe() const;
  // The ring's reduce-scatter steps over the chunks between `offsets`
  // (size_ + 1 byte offsets): afterwards this node holds chunk
  // r + 1 + shift reduced over every node (divided by options.divisor);
  // `input` (may be `bytes`) is only read.
  absl::Status ReduceSteps(const Header& header, uint8_t* bytes,
                           const uint8_t* input,
                           absl::Span<const size_t> offsets, int shift,
                           v1::DataType dtype, const Deadline& deadline,
                           const std::string& what,
                           const CollectiveOptions& options);
  absl::Status Run(const Step& step, const Deadline& deadline,
                   const std::string& what, const CollectiveOptions& options);
  // Fills send_segments_ with what `step` sends, in order: the header,
  // then its data, framed for an allreduce step (sparse when
  // skip_zero_blocks_ and ZeroBlocks::WorthSkipping).
  void PlanSend(const Step& step);
  // A sparse step's received blocks [at, at + bytes) of the data (whole
  // blocks, in scratch_): added to the addend or copied to their places.
  void ScatterBlocks(const Step& step, size_t at, size_t bytes);
  // After a sparse step's last block: the blocks that were not sent are
  // the addend's (sum) or zero.
  void FillSkippedBlocks(const Step& step);
  // The previous node sent a preamble or bitmap that cannot be: the
  // streams are out of step.
  absl::Status MalformedFrame(const std::string& detail,
                              const std::string& what);
  // Records `status` as the poison and returns it; after an Abort, the
  // abort's status instead, prefixed with `what` (the operation it ended).
  absl::Status Poison(absl::Status status, const std::string& what);
  // Poison after an I/O error on `link`: that connection is shut down.
  absl::Status PoisonLink(tcp::Link& link, absl::Status status,
                          const std::string& what);
  absl::Status HeaderMismatch(const Header& mine, const Header& theirs,
                              const std::string& what);

  const std::string name_;
  const int rank_;
  const int size_;
  // By node rank: the previous and the next node's links (one link when
  // there are two nodes; none for a single node). Given back to the pool, or
  // closed, by the destructor.
  tcp::LentLinks links_;
  // An eventfd: Abort adds to it, a collective in flight wakes on it.
  const int abort_fd_;
  Clock* const clock_;
  // Whether allreduce steps may leave out zero blocks (ZeroBlocks).
  const bool skip_zero_blocks_;
  std::vector<uint8_t> scratch_;
  // Alltoall's relay: what a step sends and what it receives, swapped
  // after each step.
  std::vector<uint8_t> relay_[2];
  uint32_t seq_ = 0;
  uint64_t skipped_bytes_ = 0;
  // Run's buffers, kept between steps: the segments it sends, the preamble
  // and bitmap among them, and the received bitmap and the blocks it marks.
  std::vector<iovec> send_segments_;
  Preamble send_preamble_ = {};
  std::vector<uint8_t> send_bitmap_;
  std::vector<uint8_t> recv_bitmap_;
  std::vector<uint32_t> recv_blocks_;

  PoisonState poison_;
};

}  // namespace baton::agent
