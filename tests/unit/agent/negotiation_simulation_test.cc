// The negotiation simulation (agent/bench, issue 20): its wire model's
// arithmetic, the message counts of each protocol, and that every simulated
// node decodes the same outcomes and launches the same partitions. Virtual
// time only: nothing here depends on how fast this machine is.
#include "agent/bench/negotiation_simulation.h"

#include <gtest/gtest.h>

#include <vector>

#include "agent/bench/simulated_network.h"
#include "agent/scheduler/negotiation.h"
#include "agent/transport/negotiation_tree.h"

namespace baton::agent::sim {
namespace {

// Records when each message arrives.
class Recorder : public SimulatedReceiver {
 public:
  void OnMessage(const SimulatedMessage& message, double now_us) override {
    arrivals.push_back({message.from, now_us});
  }
  void OnTimer(int, int64_t, double) override {}
  struct Arrival {
    int from;
    double at_us;
  };
  std::vector<Arrival> arrivals;
};

NetworkProfile SimpleProfile() {
  NetworkProfile p;
  p.latency_us = 10;
  p.gbit_per_s = 8;  // one byte per nanosecond: 1000 bytes take 1 us
  p.header_bytes = 0;
  p.send_cpu_us = 0.5;
  p.recv_cpu_us = 0.5;
  return p;
}

TEST(SimulatedNetworkTest, OneMessageTakesCpuTransferAndLatency) {
  Recorder recorder;
  SimulatedNetwork network(2, SimpleProfile(), &recorder);
  network.Send(0, SimulatedMessage{0, 1, 0, 0, nullptr, 1000});
  network.Run();
  ASSERT_EQ(recorder.arrivals.size(), 1u);
  // 0.5 us to hand over, 1 us on the link, 10 us on the wire.
  EXPECT_DOUBLE_EQ(recorder.arrivals[0].at_us, 11.5);
}

TEST(SimulatedNetworkTest, ASendersLinkSerialisesItsMessages) {
  Recorder recorder;
  SimulatedNetwork network(3, SimpleProfile(), &recorder);
  double t = network.Send(0, SimulatedMessage{0, 1, 0, 0, nullptr, 4000});
  network.Send(t, SimulatedMessage{0, 2, 0, 0, nullptr, 4000});
  network.Run();
  ASSERT_EQ(recorder.arrivals.size(), 2u);
  EXPECT_DOUBLE_EQ(recorder.arrivals[0].at_us, 0.5 + 4 + 10);
  // Handed over at 1 us, on the link once the first left it (4.5 us).
  EXPECT_DOUBLE_EQ(recorder.arrivals[1].at_us, 4.5 + 4 + 10);
}

TEST(SimulatedNetworkTest, AReceiversLinkSerialisesWhatArrivesAtOnce) {
  Recorder recorder;
  SimulatedNetwork network(3, SimpleProfile(), &recorder);
  network.Send(0, SimulatedMessage{0, 2, 0, 0, nullptr, 4000});
  network.Send(0, SimulatedMessage{1, 2, 0, 0, nullptr, 4000});
  network.Run();
  ASSERT_EQ(recorder.arrivals.size(), 2u);
  EXPECT_DOUBLE_EQ(recorder.arrivals[0].at_us, 14.5);
  EXPECT_DOUBLE_EQ(recorder.arrivals[1].at_us, 18.5);
}

TEST(SimulatedNetworkTest, ComputeQueuesBehindEarlierWork) {
  Recorder recorder;
  SimulatedNetwork network(1, SimpleProfile(), &recorder);
  EXPECT_DOUBLE_EQ(network.Compute(0, 5, 2), 7);
  EXPECT_DOUBLE_EQ(network.Compute(0, 6, 1), 8);
  EXPECT_DOUBLE_EQ(network.Compute(0, 20, 1), 21);
}

SimulationConfig Config(int nodes, RoundProtocol protocol, int fanout,
                        RoundStarters starters) {
  SimulationConfig c;
  c.nodes = nodes;
  c.protocol = protocol;
  c.fanout = fanout;
  c.starters = starters;
  c.rounds = 4;
  c.network = SimpleProfile();
  c.costs = RoundCosts{1, 0.5, 2, 10};
  return c;
}

int64_t VectorMessageBytes(const SimulationConfig& c) {
  return 8 * (1 + static_cast<int64_t>(
                      Negotiation::VectorSize(c.workload.tensors)));
}

class ProtocolTest : public ::testing::TestWithParam<int> {};

TEST_P(ProtocolTest, AllToAllSendsEveryVectorToEveryOtherNode) {
  const int n = GetParam();
  for (RoundStarters who : {RoundStarters::kLeaf, RoundStarters::kAll}) {
    const SimulationConfig c = Config(n, RoundProtocol::kAllToAll, 0, who);
    const SimulationResult r = Simulate(c);
    EXPECT_EQ(r.messages, int64_t{n} * (n - 1)) << RoundStartersName(who);
    EXPECT_EQ(r.bytes, int64_t{n} * (n - 1) * VectorMessageBytes(c));
    EXPECT_EQ(r.outcome_mismatches, 0);
    EXPECT_EQ(r.launch_mismatches, 0);
    // Round 0 agrees every tensor; a tensor's next step waits until the
    // credit window admitted all of its previous one's partitions.
    EXPECT_GE(r.agreed, c.workload.tensors);
    EXPECT_LT(r.agreed, 4 * c.workload.tensors);
    EXPECT_GT(r.first_round_us, 0);
  }
}

// TcpTreeRounds' messages: on an edge to a leaf, the parent's join word,
// the leaf's join with its vector, the result; on any other edge a join
// word each way, the subtree's vector up, the result down. So 3 (N - 1)
// plus one per node other than the root that has children, whoever starts.
int64_t TreeMessages(int n, int fanout) {
  int64_t inner = 0;
  for (int r = 1; r < n; ++r) {
    if (!NegotiationTree(r, n, fanout).children().empty()) ++inner;
  }
  return 3 * int64_t{n - 1} + inner;
}

TEST_P(ProtocolTest, TreeSendsAJoinEachWayAVectorUpAndTheResultDown) {
  const int n = GetParam();
  for (int fanout : {2, 4, 8}) {
    for (RoundStarters who : {RoundStarters::kLeaf, RoundStarters::kAll}) {
      const SimulationConfig c = Config(n, RoundProtocol::kTree, fanout, who);
      const SimulationResult r = Simulate(c);
      EXPECT_EQ(r.messages, TreeMessages(n, fanout))
          << "fanout " << fanout << ", " << RoundStartersName(who);
      // Per edge: two join words and two vectors with their count words.
      EXPECT_EQ(r.bytes, int64_t{n - 1} * (16 + 2 * VectorMessageBytes(c)));
      EXPECT_EQ(r.outcome_mismatches, 0);
      EXPECT_EQ(r.launch_mismatches, 0);
      EXPECT_GE(r.agreed, c.workload.tensors);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, ProtocolTest,
                         ::testing::Values(2, 3, 5, 16, 37, 64));

TEST(NegotiationSimulationTest, TreeAt4096NodesIsSixLevelsDeepAtFanout4) {
  SimulationConfig c =
      Config(4096, RoundProtocol::kTree, 4, RoundStarters::kLeaf);
  c.rounds = 1;
  const SimulationResult r = Simulate(c);
  EXPECT_EQ(r.depth, 6);
  EXPECT_EQ(r.messages, TreeMessages(4096, 4));
  EXPECT_EQ(r.outcome_mismatches, 0);
  EXPECT_EQ(r.launch_mismatches, 0);
}

// Nodes that submit tensors a round late: rounds agree only what every node
// has, and the decisions depend on the combined vector alone, so the tree
// and the all-to-all agree and launch exactly the same.
TEST(NegotiationSimulationTest, StragglersAgreeAlikeOnEveryProtocol) {
  SimulationConfig c =
      Config(40, RoundProtocol::kAllToAll, 0, RoundStarters::kAll);
  c.rounds = 12;
  c.workload.ready_per_round = 50;
  c.workload.straggle_one_in = 200;
  const SimulationResult all_to_all = Simulate(c);
  EXPECT_EQ(all_to_all.outcome_mismatches, 0);
  EXPECT_EQ(all_to_all.launch_mismatches, 0);
  EXPECT_GT(all_to_all.agreed, 0);
  // Some tensor waited for a straggler.
  EXPECT_LT(all_to_all.agreed, int64_t{12} * 50);
  for (int fanout : {2, 3, 8}) {
    for (RoundStarters who : {RoundStarters::kLeaf, RoundStarters::kAll}) {
      c.protocol = RoundProtocol::kTree;
      c.fanout = fanout;
      c.starters = who;
      const SimulationResult tree = Simulate(c);
      EXPECT_EQ(tree.outcome_mismatches, 0);
      EXPECT_EQ(tree.launch_mismatches, 0);
      EXPECT_EQ(tree.agreed, all_to_all.agreed) << "fanout " << fanout;
      EXPECT_EQ(tree.launches, all_to_all.launches) << "fanout " << fanout;
    }
  }
}

}  // namespace
}  // namespace baton::agent::sim
