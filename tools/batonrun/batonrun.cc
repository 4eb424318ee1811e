// batonrun: launches a baton job on this machine.
//
//   batonrun --nodes N --procs-per-node P [--coordinator ADDR] -- CMD ARGS...
//
// Without --coordinator it starts an embedded cluster first: a
// baton-coordinator on a free loopback port and one baton-agent per node
// (n1..nN, each with its own socket), then P trainers per node. Nodes are
// started one after the other, each once the previous one has joined, so
// node k's trainers get ranks (k-1)*P .. k*P-1 and RANK is exact. With
// --coordinator it starts only this node's P trainers against the local
// agent (--socket), the Kubernetes case.
//
// Trainers get the variables torchrun sets (LOCAL_RANK, LOCAL_WORLD_SIZE,
// WORLD_SIZE; in an embedded cluster also RANK, MASTER_ADDR=127.0.0.1 and
// a free MASTER_PORT), so torch.distributed.init_process_group's env://
// rendezvous, which DistributedDataParallel needs, works unchanged.
//
// Every trainer's output is prefixed with its rank. SIGINT/SIGTERM are
// forwarded to the trainers. When a trainer fails, the others are stopped
// (SIGTERM, then SIGKILL after --stop_grace_ms) and batonrun exits 1 naming
// the rank and how it ended. Every child dies with batonrun
// (PR_SET_PDEATHSIG), so nothing is left behind.
//
// batonrun supervises the embedded coordinator: when it ends, it is started
// again on the address the first one got (the agents reconnect to it and
// re-report their jobs, which train on meanwhile), at most
// --max_coordinator_restarts times a minute. An embedded agent that ends
// fails the job, as a trainer does.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "baton/status_client.h"
#include "common/init.h"
#include "gflags/gflags.h"
#include "tools/batonrun/master_port.h"

DEFINE_int32(nodes, 1, "Nodes (agents) of the job, 1..64");
DEFINE_int32(procs_per_node, 1, "Trainers per node, 1..64");
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

