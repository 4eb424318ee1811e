// baton-agent: the per-node data plane. See docs/operations.md.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/agent.h"
#include "agent/trainer_admission.h"
#ifdef BATON_HAVE_NCCL
#include "agent/transport/nccl/cuda_device_memory.h"
#include "agent/transport/nccl/cuda_nccl_api.h"
#include "agent/transport/nccl/local_gpus.h"
#include "agent/transport/nccl/nccl_transport.h"
#endif
#include "common/init.h"
#include "common/metrics.h"
#include "common/tls_flags.h"
#include "common/validation.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(coordinator, "127.0.0.1:50051",
              "The coordinator's address (host:port)");
DEFINE_string(node, "",
              "This node's name, unique in every job (default: the host name)");
DEFINE_string(socket, "/tmp/baton-agent.sock",
              "Unix socket trainers connect to (BATON_AGENT_SOCKET)");
DEFINE_string(trainer_group, "",
              "Group (name or gid) whose processes may attach besides the "
              "agent's own uid: the socket and shared memory become 0660 "
              "and owned by it; the agent must be root or a member. Empty: "
              "both are 0600 and only trainers running as the agent's uid "
              "attach");
DEFINE_string(data_host, "127.0.0.1",
              "Address peers reach this node's data plane on (its sockets "
              "bind here); the node's IP on a cluster");
DEFINE_string(data_transport, "tcp",
              "What carries host tensors between agents: tcp (baton's ring "
              "collectives on its own TCP connections, run by the data "
              "threads themselves) or gloo (gloo's TCP transport); every "
              "agent of a job must use the same");
DEFINE_bool(skip_zero_blocks, true,
            "--data_transport=tcp: allreduce steps send only the 1 KiB blocks "
            "that are not all zero (with a bitmap) when at least one block "
            "in eight is zero, as in a dense nn.Embedding's gradient; the "
            "sum is the same. Agents of a job may differ in this");
DEFINE_string(scheduling, "priority",
              "Scheduling of jobs whose trainers do not set BATON_SCHEDULING: "
              "priority or fifo");
DEFINE_string(gpu_cross_node, "nccl",
              "How CUDA tensors cross nodes: nccl (one NCCL group over every "
              "GPU of the job) or gloo (NCCL within the node, gloo on host "
              "memory between agents: the hierarchical path)");
DEFINE_int64(credit_bytes, 16 << 20,
             "Bytes in flight per job on this node (priority scheduling); "
             "one partition is always admitted. Not given: baton starts "
             "there and chooses it online (--partition_tuning)");
DEFINE_bool(partition_tuning, true,
            "Priority scheduling across nodes: choose the partition size "
            "(of jobs that do not set BATON_PARTITION_BYTES; the "
            "coordinator's --partition_bytes is where it starts) and the "
            "credit (unless --credit_bytes is given) online from this "
            "node's own collective timings, agreed by every node");
DEFINE_int64(op_timeout_ms, 60000,
             "Bound on every collective and on connecting the data plane");
DEFINE_int64(trainer_restart_timeout_ms, 60000,
             "How long a job waits for a trainer to attach again in place of "
             "one that disconnected without detaching (killed, crashed); the "
             "node leaves the job's generation meanwhile and ends the job "
             "here when none comes");
DEFINE_int32(data_channels, 4,
             "Data communicators per job (separate TCP connections used in "
             "parallel)");
DEFINE_string(negotiation, "auto",
              "How the scheduler's negotiation rounds travel between agents: "
              "all_to_all (every node sends its vector to every other: one "
              "hop, N x (N-1) messages a round), tree (along a tree of "
              "--negotiation_fanout children per node: O(N) messages, "
              "O(log N) hops) or auto (all_to_all up to 4 nodes, tree "
              "above); node rank 0's choice holds for every node of a "
              "generation");
DEFINE_int32(negotiation_fanout, 4,
             "Children per node of the negotiation tree (2..64), when "
             "--negotiation chooses the tree");
DEFINE_int64(reconnect_max_backoff_ms, 2000,
             "Longest wait between attempts to reach the coordinator");
DEFINE_int64(timeline_records, 100000,
             "Partition records each job keeps for `batonctl timeline` (about "
             "200 bytes each; the oldest are dropped; 0 = record nothing)");
DEFINE_string(metrics_listen, "",
              "Address of the Prometheus endpoint (GET /metrics), host:port "
              "(port 0 picks a free port, printed at start); empty: none");
DEFINE_string(launch_trace_dir, "",
              "When set, each job appends every launch to "
              "<dir>/<job>.<node>.launches (for tests and debugging)");

