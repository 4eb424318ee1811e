// baton-coordinator: the control plane of a baton cluster.

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/init.h"
#include "common/metrics.h"
#include "common/tls_flags.h"
#include "common/validation.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/grpc/coordinator_server.h"

DEFINE_string(listen, "0.0.0.0:50051",
              "Address the coordinator serves on, host:port (port 0 picks a "
              "free port, printed at start)");
DEFINE_int64(heartbeat_interval_ms, 2000,
             "Milliseconds between heartbeats agents send when otherwise "
             "silent");
DEFINE_int64(liveness_timeout_ms, 6000,
             "Milliseconds of silence after which an agent's node is lost; "
             "must exceed --heartbeat_interval_ms");
DEFINE_int64(report_interval_ms, 1000,
             "Milliseconds between the step reports agents send");
DEFINE_int64(tick_interval_ms, 100,
             "Milliseconds between the coordinator's checks of its deadlines "
             "(liveness, re-form, store waits, stalls)");
DEFINE_int64(stall_threshold_ms, 10000,
             "Milliseconds a tensor may wait on some ranks before it is "
             "reported as a stall");
DEFINE_int64(reform_timeout_ms, 60000,
             "Milliseconds a job that lost a node may wait to be whole again "
             "before it fails");
DEFINE_int64(join_wait_ms, 30000,
             "Milliseconds a node joining a running job (below its node "
             "count) waits for the members' next commit before the job "
             "re-forms to admit it");
DEFINE_int64(job_retention_ms, 600000,
             "Milliseconds an ended job stays visible in status");
DEFINE_int64(partition_bytes, 4194304,
             "Partition size in bytes for jobs that do not ask for one; a "
             "multiple of 8 in 8..1073741824");
DEFINE_int64(shutdown_grace_ms, 3000,
             "Milliseconds calls in progress get to finish after SIGTERM "
             "before they are cancelled; at most 4500");
DEFINE_int32(events_per_job, 100, "Recent events kept per job (a count)");
DEFINE_int32(session_queues, 8,
             "gRPC completion queues, each with a thread, that the agents' "
             "sessions are spread over (1..64)");
DEFINE_int32(max_message_bytes, 16777216,
             "Largest gRPC message in bytes the coordinator sends or accepts");
DEFINE_string(tokens_file, "",
              "Bearer tokens for people and scripts, lines \"SCOPE NAME "
              "TOKEN\" (scope read: status; admin: also batonctl cancel); "
              "needs TLS. Read again when it changes (at most every "
              "--tls_refresh_s)");
DEFINE_string(metrics_listen, "",
              "Address of the Prometheus endpoint (GET /metrics), host:port "
              "(port 0 picks a free port, printed at start); empty: none");

namespace baton::coordinator {
namespace {

constexpr char kUsage[] =
    "baton-coordinator: the control plane of a baton cluster (jobs, "
    "membership, tensor plans, global step, status).\n"
    "Usage: baton-coordinator [--listen=host:port] [flags]\n"
    "Every flag can also be set as BATON_<FLAG> in the environment.";

constexpr int64_t kMaxPartitionBytes = int64_t{1} << 30;
constexpr int64_t kMaxShutdownGraceMs = 4500;
constexpr int32_t kMaxSessionQueues = 64;

absl::Status Positive(const char* flag, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, "=", value, " must be positive: give a value above 0"));
}

// A listen address may use port 0 ("pick a free port").
absl::Status ValidateListenAddress(const std::string& value) {
  return ValidateHostPort("--listen", value, PortZero::kAllowed);
}

