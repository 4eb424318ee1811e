#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "agent/transport/collective_options.h"
#include "agent/transport/key_value_store.h"
#include "agent/transport/negotiation_choice.h"
#include "agent/transport/negotiation_wire.h"
#include "baton/v1/common.pb.h"

namespace baton::agent {

// One connected group of nodes carrying collectives (one TCP ring, one gloo
// context, one NCCL communicator). The scheduler's negotiation rounds have
// an interface of their own (NegotiationWire).
//
// Not thread-safe: one thread at a time calls its collectives. A failed
// collective poisons the communicator: the failing call returns the error
// (naming the operation and, where the transport knows it, the peer), the
// connections are closed so that peers blocked on this node fail promptly
// instead of waiting for their timeout, and every later call returns
// FAILED_PRECONDITION. A poisoned communicator is never retried; the owner
// builds a new one.
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This node's index in the group and the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = options.op over every member of data[i] (a sum
  // unless the options say otherwise). FLOAT16 and BFLOAT16 are combined in
  // float32 and rounded once per step. An op that does not apply to the
  // dtype (reduce.h, ReduceOpApplies) fails with INVALID_ARGUMENT.
  virtual absl::Status Allreduce(void* data, size_t count, v1::DataType dtype,
                                 const CollectiveOptions& options) = 0;

  // In place: every member gets `root`'s `bytes` bytes at data.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root,
                                 const CollectiveOptions& options) = 0;

  // In place: member i's `lengths[i]` bytes (any of them may be 0) sit in
  // `data` at the sum of lengths[0..i), this member's own already there;
  // afterwards every member holds all of them. `lengths` has size() entries
  // and is the same on every member (members that disagree fail). The
  // default: UNIMPLEMENTED naming the transport.
  virtual absl::Status Allgather(void* data, absl::Span<const size_t> lengths,
                                 const CollectiveOptions& options);

  // In place: member i's chunk, `counts[i]` elements of `dtype` at the sum
  // of counts[0..i), becomes options.op over every member's data of that
  // chunk (divided by options.divisor), read from options.input when set;
  // the rest of `data` is left unspecified. `counts` has size() entries and
  // is the same on every member (members that disagree fail). The default
  // allreduces the whole buffer (every chunk is reduced, at twice the
  // bytes of a reduce-scatter).
  virtual absl::Status ReduceScatter(void* data,
                                     absl::Span<const size_t> counts,
                                     v1::DataType dtype,
                                     const CollectiveOptions& options);

  // Every member sends every member a chunk of its own: member s's chunk
  // for member d is lengths[s * size() + d] bytes (any of them may be 0).
  // `send` holds this member's chunks in member order (chunk d at the sum
  // of its row before d); `recv` receives the chunks for this member in
  // member order (chunk s at the sum of its column before s), this
  // member's own included. `lengths` has size() * size() entries and is
  // the same on every member (members that disagree fail); send and recv
  // do not overlap. The default: UNIMPLEMENTED naming the transport.
  virtual absl::Status Alltoall(const void* send, void* recv,
                                absl::Span<const size_t> lengths,
                                const CollectiveOptions& options);

  virtual bool poisoned() const = 0;

  // Bytes of data its allreduces did not need to send since it connected
  // (TcpRing: blocks that were all zero). Read by the thread that runs its
  // collectives. 0 for transports that send every byte.
  virtual uint64_t skipped_bytes() const { return 0; }

  // Thread-safe, callable while another thread is inside a collective:
  // poisons the communicator with `status` and makes a collective in flight
  // fail at once, instead of waiting for peers that may never come (the
  // data plane calls it when it stops on a generation change). The default
  // does nothing: the collective ends at its timeout (gloo).
  virtual void Abort(const absl::Status& status) { (void)status; }
};

// Data-plane connections kept from an earlier generation, and made anew.
struct LinkCounts {
  int64_t kept = 0;
  int64_t made = 0;
};

// What a node connects for one generation's data plane: the scheduler's
// negotiation and the data communicators.
struct DataConnections {
  std::unique_ptr<NegotiationWire> negotiation;
  std::vector<std::unique_ptr<Communicator>> data;
  // Connections kept and made for these (the difference of
  // Transport::link_counts; on an agent running several jobs, others'
  // connects in the meantime count too).
  LinkCounts links;
};

