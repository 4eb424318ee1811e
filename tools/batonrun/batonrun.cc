// batonrun: launches a baton job on this machine.
//
//   batonrun --nodes N --procs-per-node P [--min-nodes M] [--restarts R]
//            [--coordinator ADDR] -- CMD ARGS...
//
// Without --coordinator it starts an embedded cluster first: a
// baton-coordinator on a free loopback port and one baton-agent per node
// (n1..nN, each with its own socket), then P trainers per node, every node
// at once: node k's trainers get ranks (k-1)*P .. k*P-1, and GROUP_RANK=k-1
// places the node when the job first forms, so RANK is exact. With
// --coordinator it starts only this node's P trainers against the local
// agent (--socket), the Kubernetes case.
//
// Trainers get the variables torchrun sets (LOCAL_RANK, LOCAL_WORLD_SIZE,
// WORLD_SIZE, ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, TORCHELASTIC_RUN_ID (the
// job), ROLE_NAME, TORCHELASTIC_RESTART_COUNT and _MAX_RESTARTS; in an
// embedded cluster also RANK, ROLE_RANK, GROUP_RANK, MASTER_ADDR=127.0.0.1
// and a free MASTER_PORT), so any script starts as under torchrun: one
// that never uses baton, one whose torch.distributed.init_process_group
// (env://) comes first; and BATON_NODES and BATON_MIN_NODES (--min-nodes,
// by default --nodes).
//
// Every trainer's output is prefixed with its rank. SIGINT/SIGTERM are
// forwarded to the trainers. When a trainer fails (in a job that is not
// elastic, below), the others are stopped (SIGTERM, then SIGKILL after
// --stop_grace_ms) and batonrun exits 1 naming the rank and how it ended.
// Every child dies with batonrun (PR_SET_PDEATHSIG), so nothing is left
// behind.
//
// batonrun supervises the embedded coordinator: when it ends, it is started
// again on the address the first one got (the agents reconnect to it and
// re-report their jobs, which train on meanwhile), at most
// --max_coordinator_restarts times a minute. An embedded agent that ends
// fails the job as a trainer does (or kills its node, when elastic).
//
// Elastic jobs (embedded clusters; tools/batonrun/node_supervisor.h): with
// --min-nodes M below --nodes, a node that dies (its agent ends, or a
// trainer ends with anything but 0) does not end the job: batonrun stops
// what is left of it and the others go on while at least M nodes are left
// (the coordinator re-forms the job with them); batonrun exits 0 when the
// trainers of the nodes left all exited 0, naming the nodes lost. With
// --restarts R, the first R deaths of the job restart their node instead:
// a new agent with the same name, socket and log, and new trainers without
// RANK and WORLD_SIZE (the coordinator places the node again), their output
// tagged "[node<k>.<local rank> restart <r>]". A node that dies before the
// job formed with all its nodes fails the job as before.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "baton/status_client.h"
#include "common/init.h"
#include "common/token_flag.h"
#include "gflags/gflags.h"
#include "tools/batonrun/child.h"
#include "tools/batonrun/console.h"
#include "tools/batonrun/master_port.h"
#include "tools/batonrun/node_supervisor.h"

DEFINE_int32(nodes, 1, "Nodes (agents) of the job, 1..64");
DEFINE_int32(procs_per_node, 1, "Trainers per node, 1..64");
DEFINE_int32(min_nodes, 0,
             "Nodes the job needs, 1..--nodes (BATON_MIN_NODES of every "
             "trainer); below --nodes the job is elastic: a node that dies is "
             "stopped and the others go on while this many are left. 0: "
             "--nodes");
DEFINE_int32(restarts, 0,
             "Node restarts allowed in the whole job, 0..100 (embedded "
             "cluster only): a node that dies is started again, placed anew "
             "by the coordinator");
DEFINE_string(coordinator, "",
              "An existing coordinator: start only this node's trainers "
              "(against --socket); empty: start an embedded cluster");
DEFINE_string(socket, "/tmp/baton-agent.sock",
              "This node's agent socket (with --coordinator)");
DEFINE_string(job, "batonrun", "The job's name (BATON_JOB)");
DEFINE_int32(stop_grace_ms, 5000,
             "After SIGTERM, how long a process may take before SIGKILL");
DEFINE_string(agent_flags, "", "Extra flags for the embedded agents");
DEFINE_string(coordinator_flags, "",
              "Extra flags for the embedded coordinator, e.g. "
              "\"--stall_threshold_ms=2000 --report_interval_ms=200\"");
DEFINE_int32(max_coordinator_restarts, 5,
             "Restarts of the embedded coordinator allowed within a minute, "
             "0..100; one more ends the job");