absl::StatusOr<CoordinatorOptions> OptionsFromFlags() {
  const struct {
    const char* name;
    int64_t value;
  } positive[] = {
      {"heartbeat_interval_ms", FLAGS_heartbeat_interval_ms},
      {"liveness_timeout_ms", FLAGS_liveness_timeout_ms},
      {"report_interval_ms", FLAGS_report_interval_ms},
      {"tick_interval_ms", FLAGS_tick_interval_ms},
      {"stall_threshold_ms", FLAGS_stall_threshold_ms},
      {"reform_timeout_ms", FLAGS_reform_timeout_ms},
      {"join_wait_ms", FLAGS_join_wait_ms},
      {"job_retention_ms", FLAGS_job_retention_ms},
      {"partition_bytes", FLAGS_partition_bytes},
      {"shutdown_grace_ms", FLAGS_shutdown_grace_ms},
      {"events_per_job", FLAGS_events_per_job},
      {"max_message_bytes", FLAGS_max_message_bytes},
      {"session_queues", FLAGS_session_queues},
  };
  for (const auto& flag : positive) {
    if (absl::Status status = Positive(flag.name, flag.value); !status.ok()) {
      return status;
    }
  }
  if (FLAGS_liveness_timeout_ms <= FLAGS_heartbeat_interval_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--liveness_timeout_ms=", FLAGS_liveness_timeout_ms,
        " must exceed --heartbeat_interval_ms=", FLAGS_heartbeat_interval_ms,
        ": raise it (three heartbeats is usual) or lower the interval"));
  }
  if (FLAGS_partition_bytes % 8 != 0 ||
      FLAGS_partition_bytes > kMaxPartitionBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--partition_bytes=", FLAGS_partition_bytes,
                     " must be a multiple of 8 in 8..", kMaxPartitionBytes,
                     ": choose such a size (4194304 is the default)"));
  }
  if (FLAGS_shutdown_grace_ms > kMaxShutdownGraceMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shutdown_grace_ms=", FLAGS_shutdown_grace_ms,
                     " must be at most ", kMaxShutdownGraceMs,
                     " so that shutdown finishes within 5 s: lower it"));
  }
  if (FLAGS_session_queues > kMaxSessionQueues) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--session_queues=", FLAGS_session_queues, " must be at most ",
        kMaxSessionQueues, ": lower it (8 serve 10,000 agents)"));
  }
  if (absl::Status status = ValidateListenAddress(FLAGS_listen); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(status.message(), ": fix --listen"));
  }
  if (absl::Status status = ValidateMetricsListen(FLAGS_metrics_listen);
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CheckTransportSecurity({{"--listen", FLAGS_listen}});
      !status.ok()) {
    return status;
  }

  CoordinatorOptions options;
  options.heartbeat_interval = absl::Milliseconds(FLAGS_heartbeat_interval_ms);
  options.liveness_timeout = absl::Milliseconds(FLAGS_liveness_timeout_ms);
  options.report_interval = absl::Milliseconds(FLAGS_report_interval_ms);
  options.tick_interval = absl::Milliseconds(FLAGS_tick_interval_ms);
  options.stall_threshold = absl::Milliseconds(FLAGS_stall_threshold_ms);
  options.reform_timeout = absl::Milliseconds(FLAGS_reform_timeout_ms);
  options.join_wait = absl::Milliseconds(FLAGS_join_wait_ms);
  options.job_retention = absl::Milliseconds(FLAGS_job_retention_ms);
  options.partition_bytes = FLAGS_partition_bytes;
  options.events_per_job = FLAGS_events_per_job;
  options.session_queues = FLAGS_session_queues;
  return options;
}

// --tokens_file, loaded: every problem is a startup error.
absl::StatusOr<TokensFile> TokensFromFlags() {
  TokensFile tokens;
  if (FLAGS_tokens_file.empty()) return tokens;
  if (!TlsFilesFromFlags().enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens_file ", FLAGS_tokens_file,
        " needs TLS (clients send tokens only over TLS): give --tls_cert, "
        "--tls_key and --tls_ca, or leave out --tokens_file"));
  }
  absl::StatusOr<TokenTable> table = TokenTable::Load(FLAGS_tokens_file);
  if (!table.ok()) return table.status();
  tokens.path = FLAGS_tokens_file;
  tokens.table = std::make_shared<const TokenTable>(*std::move(table));
  return tokens;
}

// "host:port" with the bound port in place of the requested one.
std::string BoundAddress(const std::string& listen, int port) {
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

int Main(int argc, char** argv) {
  const sigset_t shutdown_signals = BlockShutdownSignals();

  InitProcess(&argc, &argv, kUsage);
  // Debian's abseil is built with absl::Mutex's deadlock detection on: every
  // acquisition looks the lock up in a global graph under a global lock
  // (GraphCycles::GetId, 4% of the coordinator's CPU at 10,000 sessions;
  // without it the coordinator used 7% less CPU there, docs/benchmarks.md).
  // Only here: the agent's trainer round trip measured 1-14% slower without
  // it, in 6 of 6 alternating pairs (not explained; perhaps the spinning of
  // the fast path on 2 cores). The tests keep it; clang's thread-safety
  // analysis checks lock use at compile time.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::StatusOr<CoordinatorOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "baton-coordinator: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<TokensFile> tokens = TokensFromFlags();
  if (!tokens.ok()) {
    std::fprintf(stderr, "baton-coordinator: %s\n",
                 std::string(tokens.status().message()).c_str());
    return 2;
  }

  CoordinatorServer server(*options, Clock::Real());
  absl::StatusOr<int> port =
      server.Start(FLAGS_listen, FLAGS_max_message_bytes, TlsFilesFromFlags(),
                   *std::move(tokens));
  if (!port.ok()) {
    std::fprintf(stderr, "baton-coordinator: %s\n",
                 std::string(port.status().message()).c_str());
    return 1;
  }
  const absl::StatusOr<std::string> metrics_url =
      server.ServeMetrics(FLAGS_metrics_listen);
  if (!metrics_url.ok()) {
    std::fprintf(stderr, "baton-coordinator: %s\n",
                 std::string(metrics_url.status().message()).c_str());
    return 1;
  }
  std::printf("baton-coordinator listening on %s\n",
              BoundAddress(FLAGS_listen, *port).c_str());
  PrintMetricsUrl(*metrics_url);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&shutdown_signals, &signal_number);
  LOG(INFO) << "received " << strsignal(signal_number)
            << "; shutting down (grace " << FLAGS_shutdown_grace_ms << " ms)";
  const absl::Time start = absl::Now();
  server.Shutdown(absl::Milliseconds(FLAGS_shutdown_grace_ms),
                  absl::StrCat("the coordinator is shutting down (",
                               strsignal(signal_number), ")"));
  LOG(INFO) << "shut down in " << absl::Now() - start;
  return 0;
}

}  // namespace
}  // namespace baton::coordinator

int main(int argc, char** argv) { return baton::coordinator::Main(argc, argv); }
