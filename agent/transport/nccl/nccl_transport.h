#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/transport/device_communicator.h"
#include "agent/transport/nccl/gpu_api.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// The GPU data plane: NCCL, one rank per local device. The unique id of
// each NCCL group travels through the rendezvous store; initialization is
// NCCL's non-blocking kind, polled, so that a missing peer ends in a
// timeout (and an aborted initialization) instead of a hang.
//
// Store keys, under ConnectRequest::prefix (give the NCCL transport a
// prefix of its own per generation and rebuild, as for gloo):
//   nccl/devices/<node rank>        this node's device count
//   nccl/c<i>/unique_id             NCCL's unique id (128 bytes), by node 0
//   nccl/c<i>/started/<node rank>   set just before initializing
//
// Thread-safe.
class NcclTransport : public Transport, public DeviceTransport {
 public:
  struct Options {
    // CUDA ordinals this node drives, one NCCL rank each, in local order.
    std::vector<int> devices;
    // Reads the time for every deadline; null: the real clock. Must outlive
    // the transport and its communicators.
    Clock* clock = nullptr;
  };

  // `api` must outlive the transport and its communicators. Errors:
  // UNAVAILABLE "no CUDA device (...)"; INVALID_ARGUMENT for an empty device
  // list, a repeated device (NCCL allows one rank per GPU in a group) or one
  // the machine does not have.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(gpu::GpuApi* api,
                                                               Options options);

  // Connects request.count NCCL groups of num_nodes x devices ranks, one
  // after the other; each returned communicator is a DeviceCommunicator
  // (an NcclCommunicator). `request.timeout` bounds the whole call. Errors:
  // INVALID_ARGUMENT for a bad request; FAILED_PRECONDITION when the nodes
  // drive different numbers of devices (naming both counts) or a unique id
  // has the wrong size; DEADLINE_EXCEEDED naming the node ranks that did not
  // publish their device count or start initializing (or saying that all
  // did and NCCL did not finish); ABORTED (or another code) as the store
  // returned it; UNAVAILABLE for a CUDA or NCCL error. On error no
  // communicator is returned and nothing is left initialized.
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> Connect(
      const ConnectRequest& request) override;
  // UNIMPLEMENTED: the negotiation runs on host TCP connections
  // (GlooTransport::ConnectNegotiation), never on NCCL.
  absl::StatusOr<std::unique_ptr<NegotiationWire>> ConnectNegotiation(
      const ConnectRequest& request) override;
  // The same, typed.
  absl::StatusOr<std::vector<std::unique_ptr<DeviceCommunicator>>>
  ConnectDevices(const ConnectRequest& request) override;

  // A group of this node's devices only (one node, no store): the local
  // reduce and broadcast of the hierarchical path, and benchmarks.
  absl::StatusOr<std::unique_ptr<DeviceCommunicator>> ConnectLocal(
      std::chrono::milliseconds timeout) override;

  const std::vector<int>& devices() const { return devices_; }

  // What the agent builds its jobs' GPU groups with: given indices into
  // `ordinals` (a job's trainers' GPUs in local-rank order), an
  // NcclTransport over those CUDA ordinals. `api` must outlive it all.
  using Factory =
      std::function<absl::StatusOr<std::unique_ptr<DeviceTransport>>(
          const std::vector<int>& local_devices)>;
  static Factory MakeFactory(gpu::GpuApi* api, std::vector<int> ordinals);

 private:
  NcclTransport(gpu::GpuApi* api, std::vector<int> devices, Clock* clock);

  // Publishes this node's device count and checks every node's against it.
  absl::Status AgreeOnDevices(const ConnectRequest& request,
                              absl::Time deadline) const;
  // Node 0 makes and publishes group `name`'s unique id; the others read it.
  absl::StatusOr<gpu::NcclUniqueId> ExchangeUniqueId(
      const ConnectRequest& request, const std::string& name,
      absl::Time deadline) const;
  // Initializes this node's ranks of group `name` and waits until they are
  // ready. `missing` says, when it times out, who is to blame.
  absl::StatusOr<std::unique_ptr<DeviceCommunicator>> Initialize(
      const std::string& name, const std::string& what, int node_rank,
      int num_nodes, const gpu::NcclUniqueId& id, absl::Time deadline,
      std::chrono::milliseconds timeout,
      const std::function<std::string()>& missing) const;
  // The store wait left until `deadline` (zero once it passed).
  std::chrono::milliseconds Left(absl::Time deadline) const;

  // Constant after construction.
  gpu::GpuApi* const api_;
  const std::vector<int> devices_;
  Clock* const clock_;
};

}  // namespace baton::agent
