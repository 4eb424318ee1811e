#include "tools/batonrun/node_supervisor.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "tools/batonrun/console.h"

namespace baton::batonrun {
namespace {

// How long a restart waits for the coordinator to drop the node's old
// instance: a killed agent's session ends at once, a hung one's after the
// coordinator's liveness timeout (6 s by default).
constexpr std::chrono::seconds kLeaveWait{15};
constexpr std::chrono::seconds kAgentStart{10};

std::string Times(int n) {
  return absl::StrCat(n, n == 1 ? " time" : " times");
}

}  // namespace

NodeSupervisor::NodeSupervisor(Options options) : options_(std::move(options)) {
  const int count = options_.embedded ? options_.nodes : 1;
  nodes_.resize(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    nodes_[i].index = i + 1;
    nodes_[i].name = absl::StrCat("n", i + 1);
  }
}

NodeSupervisor::~NodeSupervisor() { AwaitOutput(); }

void NodeSupervisor::AwaitOutput() {
  for (std::thread& t : output_) t.join();
  output_.clear();
}

std::string NodeSupervisor::Socket(const Node& node) const {
  return options_.embedded
             ? absl::StrCat(options_.dir, "/agent", node.index, ".sock")
             : options_.socket;
}

std::string NodeSupervisor::AgentLog(const Node& node) const {
  return absl::StrCat(options_.dir, "/agent", node.index, ".log");
}

bool NodeSupervisor::Start(int index) {
  Node& node = nodes_[static_cast<size_t>(index - 1)];
  if (options_.embedded) {
    const std::string failed = StartAgent(node);
    if (!failed.empty()) {
      Say(absl::StrCat("agent ", node.name, " did not start; see ",
                       AgentLog(node)));
      return false;
    }
  }
  const std::string failed = StartTrainers(node);
  if (!failed.empty()) Say(failed);
  return failed.empty();
}

std::string NodeSupervisor::StartAgent(Node& node) {
  if (node.agent.stdout_fd >= 0) close(node.agent.stdout_fd);
  node.agent = Child();
  node.agent.name =
      node.restart == 0
          ? absl::StrCat("agent ", node.name)
          : absl::StrCat("agent ", node.name, " (restart ", node.restart, ")");
  std::vector<std::string> argv = {
      options_.agent_binary, "--coordinator=" + options_.coordinator,
      "--node=" + node.name, "--socket=" + Socket(node)};
  argv.insert(argv.end(), options_.agent_flags.begin(),
              options_.agent_flags.end());
  const std::string log = AgentLog(node);
  if (!Spawn(node.agent, argv, {}, true, false, log)) {
    return absl::StrCat("its agent cannot be started (", options_.agent_binary,
                        ": ", std::strerror(errno), ")");
  }
  const bool ready = !ReadReadyLine(node.agent.stdout_fd, "baton-agent ",
                                    kAgentStart, options_.interrupted)
                          .empty();
  if (ready) return "";
  return absl::StrCat("its agent did not start within ", kAgentStart.count(),
                      " s; see ", log);
}

std::string NodeSupervisor::StartTrainers(Node& node) {
  const int p = options_.procs_per_node;
  // A restarted node's ranks and world are the coordinator's to choose.
  const bool exact_rank = options_.embedded && node.restart == 0;
  for (int local = 0; local < p; ++local) {
    Child trainer;
    const int rank = (node.index - 1) * p + local;
    std::string tag;
    if (exact_rank) {
      trainer.name = absl::StrCat("rank ", rank);
      tag = std::to_string(rank);
    } else if (node.restart == 0) {
      trainer.name = absl::StrCat("local rank ", local);
      tag = absl::StrCat("node", node.index, ".", local);
    } else {
      trainer.name =
          absl::StrCat("local rank ", local, " (restart ", node.restart, ")");
      tag = absl::StrCat("node", node.index, ".", local, " restart ",
                         node.restart);
    }
    std::vector<std::string> env = {
        "BATON_AGENT_SOCKET=" + Socket(node),
        "BATON_JOB=" + options_.job,
        absl::StrCat("LOCAL_RANK=", local),
        absl::StrCat("LOCAL_WORLD_SIZE=", p),
        absl::StrCat("BATON_NODES=", options_.nodes),
        absl::StrCat("BATON_MIN_NODES=", options_.min_nodes),
        // What torchrun sets besides the ranks, for scripts that read it.
        "TORCHELASTIC_RUN_ID=" + options_.job,
        "ROLE_NAME=default",
        absl::StrCat("TORCHELASTIC_RESTART_COUNT=", node.restart),
        absl::StrCat("TORCHELASTIC_MAX_RESTARTS=", options_.restarts),
    };
    // A pod of an elastic job may join a job of any size (--coordinator):
    // only a first life of an embedded cluster knows the size for sure.
    if (node.restart == 0 && (options_.embedded || !elastic())) {
      const int world = options_.nodes * p;
      env.push_back(absl::StrCat("WORLD_SIZE=", world));
      env.push_back(absl::StrCat("ROLE_WORLD_SIZE=", world));
      env.push_back(absl::StrCat("GROUP_WORLD_SIZE=", options_.nodes));
    } else {
      // Unset (Spawn drops a name without '='), also when inherited.
      for (const char* name : {"WORLD_SIZE", "ROLE_WORLD_SIZE",
                               "GROUP_WORLD_SIZE", "RANK", "ROLE_RANK"}) {
        env.push_back(name);
      }
    }
    if (exact_rank) {
      // GROUP_RANK places the node (the job's first seal orders the nodes
      // by it), so RANK holds whatever order the agents join in.
      env.push_back(absl::StrCat("RANK=", rank));
      env.push_back(absl::StrCat("ROLE_RANK=", rank));
      env.push_back(absl::StrCat("GROUP_RANK=", node.index - 1));
    } else if (options_.embedded) {
      // A restarted node joins the running job where the coordinator
      // places it.
      env.push_back("GROUP_RANK");
    }
    if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr &&
        std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) {
      // glibc keeps freed memory for the next allocation instead of
      // mapping fresh pages for every large tensor: a new 64 MiB result
      // (out-of-place push_pull, any fresh activation) costs ~60 ms of
      // page faults here otherwise (docs/benchmarks.md, "Out of place").
      env.push_back("MALLOC_MMAP_THRESHOLD_=4294967296");
      env.push_back("MALLOC_TRIM_THRESHOLD_=4294967296");
    }
    if (options_.master_port != 0) {
      // The same on every trainer: rank 0 hosts torch's store there.
      env.push_back("MASTER_ADDR=127.0.0.1");
      env.push_back(absl::StrCat("MASTER_PORT=", options_.master_port));
    }
    if (!options_.coordinator.empty()) {
      env.push_back("BATON_COORDINATOR=" + options_.coordinator);
    }
    if (!Spawn(trainer, options_.command, env, true, true, "")) {
      return "cannot start " + options_.command[0];
    }
    output_.emplace_back(PrefixLines, trainer.stdout_fd, tag);
    node.trainers.push_back(std::move(trainer));
  }
  return "";
}

