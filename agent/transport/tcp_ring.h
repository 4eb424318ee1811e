#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/reduce.h"
#include "agent/transport/poison_state.h"
#include "agent/transport/tcp_link_pool.h"
#include "agent/transport/tcp_peers.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// Host collectives (AllreduceSum, Broadcast) on TCP connections between ring
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
// AllreduceSum is the ring algorithm: the buffer is cut into one chunk per
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
  static absl::StatusOr<std::unique_ptr<TcpRing>> Connect(
      const ConnectRequest& request, const std::string& address,
      const std::string& name, Clock* clock, tcp::LinkPool* pool);

  ~TcpRing() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllreduceSum(void* data, size_t count, v1::DataType dtype,
                            const CollectiveOptions& options) override;
  absl::Status Broadcast(void* data, size_t bytes, int root,
                         const CollectiveOptions& options) override;
  bool poisoned() const override { return poison_.is_set(); }
  // Thread-safe: a collective in flight fails at once with `status`. The
  // connections stay open (a re-form may keep them).
  void Abort(const absl::Status& status) override;

  // The unit in which received bytes are added (and the scratch's size).
  static constexpr size_t kSegmentBytes = size_t{256} << 10;

 private:
  // What every operation says first.
  struct Header {
    uint32_t magic;
    uint32_t kind;
    uint64_t bytes;
    uint32_t detail;  // data type (allreduce) or root (broadcast)
    uint32_t seq;
  };
  static_assert(sizeof(Header) == 24);

  // One step: send `send_bytes` from `send` to the next node while
  // receiving `recv_bytes` from the previous one into `recv` (with `sum`
  // set: recv = addend + received, where addend may equal recv; else the
  // received bytes themselves). `header`: this operation's header,
  // sent before the data and checked against the one received first.
  // `forward`: a broadcast's relay, which sends what it has received
  // (send == recv), never more.
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
    bool forward = false;
  };

  TcpRing(std::string name, int rank, int size, tcp::LentLinks links,
          int abort_fd, Clock* clock);

  // x mod size_ for x in (-size_, 2 size_): a node rank.
  int Wrap(int x) const;
  tcp::Link& prev() { return links_[Wrap(rank_ - 1)]; }
  tcp::Link& next() { return links_[Wrap(rank_ + 1)]; }

  // "communicator c0 of 3 nodes (node rank 1)".
  std::string Describe() const;
  absl::Status Run(const Step& step, const Deadline& deadline,
                   const std::string& what, const CollectiveOptions& options);
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
  std::vector<uint8_t> scratch_;
  uint32_t seq_ = 0;

  PoisonState poison_;
};

}  // namespace baton::agent
