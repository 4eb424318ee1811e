#pragma once

// The port batonrun gives torch.distributed's env:// rendezvous
// (MASTER_PORT) in an embedded cluster, where rank 0's process hosts the
// store on 127.0.0.1.

#include "absl/status/statusor.h"

namespace baton::batonrun {

// A TCP port that nothing holds now, on any address (IPv4 and IPv6), taken
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range): the
// coordinator, the agents and their data plane all bind port 0, so none of
// them can be given this port between this check and rank 0 binding it.
// The search starts at a random port, so that batonruns started together
// rarely pick the same one. FAILED_PRECONDITION when no such port is free.
absl::StatusOr<int> ChooseMasterPort();

}  // namespace baton::batonrun