NodeSupervisor::Node* NodeSupervisor::NodeOf(pid_t pid, Child** child) {
  for (Node& node : nodes_) {
    if (node.agent.pid == pid && !node.agent.done) {
      *child = &node.agent;
      return &node;
    }
    for (Child& trainer : node.trainers) {
      if (trainer.pid == pid && !trainer.done) {
        *child = &trainer;
        return &node;
      }
    }
  }
  return nullptr;
}

NodeSupervisor::Outcome NodeSupervisor::OnExit(pid_t pid, int status) {
  Child* child = nullptr;
  Node* node = NodeOf(pid, &child);
  if (node == nullptr) return Outcome::kGoOn;
  child->done = true;
  child->status = status;
  const bool agent = child == &node->agent;
  if (!agent && !Failed(status)) return Outcome::kGoOn;
  std::string why =
      absl::StrCat(child->name, " (pid ", pid, ") ", Describe(status));
  // With --coordinator the node is this pod: a dead trainer fails the
  // launcher, so that whatever started it (Kubernetes) starts it again and
  // it rejoins the elastic job.
  if (!elastic() || !options_.embedded) {
    if (agent) absl::StrAppend(&why, "; its log is in ", options_.dir);
    failure_ = std::move(why);
    return Outcome::kFailed;
  }
  if (agent) {
    bool finished = true;
    for (const Child& trainer : node->trainers) {
      finished &= trainer.done && !Failed(trainer.status);
    }
    // Its work is done: nothing is lost when the agent goes now.
    if (finished) return Outcome::kGoOn;
  }
  return NodeDied(*node, std::move(why));
}

