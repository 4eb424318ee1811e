#pragma once

// The nodes batonrun runs, and what happens when one dies. In an embedded
// cluster they are n1..nN, each an agent and --procs-per-node trainers;
// with --coordinator, this machine's one node (its trainers; the agent is
// not batonrun's).
//
// A node dies when its agent ends, or one of its trainers ends with
// anything but exit code 0. What follows depends on the job:
// - Not elastic (min_nodes == nodes and no restarts): the job fails, as
//   batonrun always did (the caller stops the rest and exits 1).
// - Restarts left (--restarts, embedded only): the node's remaining
//   processes are stopped, batonrun waits (bounded) until the coordinator
//   no longer lists the node in the job, then starts a new agent with the
//   same name, socket and log, and new trainers without RANK and
//   WORLD_SIZE: the coordinator places the node again, and ranks and the
//   world may have changed.
// - Otherwise the node is lost: its remaining processes are stopped and
//   the survivors go on, while at least min_nodes nodes are not lost; one
//   loss more fails the job.
// A node that ends its work (every trainer exited 0) is not lost. A node
// that dies before the job first formed (the coordinator forms it with all
// its nodes) fails the job, elastic or not; one that dies after the job
// ended at the coordinator is lost, not restarted.
//
// Used from batonrun's main thread only; not thread-safe.
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "baton/status_client.h"
#include "tools/batonrun/child.h"

namespace baton::batonrun {

class NodeSupervisor {
 public:
  struct Options {
    int nodes = 1;
    int procs_per_node = 1;
    std::string job;
    // Nodes the job needs; `nodes` for a job that is not elastic.
    int min_nodes = 1;
    // Node restarts allowed in the whole job; embedded clusters only.
    int restarts = 0;
    std::chrono::milliseconds stop_grace{5000};
    // The coordinator's address, for the agents and trainers
    // (BATON_COORDINATOR) and for the restarts' membership checks.
    std::string coordinator;
    // How to reach it (--tls_*, --token_file); null: plaintext, as the
    // embedded cluster is.
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    // An embedded cluster: the nodes' agent sockets and logs are in `dir`,
    // the agents are `agent_binary` with `agent_flags`. Otherwise the one
    // node's trainers use the agent at `socket`.
    bool embedded = true;
    std::string dir;
    std::string agent_binary;
    std::vector<std::string> agent_flags;
    std::string socket;
    // torch.distributed's rendezvous port (MASTER_PORT); 0: none.
    int master_port = 0;
    std::vector<std::string> command;
    // True once batonrun was told to stop; asked while a restart waits.
    std::function<bool()> interrupted;
  };

  enum class Outcome {
    kGoOn,         // nothing failed, or a node was restarted or lost
    kFailed,       // the job fails: failure() says why
    kInterrupted,  // interrupted() during a restart; that node is stopped
  };

  explicit NodeSupervisor(Options options);
  // Calls AwaitOutput().
  ~NodeSupervisor();
  NodeSupervisor(const NodeSupervisor&) = delete;
  NodeSupervisor& operator=(const NodeSupervisor&) = delete;

  bool elastic() const {
    return options_.min_nodes < options_.nodes || options_.restarts > 0;
  }

  // Starts node `node` (1..nodes; 1 with --coordinator): its agent, once
  // that serves (10 s at most), then its trainers with exact ranks. False,
  // said why, when something could not start.
  bool Start(int node);

  // The child `pid` ended with `status` while the job runs: restarts or
  // loses its node, or fails the job, as the class comment says. kGoOn for
  // a pid that is not a node's.
  Outcome OnExit(pid_t pid, int status);
  // Why the job failed, after kFailed.
  const std::string& failure() const { return failure_; }

  // Whether a trainer of a node that is not lost still runs.
  bool TrainersRunning() const;
  // The children still running, for the caller to stop.
  std::vector<Child*> RunningTrainers();
  std::vector<Child*> RunningAgents();

  // Waits until the trainers' output is copied: call once they ended (and
  // whatever they started that shares their output ended too).
  void AwaitOutput();

  // After a run that did not fail: one line naming the nodes restarted and
  // those lost and not replaced; "" when every node ran through.
  std::string Summary() const;

 private:
  struct Node {
    int index = 0;     // 1..nodes
    std::string name;  // "n2"
    Child agent;       // embedded clusters only
    std::vector<Child> trainers;
    // The job's restart that started this life (1..); 0: the first life.
    int restart = 0;
    int restarts = 0;  // this node's, for the summary
    bool lost = false;
    std::string lost_why;  // "rank 3 (pid P) exited with code 1"
  };

  std::string Socket(const Node& node) const;
  std::string AgentLog(const Node& node) const;
  // Starts the node's agent for its current life; "" or why not.
  std::string StartAgent(Node& node);
  // Starts the node's trainers for its current life; "" or why not.
  std::string StartTrainers(Node& node);
  // The node died, `why`: restarts it or loses it (see the class comment).
  Outcome NodeDied(Node& node, std::string why);
  // Stops what is left of the node: its trainers, then its agent.
  void StopNode(Node& node);
  // Waits (bounded) until the coordinator does not list the node in the
  // job; false when interrupted.
  bool AwaitNodeLeft(const Node& node);
  // The job's state at the coordinator: FORMING also while no node joined
  // it; JOB_STATE_UNSPECIFIED when the coordinator cannot be asked.
  v1::JobState JobState();
  StatusClient& Coordinator();
  Node* NodeOf(pid_t pid, Child** child);

  const Options options_;
  std::vector<Node> nodes_;
  std::vector<std::thread> output_;
  std::unique_ptr<StatusClient> status_;
  int restarts_used_ = 0;
  int lost_ = 0;
  std::string failure_;
};

}  // namespace baton::batonrun
