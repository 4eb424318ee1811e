#pragma once

// A Coordinator driven message by message on a FakeClock, with agents whose
// channels record what the coordinator sent them: the fixture of the
// coordinator's unit tests. The recording agents themselves
// (recording_agent.h) carry no gtest, so the coordinator's fuzzer
// (tests/fuzz/coordinator_fuzz.cc) drives the coordinator with them too.

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/recording_agent.h"

namespace baton::coordinator {

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() { Restart(); }

  // A fresh coordinator process: no state survives.
  void Restart() {
    coordinator_ = std::make_unique<Coordinator>(options_, &clock_, &secrets_);
  }

  // `identity`: what the transport verified (mutual TLS); none by default.
  Agent Connect(const std::string& node, const std::string& instance = "",
                PeerIdentity identity = {}) {
    Agent agent;
    agent.node = node;
    agent.id = SessionId(next_session_++);
    agent.channel = std::make_shared<RecordingChannel>();
    coordinator_->OnSessionOpened(agent.id, agent.channel, std::move(identity));
    v1::AgentMessage hello;
    hello.mutable_hello()->set_node_name(node);
    hello.mutable_hello()->set_agent_instance(instance.empty() ? "i-" + node
                                                               : instance);
    Send(agent, hello);
    return agent;
  }

  void Send(Agent& agent, v1::AgentMessage message) {
    message.set_seq(++agent.seq);
    coordinator_->OnAgentMessage(agent.id, message);
  }

  // `node_rank`: the launcher's (JoinJob.node_rank); -1: none.
  void Join(Agent& agent, const std::string& job, int local_size,
            int expected_nodes, int min_nodes = 0, int node_rank = -1) {
    v1::AgentMessage message;
    auto* join = message.mutable_join();
    join->set_job(job);
    join->set_data_address(agent.node + ".example:7000");
    join->set_local_size(local_size);
    join->set_expected_nodes(expected_nodes);
    join->set_min_nodes(min_nodes);
    if (node_rank >= 0) join->set_node_rank(node_rank);
    Send(agent, message);
  }

  // `agent` leaves generation `generation` of `job`: finished, or for
  // `reason` (a failure) when that is not empty.
  void Leave(Agent& agent, const std::string& job, int64_t generation,
             const std::string& reason = "") {
    v1::AgentMessage message;
    auto* leave = message.mutable_leave();
    leave->set_job(job);
    leave->set_generation(generation);
    leave->set_finished(reason.empty());
    leave->set_reason(reason);
    Send(agent, message);
  }

  // Connects nodes n0, n1, ... with local_sizes[k] trainers on node k and
  // joins each to `job`, which expects them all.
  std::vector<Agent> JoinNodes(const std::string& job,
                               const std::vector<int>& local_sizes) {
    std::vector<Agent> agents;
    for (size_t k = 0; k < local_sizes.size(); ++k) {
      agents.push_back(Connect(absl::StrCat("n", k)));
    }
    for (size_t k = 0; k < local_sizes.size(); ++k) {
      Join(agents[k], job, local_sizes[k],
           static_cast<int>(local_sizes.size()));
    }
    return agents;
  }

  // `agent`'s trainers reached a commit in `generation` of `job` while
  // nodes wait to join (baton.torch.elastic): admit them.
  void AdmitJoins(Agent& agent, const std::string& job, int64_t generation) {
    v1::AgentMessage message;
    message.mutable_admit_joins()->set_job(job);
    message.mutable_admit_joins()->set_generation(generation);
    Send(agent, message);
  }

  // Nodes n0..n2 of "job" (min_nodes 2); n2 crashes, so generation 2 runs
  // with n0 and n1, and n3 joins: it waits for a commit. Returns n0, n1
  // and n3.
  std::tuple<Agent, Agent, Agent> StartWaitingJoin() {
    Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
    for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, 2);
    coordinator_->OnSessionClosed(c.id, "crashed");
    Agent d = Connect("n3");
    Join(d, "job", 1, 3, 2);
    return {a, b, d};
  }

  void Heartbeat(Agent& agent) {
    v1::AgentMessage message;
    message.mutable_heartbeat();
    Send(agent, message);
  }

  // Advances the clock in tick steps, heartbeating `alive` agents every
  // second, until `done` or `limit`. Returns the time it took.
  absl::Duration RunUntil(std::vector<Agent*> alive,
                          const std::function<bool()>& done,
                          absl::Duration limit) {
    absl::Duration elapsed;
    absl::Duration since_heartbeat;
    while (!done() && elapsed < limit) {
      clock_.Advance(options_.tick_interval);
      elapsed += options_.tick_interval;
      since_heartbeat += options_.tick_interval;
      if (since_heartbeat >= absl::Seconds(1)) {
        for (Agent* agent : alive) Heartbeat(*agent);
        since_heartbeat = absl::ZeroDuration();
      }
      coordinator_->Tick();
    }
    return elapsed;
  }

  v1::JobStatus Status(const std::string& job) {
    absl::StatusOr<v1::JobStatus> status = coordinator_->GetJob(job);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  FakeClock clock_;
  // Deterministic data-plane secrets; one source across restarts, so every
  // seal draws a different one.
  CountingSecretSource secrets_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  uint64_t next_session_ = 1;
};

}  // namespace baton::coordinator
