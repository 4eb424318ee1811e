#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/key_value_store.h"
#include "baton/v1/common.pb.h"

namespace baton::agent {

// Options every collective takes. The timeout bounds the whole operation; a
// collective that cannot finish in time fails with DEADLINE_EXCEEDED.
struct CollectiveOptions {
  std::chrono::milliseconds timeout{60000};
  // Distinguishes operations that may be in flight at once on one
  // communicator. Callers that use a communicator from one thread may leave
  // it 0.
  uint32_t tag = 0;
  // AllreduceSum only. When set, this node's values are read from here
  // (`count` elements, not overlapping `data` unless equal to it) and `data`
  // only receives the result: an out-of-place allreduce, which spares the
  // caller a copy.
  const void* input = nullptr;
  // AllreduceSum only: the result is the sum divided by this (at least 1;
  // the job's world size for an average). A transport that divides only
  // the part of the result it finished itself (TcpRing) does 1/N of the
  // work of dividing the whole result on every node.
  int64_t divisor = 1;
};

// One connected group of nodes (one gloo context, one NCCL communicator).
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

  // In place: data[i] = sum over every member of data[i]. FLOAT16 and
  // BFLOAT16 are added in float32 and rounded once per addition.
  virtual absl::Status AllreduceSum(void* data, size_t count,
                                    v1::DataType dtype,
                                    const CollectiveOptions& options) = 0;

  // The scheduler's negotiation: rounds of an element-wise minimum over
  // small int64 vectors (max is min of the negation) that any member may
  // start before the others have anything to add, so that nobody polls.
  //
  // A member with something to add calls ExchangeMin at once. A member with
  // nothing to add waits in AwaitRound, which returns true as soon as a peer
  // has started the next round (the member then joins it with ExchangeMin)
  // and false once Interrupt() was called (the member has news of its own,
  // or is stopping). Every member calls ExchangeMin exactly once per round,
  // all with the same count; AwaitRound gets the coming round's count.
  //
  // ExchangeMin: in place, data[i] = min over every member of data[i];
  // `options.timeout` bounds the round from this member's call.
  virtual absl::Status ExchangeMin(int64_t* data, size_t count,
                                   const CollectiveOptions& options) = 0;
  // Waits without a time limit; an error (a peer gone) poisons the
  // communicator like any failed collective.
  virtual absl::StatusOr<bool> AwaitRound(size_t count) = 0;
  // Thread-safe, callable while another thread is inside AwaitRound or
  // ExchangeMin: makes the current AwaitRound return false, or the next
  // one if none is waiting. ExchangeMin is not disturbed by it.
  virtual void Interrupt() = 0;

  // In place: every member gets `root`'s `bytes` bytes at data.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root,
                                 const CollectiveOptions& options) = 0;

  virtual bool poisoned() const = 0;
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
};

// INVALID_ARGUMENT naming the field when `request` cannot be connected:
// node rank outside 0..num_nodes-1, count < 1, no store, an empty prefix or a
// timeout that is not positive.
absl::Status ValidateConnectRequest(const ConnectRequest& request);

// The store key of `key` under `prefix`: "<prefix>/<key>" ("<prefix><key>"
// when the prefix is empty or ends in '/').
std::string StoreKey(const std::string& prefix, const std::string& key);

// The argument checks of every host AllreduceSum: INVALID_ARGUMENT naming
// `on` (the communicator) for a data type without a reduction, null data
// with elements to reduce, a size in bytes that overflows, or a divisor
// below 1.
absl::Status CheckAllreduceArguments(const void* data, size_t count,
                                     v1::DataType dtype,
                                     const CollectiveOptions& options,
                                     const std::string& on);

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

  // Connects the scheduler's negotiation rounds among the nodes: one
  // communicator on which ExchangeMin, AwaitRound and Interrupt work (the
  // collectives do not); request.count is ignored. Errors like Connect.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> ConnectNegotiation(
      const ConnectRequest& request) = 0;
};

}  // namespace baton::agent
