#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "baton/client.h"
#include "tests/integration/child_process.h"
#include "tests/integration/coordinator_process.h"

namespace baton {

// A coordinator and N baton-agent processes on loopback, each agent with its
// own unix socket and launch trace, plus baton-test-trainer processes
// attached to them: the whole product on one machine, for the agent's
// integration tests. Files live in a fresh directory under the test's temp
// dir.
//
// Not thread-safe: use from the test's thread.
class LocalCluster {
 public:
  LocalCluster();
  ~LocalCluster();

  // Starts the coordinator with `coordinator_flags`, then one agent per
  // entry of `nodes` (named n1, n2, ...) with `agent_flags`, where "{node}"
  // stands for the agent's node name.
  absl::Status Start(int nodes,
                     const std::vector<std::string>& coordinator_flags = {},
                     const std::vector<std::string>& agent_flags = {});

  // Starts trainers for job `job`: local_sizes[k] trainers on node k+1, with
  // `flags` for baton-test-trainer and `env` added to their environment.
  // Returns them in (node, local rank) order.
  absl::Status StartTrainers(const std::string& job,
                             const std::vector<int>& local_sizes,
                             const std::vector<std::string>& flags,
                             const std::vector<std::string>& env = {});

  // Options for an in-process trainer (the client library) of job `job` on
  // node `node`: local rank `local_rank` of `local_size` there, in a job of
  // `nodes` nodes. Attaching waits up to 20 s for the job to form.
  ClientOptions TrainerOptions(int node, const std::string& job,
                               int local_rank = 0, int local_size = 1,
                               int nodes = 1) const;

  // Waits for every trainer to end; returns how each ended.
  std::vector<ProcessExit> WaitTrainers(absl::Duration timeout);

  // The launch trace of `job` on node `node` (1-based), one line per launch.
  std::vector<std::string> Launches(const std::string& job, int node) const;

  CoordinatorProcess& coordinator() { return coordinator_; }
  ChildProcess& agent(int node) { return *agents_[node - 1]; }
  ChildProcess& trainer(size_t i) { return *trainers_[i]; }
  size_t trainer_count() const { return trainers_.size(); }
  std::string node_name(int node) const;
  std::string socket(int node) const;
  const std::string& dir() const { return dir_; }

  // Restarts a coordinator killed or terminated before, on the same port.
  absl::Status RestartCoordinator();

  static std::string AgentBinary();
  static std::string TrainerBinary();

 private:
  std::string dir_;
  std::vector<std::string> coordinator_flags_;
  CoordinatorProcess coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> agents_;
  std::vector<std::unique_ptr<ChildProcess>> trainers_;
};

// Trainer output for test messages.
std::string Describe(ChildProcess& trainer, const ProcessExit& exit);

}  // namespace baton