NodeSupervisor::Outcome NodeSupervisor::NodeDied(Node& node, std::string why) {
  const v1::JobState state = JobState();
  if (state == v1::JOB_STATE_FORMING) {
    // The coordinator forms a job with all its nodes: without this one the
    // others would wait for it. A restarted node would join after nodes
    // started later, so their RANK would no longer be exact.
    failure_ = absl::StrCat("node ", node.name, " died before job \"",
                            options_.job, "\" formed: ", why,
                            "; a job restarts or loses nodes only once it "
                            "has formed with all ",
                            options_.nodes, " nodes");
    return Outcome::kFailed;
  }
  // A job that ended has nothing to restart a node into: a new agent's
  // join would start a new run of the job's name.
  const bool ended =
      state == v1::JOB_STATE_FINISHED || state == v1::JOB_STATE_FAILED;
  for (;;) {
    StopNode(node);
    if (ended || restarts_used_ >= options_.restarts) break;
    ++restarts_used_;
    ++node.restarts;
    node.restart = restarts_used_;
    const std::string restart =
        absl::StrCat("restart ", restarts_used_, " of ", options_.restarts);
    Say(absl::StrCat("node ", node.name, " died: ", why, "; restarting it (",
                     restart, ")"));
    // The agent's log goes on in the same file; the line marks where.
    if (FILE* log = std::fopen(AgentLog(node).c_str(), "a")) {
      std::fprintf(log, "batonrun: node %s died: %s; restarting it (%s)\n",
                   node.name.c_str(), why.c_str(), restart.c_str());
      std::fclose(log);
    }
    if (!AwaitNodeLeft(node)) return Outcome::kInterrupted;
    node.trainers.clear();
    std::string failed = StartAgent(node);
    if (failed.empty()) failed = StartTrainers(node);
    if (options_.interrupted && options_.interrupted()) {
      StopNode(node);
      return Outcome::kInterrupted;
    }
    if (failed.empty()) return Outcome::kGoOn;
    why = absl::StrCat("restart ", restarts_used_, " failed: ", failed);
  }
  node.lost = true;
  node.lost_why = why;
  ++lost_;
  const int left = options_.nodes - lost_;
  std::string text = absl::StrCat("node ", node.name, " lost: ", why);
  if (ended) {
    absl::StrAppend(&text, "; not restarted: job \"", options_.job,
                    "\" has ended at the coordinator");
  } else if (options_.restarts > 0) {
    absl::StrAppend(&text, "; no restarts left (--restarts=", options_.restarts,
                    ")");
  }
  if (left < options_.min_nodes) {
    std::vector<std::string> lost;
    for (const Node& n : nodes_) {
      if (n.lost) lost.push_back(n.name);
    }
    failure_ =
        absl::StrCat(text, "; ", left, " of ", options_.nodes,
                     " nodes left, fewer than --min-nodes=", options_.min_nodes,
                     " (lost: ", absl::StrJoin(lost, ", "),
                     "); the agents' logs are in ", options_.dir);
    return Outcome::kFailed;
  }
  Say(absl::StrCat(text, "; going on with ", left, " of ", options_.nodes,
                   " nodes (--min-nodes=", options_.min_nodes, ")"));
  return Outcome::kGoOn;
}