namespace baton::batonrun {
namespace {

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string SelfDir() {
  char buf[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? Dirname(std::string(buf, static_cast<size_t>(n))) : ".";
}

// "1 time", "3 times".
std::string Times(size_t n) {
  return absl::StrCat(n, n == 1 ? " time" : " times");
}

std::vector<std::string> SplitFlags(const std::string& flags) {
  return absl::StrSplit(flags, ' ', absl::SkipEmpty());
}

std::atomic<int> received_signal{0};

class Launcher {
 public:
  int Run(const std::vector<std::string>& command);

 private:
  bool StartCluster();
  // Starts the embedded coordinator on `listen` into `coordinator` and waits
  // (bounded) for the address it serves on; "" (and `coordinator` reaped)
  // when it ended or timed out first, with how in `ended`.
  std::string StartCoordinator(const std::string& listen, Child& coordinator,
                               std::string& ended);
  // The embedded coordinator `c` ended: starts it again on its address,
  // within --max_coordinator_restarts a minute. False, said why, when not.
  bool RestartCoordinator(Child& c);
  // Starts every node of the embedded cluster, or this node's trainers;
  // false when one could not start.
  bool StartNodes(NodeSupervisor& nodes);
  NodeSupervisor::Options NodeOptions(
      const std::vector<std::string>& command) const;
  std::string CoordinatorLog() const { return dir_ + "/coordinator.log"; }
  std::string CoordinatorEnded() const {
    return absl::StrCat(
        coordinator_child_.name, " (pid ", coordinator_child_.pid, ") ",
        Describe(coordinator_child_.status), "; its log is in ", dir_);
  }

  bool embedded_ = FLAGS_coordinator.empty();
  std::string dir_;
  std::string coordinator_;
  Child coordinator_child_;
  // torch.distributed's rendezvous port (MASTER_PORT), embedded clusters.
  int master_port_ = 0;
  // When the embedded coordinator was restarted, the last minute's.
  std::deque<std::chrono::steady_clock::time_point> restarts_;
  size_t restart_count_ = 0;
};

std::string Launcher::StartCoordinator(const std::string& listen,
                                       Child& coordinator, std::string& ended) {
  const std::string bin = SelfDir() + "/baton-coordinator";
  coordinator.name = "coordinator";
  std::vector<std::string> argv = {bin, "--listen=" + listen};
  for (std::string& f : SplitFlags(FLAGS_coordinator_flags)) {
    argv.push_back(std::move(f));
  }
  if (!Spawn(coordinator, argv, {}, true, false, CoordinatorLog())) {
    ended = absl::StrCat("cannot be started (", bin, ": ", std::strerror(errno),
                         ")");
    return "";
  }
  const std::string address =
      ReadReadyLine(coordinator.stdout_fd, "baton-coordinator listening on ",
                    std::chrono::seconds(10));
  close(coordinator.stdout_fd);
  coordinator.stdout_fd = -1;
  if (!address.empty()) return address;
  // Ended before it listened (its pipe closed), or hung: it is not ours to
  // keep either way.
  kill(coordinator.pid, SIGKILL);
  int status = 0;
  waitpid(coordinator.pid, &status, 0);
  coordinator.done = true;
  coordinator.status = status;
  ended = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
              ? "did not listen within 10 s"
              : Describe(status) + " before it listened";
  return "";
}

bool Launcher::StartCluster() {
  char pattern[] = "/tmp/batonrun.XXXXXX";
  dir_ = mkdtemp(pattern);
  std::string ended;
  coordinator_ = StartCoordinator("127.0.0.1:0", coordinator_child_, ended);
  if (coordinator_.empty()) {
    Say("the coordinator " + ended + "; see " + CoordinatorLog());
    return false;
  }
  absl::StatusOr<int> master_port = ChooseMasterPort();
  if (!master_port.ok()) {
    Say(std::string(master_port.status().message()));
    return false;
  }
  master_port_ = *master_port;
  return true;
}

bool Launcher::RestartCoordinator(Child& c) {
  const std::string how =
      absl::StrCat("the coordinator (pid ", c.pid, ") ", Describe(c.status));
  const auto now = std::chrono::steady_clock::now();
  while (!restarts_.empty() &&
         now - restarts_.front() > std::chrono::minutes(1)) {
    restarts_.pop_front();
  }
  if (static_cast<int>(restarts_.size()) >= FLAGS_max_coordinator_restarts) {
    Say(absl::StrCat(
        how, "; not restarting it: it was restarted ", Times(restarts_.size()),
        " within the last minute (--max_coordinator_restarts=",
        FLAGS_max_coordinator_restarts, "); see ", CoordinatorLog()));
    return false;
  }
  // The log goes on in the same file; the line marks where.
  if (FILE* log = std::fopen(CoordinatorLog().c_str(), "a")) {
    std::fprintf(log, "batonrun: %s; restarting it on %s\n", how.c_str(),
                 coordinator_.c_str());
    std::fclose(log);
  }
  Child next;
  std::string ended;
  const std::string address = StartCoordinator(coordinator_, next, ended);
  if (address.empty()) {
    Say(absl::StrCat(how, "; restarting it on ", coordinator_,
                     " failed: the new one ", ended,
                     " (another process may hold the port now); see ",
                     CoordinatorLog()));
    return false;
  }
  restarts_.push_back(now);
  ++restart_count_;
  Say(absl::StrCat(how, "; restarted it on ", address, " (pid ", next.pid,
                   ", restart ", restarts_.size(), " of at most ",
                   FLAGS_max_coordinator_restarts, " a minute); its log is ",
                   CoordinatorLog()));
  c = next;
  return true;
}

NodeSupervisor::Options Launcher::NodeOptions(
    const std::vector<std::string>& command) const {
  NodeSupervisor::Options o;
  o.nodes = FLAGS_nodes;
  o.procs_per_node = FLAGS_procs_per_node;
  o.job = FLAGS_job;
  o.min_nodes = FLAGS_min_nodes == 0 ? FLAGS_nodes : FLAGS_min_nodes;
  o.restarts = FLAGS_restarts;
  o.stop_grace = std::chrono::milliseconds(FLAGS_stop_grace_ms);
  o.coordinator = embedded_ ? coordinator_ : FLAGS_coordinator;
  o.embedded = embedded_;
  if (!embedded_) {
    // Checked at start; should the token file go away since, the calls
    // fail with what the coordinator says.
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        ClientCredentialsFromFlags();
    if (credentials.ok()) o.credentials = *std::move(credentials);
  }
  o.dir = dir_;
  o.agent_binary = SelfDir() + "/baton-agent";
  o.agent_flags = SplitFlags(FLAGS_agent_flags);
  o.socket = FLAGS_socket;
  o.master_port = master_port_;
  o.command = command;
  o.interrupted = [] { return received_signal != 0; };
  return o;
}

bool Launcher::StartNodes(NodeSupervisor& nodes) {
  // Every node at once: GROUP_RANK places each node (the job's first seal
  // orders the nodes by it), so RANK is exact whatever order the agents join
  // in, and a script that first meets its peers through torch.distributed
  // (every DDP script) finds them all started.
  const int count = embedded_ ? FLAGS_nodes : 1;
  for (int node = 1; node <= count; ++node) {
    if (!nodes.Start(node)) return false;
  }
  return true;
}

int Launcher::Run(const std::vector<std::string>& command) {
  bool ok = !embedded_ || StartCluster();
  NodeSupervisor nodes(NodeOptions(command));
  ok = ok && StartNodes(nodes);

  int exit_code = ok ? 0 : 1;
  std::string failure;
  // Wait for the trainers; a node that dies fails the job, or is restarted
  // or lost when the job is elastic.
  while (ok && nodes.TrainersRunning()) {
    if (received_signal != 0) {
      Say(absl::StrCat("received ", strsignal(received_signal),
                       "; stopping the trainers"));
      exit_code = 128 + received_signal;
      break;
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (pid == coordinator_child_.pid && !coordinator_child_.done) {
      coordinator_child_.done = true;
      coordinator_child_.status = status;
      if (RestartCoordinator(coordinator_child_)) continue;
      failure = CoordinatorEnded();
      break;
    }
    const NodeSupervisor::Outcome outcome = nodes.OnExit(pid, status);
    if (outcome == NodeSupervisor::Outcome::kFailed) {
      failure = nodes.failure();
      break;
    }
    if (outcome == NodeSupervisor::Outcome::kInterrupted) {
      Say(absl::StrCat("received ", strsignal(received_signal),
                       " while restarting a node; stopping the trainers"));
      exit_code = 128 + received_signal;
      break;
    }
  }
  const auto grace = std::chrono::milliseconds(FLAGS_stop_grace_ms);
  Stop(nodes.RunningTrainers(), grace);
  std::vector<Child*> rest = nodes.RunningAgents();
  rest.push_back(&coordinator_child_);
  Stop(rest, grace);
  nodes.AwaitOutput();
  if (!failure.empty()) {
    Say(failure + "; stopped the others");
    return 1;
  }
  if (exit_code != 0 || !embedded_) return exit_code;
  const std::string summary = nodes.Summary();
  if (!summary.empty()) Say(summary + "; kept the agents' logs in " + dir_);
  if (restart_count_ > 0) {
    Say(absl::StrCat("the coordinator was restarted ", Times(restart_count_),
                     "; kept its log ", CoordinatorLog()));
  } else if (summary.empty()) {
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }
  return exit_code;
}

}  // namespace
}  // namespace baton::batonrun

int main(int argc, char** argv) {
  // --procs-per-node is the documented spelling; gflags wants underscores.
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strncmp(argv[i], "--", 2) != 0) continue;
    char* eq = std::strchr(argv[i], '=');
    for (char* p = argv[i] + 2; *p != '\0' && p != eq; ++p) {
      if (*p == '-') *p = '_';
    }
  }
  // Only what comes before "--" is ours; the command keeps its own flags.
  int ours = 1;
  while (ours < argc && std::strcmp(argv[ours], "--") != 0) ++ours;
  std::vector<std::string> command(argv + std::min(ours + 1, argc),
                                   argv + argc);
  int flag_argc = ours;
  // As every baton binary: BATON_<FLAG> variables, --help (exit 0), one
  // line and exit 2 for an unknown flag.
  baton::InitProcess(
      &flag_argc, &argv,
      "batonrun --nodes N --procs-per-node P [--min-nodes M] [--restarts R] "
      "[--coordinator ADDR] -- CMD ...");
  if (flag_argc > 1) {
    std::fprintf(stderr,
                 "batonrun: unexpected argument \"%s\" before \"--\": "
                 "batonrun [flags] -- CMD ARGS...\n",
                 argv[1]);
    return 2;
  }
  if (command.empty()) {
    std::fprintf(stderr,
                 "batonrun: no command: batonrun --nodes N --procs-per-node P "
                 "-- CMD ARGS...\n");
    return 2;
  }
  if (FLAGS_max_coordinator_restarts < 0 ||
      FLAGS_max_coordinator_restarts > 100) {
    std::fprintf(stderr,
                 "batonrun: --max_coordinator_restarts=%d must be in 0..100\n",
                 FLAGS_max_coordinator_restarts);
    return 2;
  }
  if (FLAGS_nodes < 1 || FLAGS_nodes > 64 || FLAGS_procs_per_node < 1 ||
      FLAGS_procs_per_node > 64) {
    std::fprintf(stderr,
                 "batonrun: --nodes=%d and --procs-per-node=%d must be in "
                 "1..64\n",
                 FLAGS_nodes, FLAGS_procs_per_node);
    return 2;
  }
  if (FLAGS_min_nodes < 0 || FLAGS_min_nodes > FLAGS_nodes) {
    std::fprintf(stderr,
                 "batonrun: --min-nodes=%d must be in 1..%d (--nodes); 0 or "
                 "unset: --nodes, a job that is not elastic\n",
                 FLAGS_min_nodes, FLAGS_nodes);
    return 2;
  }
  if (FLAGS_restarts < 0 || FLAGS_restarts > 100) {
    std::fprintf(stderr, "batonrun: --restarts=%d must be in 0..100\n",
                 FLAGS_restarts);
    return 2;
  }
  if (FLAGS_restarts > 0 && !FLAGS_coordinator.empty()) {
    std::fprintf(stderr,
                 "batonrun: --restarts=%d needs the embedded cluster, but "
                 "--coordinator=%s starts only this node's trainers: leave "
                 "restarting the node to what runs it (e.g. Kubernetes)\n",
                 FLAGS_restarts, FLAGS_coordinator.c_str());
    return 2;
  }
  if (FLAGS_coordinator.empty()) {
    // The embedded cluster is plaintext on loopback: TLS settings meant for
    // a real cluster must not reach its coordinator and agents.
    // So must a token: the embedded coordinator takes none.
    for (const char* name :
         {"BATON_TLS_CERT", "BATON_TLS_KEY", "BATON_TLS_CA",
          "BATON_TLS_REFRESH_S", "BATON_INSECURE", "BATON_TOKEN_FILE"}) {
      unsetenv(name);
    }
  } else if (const absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
                 credentials = baton::ClientCredentialsFromFlags();
             !credentials.ok()) {
    std::fprintf(stderr, "batonrun: %s\n",
                 std::string(credentials.status().message()).c_str());
    return 2;
  }
  // Signals go to a thread that records them; the main loop forwards.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    baton::batonrun::received_signal = sig;
  }).detach();
  return baton::batonrun::Launcher().Run(command);
}