namespace baton {
namespace {

constexpr char kUsage[] =
    "baton-agent --coordinator HOST:PORT --node NAME --socket PATH\n"
    "Runs push-pull and broadcast for the trainers on this node.";

absl::StatusOr<agent::AgentConfig> ConfigFromFlags() {
  agent::AgentConfig config;
  if (absl::Status s = ValidateHostPort("--coordinator", FLAGS_coordinator);
      !s.ok()) {
    return s;
  }
  config.coordinator = FLAGS_coordinator;
  config.node_name = FLAGS_node;
  if (config.node_name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    config.node_name = host;
  }
  if (absl::Status s = ValidateIdentifier("--node", config.node_name);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckTransportSecurity({{"--coordinator", FLAGS_coordinator},
                                  {"--data_host", FLAGS_data_host}});
      !s.ok()) {
    return s;
  }
  config.tls = TlsFilesFromFlags();
  if (config.tls.enabled()) {
    // The coordinator accepts this node's name only from a certificate
    // that carries it: say so now rather than after every reconnect.
    absl::StatusOr<std::vector<std::string>> names =
        CertificateDnsNames(config.tls.cert);
    if (!names.ok()) return names.status();
    if (std::find(names->begin(), names->end(), config.node_name) ==
        names->end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_cert ", config.tls.cert, " does not name this node \"",
          config.node_name, "\" (its DNS names: ",
          names->empty() ? "none" : absl::StrJoin(*names, ", "),
          "): give each agent its own node's certificate, or --node one of "
          "its names"));
    }
  }
  if (FLAGS_socket.empty() || FLAGS_socket.size() > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--socket=\"", FLAGS_socket,
        "\" must be a path of 1..100 characters (unix socket limit)"));
  }
  config.socket_path = FLAGS_socket;
  if (!FLAGS_trainer_group.empty()) {
    absl::StatusOr<gid_t> group =
        agent::ResolveTrainerGroup(FLAGS_trainer_group);
    if (!group.ok()) return group.status();
    config.trainer_group = *group;
  }
  if (FLAGS_data_host.empty()) {
    return absl::InvalidArgumentError(
        "--data_host is empty: give this node's IP");
  }
  config.data_host = FLAGS_data_host;
  if (FLAGS_scheduling == "priority") {
    config.scheduling = agent::SchedulingMode::kPriority;
  } else if (FLAGS_scheduling == "fifo") {
    config.scheduling = agent::SchedulingMode::kFifo;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--scheduling=", FLAGS_scheduling,
                     " is unknown: give priority or fifo"));
  }
  if (FLAGS_data_transport == "tcp") {
    config.data_transport = agent::DataTransport::kTcp;
  } else if (FLAGS_data_transport == "gloo") {
    config.data_transport = agent::DataTransport::kGloo;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_transport=", FLAGS_data_transport,
                     " is unknown: give tcp or gloo"));
  }
  config.skip_zero_blocks = FLAGS_skip_zero_blocks;
  if (config.tls.enabled() &&
      config.data_transport == agent::DataTransport::kGloo &&
      !InsecureFromFlags()) {
    // TLS says the cluster's channels must be authenticated; gloo's pair
    // connections cannot be (docs/operations.md, "What the data plane
    // protects"), and the default transport's are.
    return absl::FailedPreconditionError(
        "--data_transport=gloo with TLS: gloo's connections between agents "
        "are not authenticated, so anyone who reaches this node's data "
        "ports could connect to them; use the default --data_transport=tcp, "
        "whose connections prove the generation's secret, or give "
        "--insecure to accept that (docs/operations.md, \"What the data "
        "plane protects\")");
  }
  absl::StatusOr<agent::NegotiationChoice::Wire> negotiation =
      agent::NegotiationChoice::ParseWire(FLAGS_negotiation);
  if (!negotiation.ok()) return negotiation.status();
  config.negotiation.wire = *negotiation;
  if (FLAGS_negotiation_fanout < 2 ||
      FLAGS_negotiation_fanout > agent::NegotiationChoice::kMaxFanout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--negotiation_fanout=", FLAGS_negotiation_fanout,
                     " must be in 2..", agent::NegotiationChoice::kMaxFanout));
  }
  config.negotiation.fanout = FLAGS_negotiation_fanout;
  if (FLAGS_gpu_cross_node == "nccl") {
    config.gpu_cross_node = agent::GpuCrossNode::kNccl;
  } else if (FLAGS_gpu_cross_node == "gloo") {
    config.gpu_cross_node = agent::GpuCrossNode::kGloo;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_cross_node=", FLAGS_gpu_cross_node,
                     " is unknown: give nccl or gloo"));
  }
  const struct {
    const char* name;
    int64_t value;
  } positive[] = {
      {"credit_bytes", FLAGS_credit_bytes},
      {"op_timeout_ms", FLAGS_op_timeout_ms},
      {"trainer_restart_timeout_ms", FLAGS_trainer_restart_timeout_ms},
      {"data_channels", FLAGS_data_channels},
      {"reconnect_max_backoff_ms", FLAGS_reconnect_max_backoff_ms},
  };
  for (const auto& flag : positive) {
    if (flag.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag.name, "=", flag.value,
                       " must be positive: give a value above 0"));
    }
  }
  if (FLAGS_timeline_records < 0 || FLAGS_timeline_records > 10000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeline_records=", FLAGS_timeline_records,
                     " must be in 0..10000000"));
  }
  if (absl::Status s = ValidateMetricsListen(FLAGS_metrics_listen); !s.ok()) {
    return s;
  }
  if (FLAGS_data_channels > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data_channels=", FLAGS_data_channels, " must be at most 16"));
  }
  config.credit_bytes = FLAGS_credit_bytes;
  config.tune_partition_bytes = FLAGS_partition_tuning;
  config.tune_credit_bytes =
      FLAGS_partition_tuning &&
      gflags::GetCommandLineFlagInfoOrDie("credit_bytes").is_default;
  config.op_timeout = std::chrono::milliseconds(FLAGS_op_timeout_ms);
  config.trainer_restart_timeout =
      std::chrono::milliseconds(FLAGS_trainer_restart_timeout_ms);
  config.data_channels = FLAGS_data_channels;
  config.reconnect_max_backoff =
      std::chrono::milliseconds(FLAGS_reconnect_max_backoff_ms);
  config.launch_trace_dir = FLAGS_launch_trace_dir;
  config.timeline_records = FLAGS_timeline_records;
  config.pid = static_cast<int>(getpid());
  return config;
}