void NodeSupervisor::StopNode(Node& node) {
  std::vector<Child*> trainers;
  for (Child& trainer : node.trainers) trainers.push_back(&trainer);
  Stop(trainers, options_.stop_grace);
  Stop({&node.agent}, options_.stop_grace);
}

StatusClient& NodeSupervisor::Coordinator() {
  if (status_ == nullptr) {
    // A cluster of the user's speaks TLS when the --tls_* flags say so; the
    // embedded one is plaintext on loopback.
    status_ = std::make_unique<StatusClient>(
        options_.coordinator, absl::Seconds(2),
        options_.embedded ? nullptr : options_.credentials);
  }
  return *status_;
}

v1::JobState NodeSupervisor::JobState() {
  const absl::StatusOr<v1::JobStatus> job = Coordinator().GetJob(options_.job);
  if (job.ok()) return job->state();
  // No node joined yet (nodes start at once; an ended job stays known for
  // the coordinator's --job_retention, longer than any batonrun waits).
  if (job.status().code() == absl::StatusCode::kNotFound) {
    return v1::JOB_STATE_FORMING;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

bool NodeSupervisor::AwaitNodeLeft(const Node& node) {
  const auto deadline = std::chrono::steady_clock::now() + kLeaveWait;
  while (std::chrono::steady_clock::now() < deadline) {
    if (options_.interrupted && options_.interrupted()) return false;
    const absl::StatusOr<v1::JobStatus> job =
        Coordinator().GetJob(options_.job);
    // NOT_FOUND: the job ended and is gone, and the node with it.
    bool listed =
        !job.ok() && job.status().code() != absl::StatusCode::kNotFound;
    if (job.ok()) {
      for (const v1::MemberStatus& member : job->members()) {
        listed |= member.node_name() == node.name;
      }
    }
    if (!listed) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Say(absl::StrCat("node ", node.name, " is still a member of job \"",
                   options_.job, "\" at the coordinator after ",
                   kLeaveWait.count(),
                   " s; starting it again anyway (its new agent may be "
                   "refused; see ",
                   AgentLog(node), ")"));
  return true;
}

bool NodeSupervisor::TrainersRunning() const {
  for (const Node& node : nodes_) {
    if (node.lost) continue;
    for (const Child& trainer : node.trainers) {
      if (!trainer.done) return true;
    }
  }
  return false;
}

std::vector<Child*> NodeSupervisor::RunningTrainers() {
  std::vector<Child*> running;
  for (Node& node : nodes_) {
    for (Child& trainer : node.trainers) {
      if (!trainer.done && trainer.pid > 0) running.push_back(&trainer);
    }
  }
  return running;
}

std::vector<Child*> NodeSupervisor::RunningAgents() {
  std::vector<Child*> running;
  for (Node& node : nodes_) {
    if (!node.agent.done && node.agent.pid > 0) running.push_back(&node.agent);
  }
  return running;
}

std::string NodeSupervisor::Summary() const {
  std::vector<std::string> restarted;
  std::vector<std::string> lost;
  for (const Node& node : nodes_) {
    if (node.restarts > 0) {
      restarted.push_back(absl::StrCat(node.name, " ", Times(node.restarts)));
    }
    if (node.lost) {
      lost.push_back(absl::StrCat(node.name, " after ", node.lost_why));
    }
  }
  if (restarted.empty() && lost.empty()) return "";
  std::string summary =
      lost.empty() ? absl::StrCat("finished on all ", options_.nodes, " nodes")
                   : absl::StrCat("finished on ", options_.nodes - lost_,
                                  " of ", options_.nodes, " nodes");
  if (!restarted.empty()) {
    absl::StrAppend(&summary, "; restarted ", absl::StrJoin(restarted, ", "));
  }
  if (!lost.empty()) {
    absl::StrAppend(&summary,
                    "; lost and not replaced: ", absl::StrJoin(lost, ", "));
  }
  return summary;
}

}  // namespace baton::batonrun