namespace baton {
namespace {

std::mutex output_mu;

void Say(const std::string& text) {
  std::lock_guard<std::mutex> lock(output_mu);
  std::fprintf(stderr, "batonrun: %s\n", text.c_str());
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string SelfDir() {
  char buf[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? Dirname(std::string(buf, static_cast<size_t>(n))) : ".";
}

struct Child {
  std::string name;  // "rank 3", "agent n1", "coordinator"
  pid_t pid = -1;
  int stdout_fd = -1;  // read end, when captured
  bool trainer = false;
  bool coordinator = false;
  bool done = false;
  int status = 0;
};

// Starts argv with extra environment; stdout to a pipe (returned in
// child.stdout_fd) when `capture`, stderr to `stderr_path` when set (else
// inherited, or into the stdout pipe when `merge_stderr`).
bool Spawn(Child& child, const std::vector<std::string>& argv,
           const std::vector<std::string>& env, bool capture, bool merge_stderr,
           const std::string& stderr_path) {
  std::vector<std::string> args = argv;
  std::vector<char*> c_argv;
  for (auto& a : args) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  // The given variables replace inherited ones of the same name: with a
  // name twice, getenv and Python's os.environ read the first one.
  std::vector<std::string> envs;
  const auto name_of = [](const std::string& entry) {
    return entry.substr(0, entry.find('='));
  };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = name_of(entry);
    const bool replaced = std::any_of(
        env.begin(), env.end(),
        [&](const std::string& given) { return name_of(given) == name; });
    if (!replaced) envs.push_back(entry);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> c_env;
  for (auto& e : envs) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  int out[2] = {-1, -1};
  if (capture && pipe2(out, O_CLOEXEC) != 0) return false;
  int err_fd = -1;
  if (!stderr_path.empty()) {
    err_fd = open(stderr_path.c_str(),
                  O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (capture) {
      dup2(out[1], STDOUT_FILENO);
      if (merge_stderr) dup2(out[1], STDERR_FILENO);
    }
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    execvpe(c_argv[0], c_argv.data(), c_env.data());
    std::fprintf(stderr, "batonrun: cannot execute %s: %s\n", c_argv[0],
                 std::strerror(errno));
    _exit(127);
  }
  if (capture) close(out[1]);
  if (err_fd >= 0) close(err_fd);
  child.pid = pid;
  child.stdout_fd = capture ? out[0] : -1;
  return true;
}

// Reads `fd` until a line starts with `prefix`; returns the rest of it, or
// "" when the pipe closed or `timeout` passed.
std::string ReadReadyLine(int fd, const std::string& prefix,
                          std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string buffer;
  while (std::chrono::steady_clock::now() < deadline) {
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
    }
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char chunk[512];
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) return "";
    buffer.append(chunk, static_cast<size_t>(n));
  }
  return "";
}

// Copies `fd` to stdout line by line, each line prefixed with `tag`.
void PrefixLines(int fd, std::string tag) {
  std::string line;
  char chunk[4096];
  const auto flush = [&] {
    std::lock_guard<std::mutex> lock(output_mu);
    std::fprintf(stdout, "[%s] %s\n", tag.c_str(), line.c_str());
    std::fflush(stdout);
    line.clear();
  };
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (chunk[i] == '\n') {
        flush();
      } else {
        line.push_back(chunk[i]);
      }
    }
  }
  if (!line.empty()) flush();
  close(fd);
}

std::string Describe(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

// "1 time", "3 times".
std::string Times(size_t n) {
  return absl::StrCat(n, n == 1 ? " time" : " times");
}

bool Failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Members of `job` as the coordinator reports them (0 while unknown).
int Members(StatusClient& status, const std::string& job) {
  absl::StatusOr<v1::JobStatus> job_status = status.GetJob(job);
  return job_status.ok() ? job_status->members_size() : 0;
}

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
  bool StartTrainers(int node, const std::string& socket, int first_rank,
                     bool exact_rank);
  // SIGTERM to the given children, SIGKILL after the grace period.
  void Stop(bool trainers);
  // Marks the child `pid` as ended; the child, or nullptr when not ours.
  Child* Reap(pid_t pid, int status);
  std::string CoordinatorLog() const { return dir_ + "/coordinator.log"; }

  std::vector<std::string> command_;
  std::string dir_;
  std::string coordinator_;
  // torch.distributed's rendezvous port (MASTER_PORT), embedded clusters.
  int master_port_ = 0;
  std::vector<Child> children_;
  std::vector<std::thread> copiers_;
  bool early_exit_ = false;
  // When the embedded coordinator was restarted, the last minute's.
  std::deque<std::chrono::steady_clock::time_point> restarts_;
  size_t restart_count_ = 0;
};

std::string Launcher::StartCoordinator(const std::string& listen,
                                       Child& coordinator, std::string& ended) {
  const std::string bin = SelfDir() + "/baton-coordinator";
  coordinator.name = "coordinator";
  coordinator.coordinator = true;
  std::vector<std::string> argv = {bin, "--listen=" + listen};
  for (const std::string& f : std::vector<std::string>(
           absl::StrSplit(FLAGS_coordinator_flags, ' ', absl::SkipEmpty()))) {
    argv.emplace_back(f);
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
  Child coordinator;
  std::string ended;
  coordinator_ = StartCoordinator("127.0.0.1:0", coordinator, ended);
  if (coordinator.pid > 0) children_.push_back(coordinator);
  if (coordinator_.empty()) {
    Say("the coordinator " + ended + "; see " + CoordinatorLog());
    return false;
  }
  absl::StatusOr<int> master_port = batonrun::ChooseMasterPort();
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

bool Launcher::StartTrainers(int node, const std::string& socket,
                             int first_rank, bool exact_rank) {
  const int p = FLAGS_procs_per_node;
  for (int local = 0; local < p; ++local) {
    Child trainer;
    trainer.trainer = true;
    const int rank = first_rank + local;
    trainer.name = exact_rank ? absl::StrCat("rank ", rank)
                              : absl::StrCat("local rank ", local);
    std::vector<std::string> env = {
        "BATON_AGENT_SOCKET=" + socket,
        "BATON_JOB=" + FLAGS_job,
        absl::StrCat("LOCAL_RANK=", local),
        absl::StrCat("LOCAL_WORLD_SIZE=", p),
        absl::StrCat("BATON_NODES=", FLAGS_nodes),
        absl::StrCat("WORLD_SIZE=", FLAGS_nodes * p),
    };
    if (exact_rank) env.push_back(absl::StrCat("RANK=", rank));
    if (master_port_ != 0) {
      // The same on every trainer: rank 0 hosts torch's store there.
      env.push_back("MASTER_ADDR=127.0.0.1");
      env.push_back(absl::StrCat("MASTER_PORT=", master_port_));
    }
    const std::string coordinator =
        coordinator_.empty() ? FLAGS_coordinator : coordinator_;
    if (!coordinator.empty()) env.push_back("BATON_COORDINATOR=" + coordinator);
    if (!Spawn(trainer, command_, env, true, true, "")) {
      Say("cannot start " + command_[0]);
      return false;
    }
    const std::string tag = exact_rank ? std::to_string(rank)
                                       : absl::StrCat("node", node, ".", local);
    copiers_.emplace_back(PrefixLines, trainer.stdout_fd, tag);
    children_.push_back(trainer);
  }
  return true;
}

Child* Launcher::Reap(pid_t pid, int status) {
  for (Child& c : children_) {
    if (c.pid == pid) {
      c.done = true;
      c.status = status;
      return &c;
    }
  }
  return nullptr;
}

void Launcher::Stop(bool trainers) {
  for (Child& c : children_) {
    if (!c.done && c.trainer == trainers) kill(c.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(FLAGS_stop_grace_ms);
  for (;;) {
    bool left = false;
    for (Child& c : children_) {
      if (c.done || c.trainer != trainers) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.done = true;
        c.status = status;
      } else {
        left = true;
      }
    }
    if (!left) return;
    if (std::chrono::steady_clock::now() > deadline) {
      for (Child& c : children_) {
        if (!c.done && c.trainer == trainers) kill(c.pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::atomic<int> received_signal{0};

int Launcher::Run(const std::vector<std::string>& command) {
  command_ = command;
  const bool embedded = FLAGS_coordinator.empty();
  bool ok = true;
  if (embedded) {
    ok = StartCluster();
    std::unique_ptr<StatusClient> status;
    if (ok) {
      status = std::make_unique<StatusClient>(coordinator_, absl::Seconds(2));
    }
    for (int node = 1; ok && node <= FLAGS_nodes; ++node) {
      const std::string socket = absl::StrCat(dir_, "/agent", node, ".sock");
      Child agent;
      agent.name = absl::StrCat("agent n", node);
      std::vector<std::string> argv = {
          SelfDir() + "/baton-agent", "--coordinator=" + coordinator_,
          absl::StrCat("--node=n", node), "--socket=" + socket};
      for (const std::string& f : std::vector<std::string>(
               absl::StrSplit(FLAGS_agent_flags, ' ', absl::SkipEmpty()))) {
        argv.emplace_back(f);
      }
      const std::string log = absl::StrCat(dir_, "/agent", node, ".log");
      ok = Spawn(agent, argv, {}, true, false, log) &&
           !ReadReadyLine(agent.stdout_fd, "baton-agent ",
                          std::chrono::seconds(10))
                .empty();
      children_.push_back(agent);
      if (!ok) {
        Say(absl::StrCat("agent n", node, " did not start; see ", log));
        break;
      }
      const int first = (node - 1) * FLAGS_procs_per_node;
      ok = StartTrainers(node, socket, first, /*exact_rank=*/true);
      if (early_exit_) break;
      // The next node starts once this one joined: node ranks follow join
      // order, so ranks are exactly as announced in RANK.
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (ok && node < FLAGS_nodes && Members(*status, FLAGS_job) < node &&
             received_signal == 0) {
        int status = 0;
        const pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
          Child* ended = Reap(pid, status);
          if (ended != nullptr && ended->coordinator &&
              RestartCoordinator(*ended)) {
            continue;
          }
          // Something else ended before its node joined: report it below.
          early_exit_ = true;
          break;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          Say(absl::StrCat("node n", node, " did not join job \"", FLAGS_job,
                           "\" within 60 s; see ", dir_));
          ok = false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } else {
    ok = StartTrainers(1, FLAGS_socket, 0, /*exact_rank=*/false);
  }

  int exit_code = ok ? 0 : 1;
  std::string failure;
  for (const Child& c : children_) {
    if (c.done && (Failed(c.status) || !c.trainer)) {
      failure = absl::StrCat(c.name, " (pid ", c.pid, ") ", Describe(c.status),
                             c.trainer ? "" : "; its log is in " + dir_);
    }
  }
  if (!failure.empty()) ok = false;
  // Wait for the trainers; the first failure stops the others.
  while (ok) {
    bool running = false;
    for (const Child& c : children_) running |= c.trainer && !c.done;
    if (!running) break;
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
    Child* ended = Reap(pid, status);
    if (ended == nullptr) continue;
    if (ended->coordinator && RestartCoordinator(*ended)) continue;
    if (ended->trainer && Failed(status)) {
      failure =
          absl::StrCat(ended->name, " (pid ", pid, ") ", Describe(status));
    } else if (!ended->trainer) {
      failure = absl::StrCat(ended->name, " (pid ", pid, ") ", Describe(status),
                             "; its log is in ", dir_);
    }
    if (!failure.empty()) break;
  }
  Stop(/*trainers=*/true);
  Stop(/*trainers=*/false);
  for (std::thread& t : copiers_) t.join();
  if (!failure.empty()) {
    Say(failure + "; stopped the others");
    return 1;
  }
  if (exit_code == 0 && embedded && restart_count_ > 0) {
    Say(absl::StrCat("the coordinator was restarted ", Times(restart_count_),
                     "; kept its log ", CoordinatorLog()));
  } else if (exit_code == 0 && embedded) {
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }
  return exit_code;
}

}  // namespace
}  // namespace baton

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
      "batonrun --nodes N --procs-per-node P [--coordinator ADDR] -- CMD ...");
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
  // Signals go to a thread that records them; the main loop forwards.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    baton::received_signal = sig;
  }).detach();
  return baton::Launcher().Run(command);
}