#ifdef BATON_HAVE_NCCL
// Fills `gpus` with every CUDA device this process sees; returns the line
// that describes them, or why there are none.
absl::StatusOr<std::string> SetUpGpus(agent::GpuSupport* gpus) {
  absl::StatusOr<agent::gpu::GpuApi*> api = agent::gpu::LoadCudaNcclApi();
  if (!api.ok()) return api.status();
  absl::StatusOr<int> count = agent::CountCudaDevices(**api);
  if (!count.ok()) return count.status();
  absl::StatusOr<std::string> described = agent::DescribeLocalGpus(**api);
  if (!described.ok()) return described.status();
  std::vector<int> ordinals(*count);
  std::iota(ordinals.begin(), ordinals.end(), 0);
  auto memory = agent::CreateCudaDeviceMemory(*api, ordinals);
  if (!memory.ok()) return memory.status();
  gpus->memory = std::move(*memory);
  gpus->transport = agent::NcclTransport::MakeFactory(*api, ordinals);
  return described;
}
#endif

// The GPUs this node drives for CUDA tensors (every device the agent sees),
// and a log line saying which data plane the node uses.
agent::GpuSupport LocalGpus(const agent::AgentConfig& config) {
  agent::GpuSupport gpus;
#ifdef BATON_HAVE_NCCL
  const absl::StatusOr<std::string> described = SetUpGpus(&gpus);
  if (described.ok()) {
    LOG(INFO) << "GPU data plane: " << *described
              << "; CUDA tensors cross nodes over "
              << agent::GpuCrossNodeName(config.gpu_cross_node)
              << ", host tensors over "
              << (config.data_transport == agent::DataTransport::kGloo
                      ? "gloo"
                      : "baton's TCP rings");
    if (config.tls.enabled()) {
      LOG(WARNING) << "TLS is on, but the connections that carry CUDA "
                      "tensors between nodes ("
                   << agent::GpuCrossNodeName(config.gpu_cross_node)
                   << ") are not authenticated: admit only agents to this "
                      "node's ports (docs/operations.md, \"What the data "
                      "plane protects\")";
    }
    return gpus;
  }
  gpus = agent::GpuSupport{};
  gpus.unavailable = std::string(described.status().message());
#else
  (void)config;
  gpus.unavailable = "built without CUDA/NCCL";
#endif
  LOG(INFO) << "using the CPU transport (gloo): " << gpus.unavailable;
  return gpus;
}

int Main(int argc, char** argv) {
  const sigset_t shutdown_signals = BlockShutdownSignals();

  InitProcess(&argc, &argv, kUsage);
  absl::StatusOr<agent::AgentConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "baton-agent: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  agent::Agent agent(*config, LocalGpus(*config));
  const absl::StatusOr<std::string> metrics_url =
      agent.ServeMetrics(FLAGS_metrics_listen);
  absl::Status status = metrics_url.status();
  if (status.ok()) status = agent.Start();
  if (!status.ok()) {
    std::fprintf(stderr, "baton-agent: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  std::printf("baton-agent %s serving trainers on %s, coordinator %s\n",
              config->node_name.c_str(), config->socket_path.c_str(),
              config->coordinator.c_str());
  PrintMetricsUrl(*metrics_url);
  std::fflush(stdout);

  const timespec reap_interval{1, 0};
  int signal_number = -1;
  while (signal_number < 0) {
    signal_number = sigtimedwait(&shutdown_signals, nullptr, &reap_interval);
    agent.ReapJobs();
  }
  LOG(INFO) << "received " << strsignal(signal_number) << "; shutting down";
  agent.Shutdown();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