// What a node needs to connect its communicators for one (generation, epoch).
struct ConnectRequest {
  // This node's rank among `num_nodes` (node ranks from the membership).
  int node_rank = 0;
  int num_nodes = 1;
  // Keys of this connection live under this prefix in `store`; a prefix is
  // never reused (generation and rebuild epoch are part of it).
  std::string prefix;
  std::shared_ptr<KeyValueStore> store;
  // Communicators to connect; each is its own set of TCP connections.
  int count = 1;
  // Bounds connecting (waiting for peers' addresses and connecting to them).
  std::chrono::milliseconds timeout{60000};
  // Connections made under one key ("<job>/data") are kept for the next
  // connect under it where both ends kept them (TcpTransport only); empty:
  // every connect makes its own.
  std::string reuse_key;
  // The generation's data-plane secret (Membership.data_plane_secret): every
  // new TCP connection between agents proves it, both ways, before it is
  // used (tcp_introduction.h). Required wherever a connect makes TCP
  // connections of baton's own (TcpTransport, and every transport's
  // negotiation rounds): empty is INVALID_ARGUMENT there, never "no
  // authentication". gloo's pairs and NCCL cannot use it (docs/operations.md,
  // "What the data plane protects").
  std::string secret;
  // Which wire carries the negotiation rounds (ConnectNegotiation only):
  // the same on every node (AgreeOnNegotiation). kAuto is resolved for
  // num_nodes.
  NegotiationChoice negotiation;
};

// INVALID_ARGUMENT naming the field when `request` cannot be connected:
// node rank outside 0..num_nodes-1, count < 1, no store, an empty prefix or a
// timeout that is not positive.
absl::Status ValidateConnectRequest(const ConnectRequest& request);

// The store key of `key` under `prefix`: "<prefix>/<key>" ("<prefix><key>"
// when the prefix is empty or ends in '/').
std::string StoreKey(const std::string& prefix, const std::string& key);

// A setting every node must share, where node rank 0's value holds: node
// rank 0 publishes `mine` under StoreKey(request.prefix, name) and returns
// it; the others read and return what node rank 0 published, waiting up to
// request.timeout (the store's own errors otherwise). The callers parse it
// and say when it differs from their own.
absl::StatusOr<std::string> NodeRankZeroValue(const ConnectRequest& request,
                                              const std::string& name,
                                              const std::string& mine);

// INVALID_ARGUMENT naming `on` unless `lengths` has `size` entries and
// `data` is non-null where they add up to more than 0.
absl::Status CheckAllgatherArguments(const void* data,
                                     absl::Span<const size_t> lengths, int size,
                                     const std::string& on);

// INVALID_ARGUMENT naming `on` unless `counts` has `size` entries whose
// bytes of `dtype` do not overflow, and CheckAllreduceArguments holds for
// their sum.
absl::Status CheckReduceScatterArguments(const void* data,
                                         absl::Span<const size_t> counts,
                                         v1::DataType dtype, int size,
                                         const CollectiveOptions& options,
                                         const std::string& on);

// INVALID_ARGUMENT naming `on` unless `lengths` has `size` * `size`
// entries whose rows and columns add up without overflow, and `send` and
// `recv` are non-null where this member (`rank`) sends or receives bytes.
absl::Status CheckAlltoallArguments(const void* send, const void* recv,
                                    absl::Span<const size_t> lengths, int rank,
                                    int size, const std::string& on);

// Allgather's lengths as its members compare them (TcpRing's header,
// gloo's tag): FNV-1a folded to 32 bits.
uint32_t LengthsHash(absl::Span<const size_t> lengths);

// "allreduce" for a sum, "allreduce (max)" etc. otherwise: how errors name
// an allreduce.
std::string AllreduceName(v1::ReduceOp op);

// The argument checks of every host Allreduce: INVALID_ARGUMENT naming
// `on` (the communicator) for a data type without a reduction, null data
// with elements to reduce, a size in bytes that overflows, or a divisor
// below 1.
absl::Status CheckAllreduceArguments(const void* data, size_t count,
                                     v1::DataType dtype,
                                     const CollectiveOptions& options,
                                     const std::string& on);

// The argument checks of every host Broadcast: INVALID_ARGUMENT naming `on`
// for a root outside 0..size-1, or null data with bytes to send.
absl::Status CheckBroadcastArguments(const void* data, size_t bytes, int root,
                                     int size, const std::string& on);

// "float32" for DATA_TYPE_FLOAT32, for error texts.
std::string DataTypeName(v1::DataType dtype);

// Builds communicators. One per agent process; thread-safe.
class Transport {
 public:
  virtual ~Transport() = default;

  // Connects `request.count` communicators among the nodes. Fails with
  // DEADLINE_EXCEEDED naming the missing peers when they do not show up in
  // time, ABORTED when the store says the generation is over, UNAVAILABLE on
  // a connection error.
  virtual absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> Connect(
      const ConnectRequest& request) = 0;

  // Connects the scheduler's negotiation rounds among the nodes on the wire
  // request.negotiation names; request.count is ignored. Errors like
  // Connect.
  virtual absl::StatusOr<std::unique_ptr<NegotiationWire>> ConnectNegotiation(
      const ConnectRequest& request) = 0;

  // Closes the connections kept under reuse keys starting with `prefix` (a
  // job that ended on this agent). The default keeps none.
  virtual void DropKept(const std::string& prefix) { (void)prefix; }

  // Connections kept from an earlier generation and made anew, since the
  // agent started (both 0 for transports that keep none).
  virtual LinkCounts link_counts() const { return {}; }
};

}  // namespace baton::agent
