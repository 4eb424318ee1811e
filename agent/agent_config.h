#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "agent/scheduler/operation.h"
#include "agent/transport/negotiation_choice.h"
#include "common/tls.h"

namespace baton::agent {

// The agent's configuration (flags, see agent/main.cc and
// docs/operations.md). Constant after start.
struct AgentConfig {
  std::string coordinator;  // host:port
  // Mutual TLS with the coordinator (--tls_*); off: plaintext.
  TlsFiles tls;
  std::string node_name;
  std::string socket_path;
  // --trainer_group: besides the agent's own uid, processes in this group
  // may attach; the socket and shared memory are 0660 and owned by it.
  // None: both are 0600 and only the agent's uid attaches.
  std::optional<gid_t> trainer_group;
  // Address peers reach this node's data plane on (its sockets bind here).
  std::string data_host = "127.0.0.1";
  // The host tensors' data plane between agents: baton's TCP rings, or
  // gloo's TCP transport.
  DataTransport data_transport = DataTransport::kTcp;
  // kTcp: allreduce steps leave out 1 KiB blocks that are all zero
  // (--skip_zero_blocks; ZeroBlocks).
  bool skip_zero_blocks = true;
  SchedulingMode scheduling = SchedulingMode::kPriority;
  GpuCrossNode gpu_cross_node = GpuCrossNode::kNccl;
  int64_t credit_bytes = 16 << 20;
  // Priority mode across nodes: baton chooses the partition size (of jobs
  // that do not ask for one) and the credit online (--partition_tuning; the
  // credit only when --credit_bytes was not given).
  bool tune_partition_bytes = false;
  bool tune_credit_bytes = false;
  std::chrono::milliseconds op_timeout{60000};
  // How long a job waits on this node for a trainer to attach in place of
  // one that disconnected without detaching, before it ends here.
  std::chrono::milliseconds trainer_restart_timeout{60000};
  // Data communicators per job (separate TCP connections, used in parallel).
  int data_channels = 4;
  // The wire of the scheduler's negotiation rounds (--negotiation,
  // --negotiation_fanout); node rank 0's holds for a generation.
  NegotiationChoice negotiation;
  std::chrono::milliseconds reconnect_max_backoff{2000};
  // When set, each job appends its launches to
  // <dir>/<job>.<node>.launches.
  std::string launch_trace_dir;
  // Partition records each job keeps for batonctl timeline (the oldest are
  // dropped); 0 records nothing.
  int64_t timeline_records = 100000;
  // How long the metrics of a job that ended on this node stay on the
  // metrics endpoint (so that the next scrape sees its final counts).
  std::chrono::seconds metrics_retention{300};
  // Shared memory names start with "/baton.<pid>." so that a restarted agent
  // can remove what a killed one left.
  int pid = 0;
};

}  // namespace baton::agent
