#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/transport/poison_state.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace baton::agent {

// The CPU data plane: gloo over TCP. One TCP device (one event-loop thread)
// bound to the node's data-plane address is shared by every communicator
// this transport connects; each communicator has its own TCP connections.
//
// Thread-safe.
class GlooTransport : public Transport {
 public:
  struct Options {
    // gloo's allreduce segment: the unit of each send/recv, two in flight
    // per peer (gloo allocates 2 segments of scratch per operation). gloo
    // uses min(this, bytes / (2 x nodes)), so it matters only for operations
    // above 2 x nodes x 1 MiB (not for 4 MiB partitions). Measured with
    // GlooBenchmark.DISABLED_Allreduce64MiB (tests/unit/agent/transport/):
    // one 64 MiB float32 allreduce between 2 nodes on loopback took 109 ms
    // with 4 MiB against 117 ms with gloo's 1 MiB default (median of 8
    // runs' medians on a busy 2-core machine; 6 of 8 runs favored 4 MiB).
    size_t max_segment_bytes = size_t{4} << 20;
    // Measures every timeout; must outlive the transport and its
    // communicators.
    Clock* clock = Clock::Real();
  };

  // Binds the TCP device to `hostname` (an IP address, or a name resolving
  // to the interface peers reach this node on; gloo reads no environment
  // variables). Fails with INVALID_ARGUMENT when it cannot be resolved or
  // bound. Also ignores SIGPIPE for the whole process: a peer that closes
  // its connection must give an error on the survivors, not kill them.
  static absl::StatusOr<std::unique_ptr<GlooTransport>> Create(
      const std::string& hostname, Options options);
  static absl::StatusOr<std::unique_ptr<GlooTransport>> Create(
      const std::string& hostname) {
    return Create(hostname, Options());
  }

  ~GlooTransport() override;

  // Connects request.count communicators one after the other, communicator
  // i under "<prefix>/c<i>". `request.timeout` bounds the whole call, with
  // one exception inside gloo: a peer that published its address and then
  // never accepts the connection is waited for up to 5x the time left.
  // Errors: DEADLINE_EXCEEDED naming the node ranks that never published
  // their address; ABORTED (or another code) as the store returned it;
  // UNAVAILABLE when a connection failed; INVALID_ARGUMENT for a bad
  // request. On error no communicator is returned.
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> Connect(
      const ConnectRequest& request) override;

  // The rounds on connections of their own (ConnectTcpNegotiation), on the
  // device's address.
  absl::StatusOr<std::unique_ptr<NegotiationWire>> ConnectNegotiation(
      const ConnectRequest& request) override;

 private:
  GlooTransport(std::shared_ptr<gloo::transport::Device> device,
                std::string address, Options options);

  // Constant after construction. gloo's connectFullMesh takes the device by
  // non-const reference and keeps a copy in each context.
  const std::shared_ptr<gloo::transport::Device> device_;
  // The numeric address the device is bound to.
  const std::string address_;
  const Options options_;
};

// One gloo context: a full mesh of TCP connections among `size()` nodes.
//
// Contract of Communicator, plus:
// - Tags: gloo's tag is CollectiveOptions::tag mixed with the operation's
//   size and data type. gloo silently corrupts data when two operations
//   with the same tag run at once on one context, so concurrent calls
//   (which Communicator forbids anyway) need distinct tags.
// - Timeouts: gloo applies CollectiveOptions::timeout to each send/recv
//   step, not to the whole operation: a peer that stops responding is
//   detected within `timeout`; an operation that keeps progressing slowly
//   can take longer than it in total.
// - Errors: UNAVAILABLE for a connection error (the text names the peer's
//   address), DEADLINE_EXCEEDED for a step that timed out. Nodes that
//   disagree on an operation's size or data type fail it (usually with a
//   timeout) rather than exchange mismatched data.
// - poisoned() may be called from any thread.
class GlooCommunicator : public Communicator {
 public:
  // `context` is connected; `name` identifies the communicator in errors
  // ("c1").
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::string name,
                   size_t max_segment_bytes);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status Allreduce(void* data, size_t count, v1::DataType dtype,
                         const CollectiveOptions& options) override;
  absl::Status Broadcast(void* data, size_t bytes, int root,
                         const CollectiveOptions& options) override;
  // gloo::allgatherv.
  absl::Status Allgather(void* data, absl::Span<const size_t> lengths,
                         const CollectiveOptions& options) override;
  // gloo::alltoallv.
  absl::Status Alltoall(const void* send, void* recv,
                        absl::Span<const size_t> lengths,
                        const CollectiveOptions& options) override;

  bool poisoned() const override { return poison_.is_set(); }

 private:
  // Runs `op` (a gloo call), turning any exception into a status that
  // starts with `what`, and poisons the communicator on error.
  template <typename Op>
  absl::Status Run(const std::string& what, Op&& op);
  // "communicator c1 of 3 nodes (node rank 0)".
  std::string Describe() const;

  // Constant after construction.
  const std::shared_ptr<gloo::Context> context_;
  const std::string name_;
  const int rank_;
  const int size_;
  const size_t max_segment_bytes_;

  PoisonState poison_;
};

}  // namespace baton::agent
