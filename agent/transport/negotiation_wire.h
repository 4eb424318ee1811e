#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/collective_options.h"

namespace baton::agent {

// The scheduler's negotiation between the nodes of one generation (the
// ordering contract, docs/architecture.md): rounds of an element-wise
// minimum over small int64 vectors (max is min of the negation) that any
// member may start before the others have anything to add, so that nobody
// polls. TcpRounds carries them over TCP; the scheduler's tests also run on
// an in-process fake.
//
// A member with something to add calls ExchangeMin at once. A member with
// nothing to add waits in AwaitRound, which returns true as soon as a peer
// has started the next round (the member then joins it with ExchangeMin)
// and false once Interrupt() was called (the member has news of its own, or
// is stopping). Every member calls ExchangeMin exactly once per round, all
// with the same count; AwaitRound gets the coming round's count.
//
// One thread at a time calls ExchangeMin and AwaitRound; Interrupt, Abort
// and poisoned may be called from any thread. A failed round poisons the
// wire: the failing call returns the error naming the node, and every later
// call returns FAILED_PRECONDITION. A poisoned wire is never retried; the
// owner builds a new one.
class NegotiationWire {
 public:
  virtual ~NegotiationWire() = default;

  // This node's index among the nodes and their count.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = min over every member of data[i]; `options.timeout`
  // bounds the round from this member's call (options.tag is unused).
  virtual absl::Status ExchangeMin(int64_t* data, size_t count,
                                   const CollectiveOptions& options) = 0;
  // Waits without a time limit; an error (a peer gone) poisons the wire.
  virtual absl::StatusOr<bool> AwaitRound(size_t count) = 0;
  // Makes the current AwaitRound return false, or the next one if none is
  // waiting. ExchangeMin is not disturbed by it.
  virtual void Interrupt() = 0;
  // Poisons the wire with `status` and ends a round or a wait in progress
  // at once (the data plane stops: the generation changed). The default
  // only interrupts a wait.
  virtual void Abort(const absl::Status& status) {
    (void)status;
    Interrupt();
  }

  virtual bool poisoned() const = 0;
};

}  // namespace baton::agent
