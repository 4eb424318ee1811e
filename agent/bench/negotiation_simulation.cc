#include "agent/bench/negotiation_simulation.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "agent/transport/negotiation_tree.h"
#include "glog/logging.h"

namespace baton::agent::sim {
namespace {

// kVector: the all-to-all's. The tree's (TcpTreeRounds): a join word, a
// body up (a leaf's comes with its join: kJoinAndUp), the result down.
enum MessageKind : int {
  kVector = 0,
  kJoin = 1,
  kJoinAndUp = 2,
  kUp = 3,
  kDown = 4
};
constexpr int64_t kStartTimer = 0;

// The nodes' side of the rounds: what each does with its news and with
// what the network delivers. One object per simulation.
class RoundsModel : public SimulatedReceiver {
 public:
  explicit RoundsModel(const SimulationConfig& config)
      : config_(config),
        network_(config.nodes, config.network, this),
        workload_(config.nodes, config.workload),
        nodes_(config.nodes),
        round_start_(config.rounds, std::numeric_limits<double>::infinity()),
        round_end_(config.rounds, 0.0) {
    const int words = static_cast<int>(workload_.vector_size());
    vector_bytes_ = (int64_t{words} + 1) * 8;
    for (int n = 0; n < config.nodes; ++n) {
      nodes_[n].starter =
          config.starters == RoundStarters::kAll || n == config.nodes - 1;
      if (config.protocol == RoundProtocol::kTree) {
        NegotiationTree tree(n, config.nodes, config.fanout);
        nodes_[n].parent = tree.parent();
        nodes_[n].children = tree.children();
        depth_ = tree.depth();
      }
    }
  }

  SimulationResult Run() {
    for (int n = 0; n < config_.nodes; ++n) {
      if (nodes_[n].starter) network_.At(n, kStartTimer, 0);
    }
    network_.Run();
    SimulationResult result;
    for (int n = 0; n < config_.nodes; ++n) {
      CHECK_EQ(nodes_[n].round, config_.rounds)
          << "node " << n << " did not finish every round";
    }
    result.first_round_us = round_end_[0] - round_start_[0];
    double sum = 0;
    for (int r = 0; r < config_.rounds; ++r) {
      sum += round_end_[r] - round_start_[r];
    }
    result.mean_round_us = sum / config_.rounds;
    result.rounds_per_s =
        config_.rounds * 1e6 / (round_end_.back() - round_start_[0]);
    result.messages = network_.messages_per_round()[0];
    result.bytes = network_.bytes_per_round()[0];
    result.outcome_mismatches = workload_.outcome_mismatches();
    result.launch_mismatches = workload_.launch_mismatches();
    result.agreed = workload_.agreed();
    result.launches = workload_.launches();
    result.depth = depth_;
    return result;
  }

  void OnTimer(int node, int64_t tag, double now_us) override {
    DCHECK_EQ(tag, kStartTimer);
    nodes_[node].wants_round = true;
    MaybeEnter(node, now_us);
  }

  void OnMessage(const SimulatedMessage& message, double now_us) override {
    Node& node = nodes_[message.to];
    DCHECK_GE(message.round, node.round);
    if (message.round == node.round && node.in_round) {
      Process(message.to, message, now_us);
      return;
    }
    // A later round's (the node is still in an earlier one), or the first
    // of the round the node waits for: it wakes the node.
    node.early.push_back(message);
    MaybeEnter(message.to, now_us);
  }

 private:
  struct Node {
    bool starter = false;
    // The round it is in, or the next one it enters.
    int64_t round = 0;
    bool in_round = false;
    // News: enters the next round at once.
    bool wants_round = false;
    // Its vector, min-combined with what arrived so far.
    std::vector<int64_t> vec;
    // Vectors received in this round (the tree: the children's).
    int received = 0;
    bool sent_up = false;
    // Received before the node got to their round.
    std::vector<SimulatedMessage> early;
    // The tree.
    int parent = -1;
    std::vector<int> children;
  };

  void MaybeEnter(int n, double now_us) {
    Node& node = nodes_[n];
    if (node.in_round || node.round >= config_.rounds) return;
    bool woken = node.wants_round;
    for (const SimulatedMessage& m : node.early) {
      woken = woken || m.round == node.round;
    }
    if (woken) Enter(n, now_us);
  }

  // Scheduler::Round from AwaitNews on: encode, ExchangeMin.
  void Enter(int n, double now_us) {
    Node& node = nodes_[n];
    node.in_round = true;
    node.wants_round = false;
    const double start = network_.Compute(n, now_us, 0);
    round_start_[node.round] = std::min(round_start_[node.round], start);
    double t = network_.Compute(n, start, config_.costs.encode_us);
    workload_.Encode(n, node.round, &node.vec);
    // What is already here for this round, in arrival order.
    std::vector<SimulatedMessage> now;
    std::vector<SimulatedMessage> later;
    for (SimulatedMessage& m : node.early) {
      (m.round == node.round ? now : later).push_back(std::move(m));
    }
    node.early = std::move(later);
    if (config_.protocol == RoundProtocol::kAllToAll) {
      auto payload = std::make_shared<const std::vector<int64_t>>(node.vec);
      for (int p = 0; p < config_.nodes; ++p) {
        if (p == n) continue;
        t = network_.Send(t, SimulatedMessage{n, p, node.round, kVector,
                                              payload, vector_bytes_});
      }
    } else {
      // TcpTreeRounds: a join word to every neighbour at once, parent
      // first; a leaf's vector goes to its parent with its join.
      if (node.parent >= 0) {
        if (node.children.empty()) {
          node.sent_up = true;
          t = network_.Send(
              t, SimulatedMessage{
                     n, node.parent, node.round, kJoinAndUp,
                     std::make_shared<const std::vector<int64_t>>(node.vec),
                     vector_bytes_ + 8});
        } else {
          t = network_.Send(t, SimulatedMessage{n, node.parent, node.round,
                                                kJoin, nullptr, 8});
        }
      }
      for (int child : node.children) {
        t = network_.Send(
            t, SimulatedMessage{n, child, node.round, kJoin, nullptr, 8});
      }
    }
    const int64_t round = node.round;
    for (const SimulatedMessage& m : now) {
      // Processing may finish the round (the all-to-all's last vector).
      if (nodes_[n].round != round) break;
      t = Process(n, m, t);
    }
    if (config_.protocol == RoundProtocol::kTree && nodes_[n].round == round) {
      MaybeSendUp(n, t);
    }
  }

  // Reads one message of the node's current round; returns when the
  // node's thread is done with it.
  double Process(int n, const SimulatedMessage& m, double now_us) {
    Node& node = nodes_[n];
    double t = network_.Compute(n, now_us, config_.network.recv_cpu_us);
    switch (m.kind) {
      case kVector:
        // TcpRounds takes the minimum once every vector is in.
        NegotiationWorkload::Combine(*m.payload, &node.vec);
        if (++node.received == config_.nodes - 1) {
          t = network_.Compute(n, t,
                               (config_.nodes - 1) * config_.costs.combine_us +
                                   config_.costs.decode_us);
          Finish(n, t);
        }
        break;
      case kJoin:
        break;
      case kJoinAndUp:
      case kUp:
        t = network_.Compute(n, t, config_.costs.combine_us);
        NegotiationWorkload::Combine(*m.payload, &node.vec);
        ++node.received;
        t = MaybeSendUp(n, t);
        break;
      case kDown:
        node.vec = *m.payload;
        t = SendDown(n, m.payload, t);
        break;
    }
    return t;
  }

  // The tree: once the children's vectors are in, the subtree's minimum
  // goes up (the root's is the result, which goes down).
  double MaybeSendUp(int n, double t) {
    Node& node = nodes_[n];
    if (!node.in_round || node.sent_up ||
        node.received < static_cast<int>(node.children.size())) {
      return t;
    }
    node.sent_up = true;
    auto payload = std::make_shared<const std::vector<int64_t>>(node.vec);
    if (node.parent < 0) return SendDown(n, payload, t);
    return network_.Send(
        t, SimulatedMessage{n, node.parent, node.round, kUp, std::move(payload),
                            vector_bytes_});
  }

  // The tree: forwards the result to the children, then decodes.
  double SendDown(int n, std::shared_ptr<const std::vector<int64_t>> result,
                  double t) {
    Node& node = nodes_[n];
    for (int child : node.children) {
      t = network_.Send(t, SimulatedMessage{n, child, node.round, kDown, result,
                                            vector_bytes_});
    }
    t = network_.Compute(n, t, config_.costs.decode_us);
    Finish(n, t);
    return t;
  }

  // The node decoded its round at `t`: the scheduler launches what was
  // agreed, then waits for news or the next round.
  void Finish(int n, double t) {
    Node& node = nodes_[n];
    round_end_[node.round] = std::max(round_end_[node.round], t);
    workload_.Decode(n, node.round, node.vec);
    t = network_.Compute(n, t, config_.costs.plan_us);
    ++node.round;
    node.in_round = false;
    node.received = 0;
    node.sent_up = false;
    if (node.starter && node.round < config_.rounds) node.wants_round = true;
    MaybeEnter(n, t);
  }

  const SimulationConfig config_;
  SimulatedNetwork network_;
  NegotiationWorkload workload_;
  std::vector<Node> nodes_;
  std::vector<double> round_start_;
  std::vector<double> round_end_;
  int64_t vector_bytes_ = 0;
  int depth_ = 0;
};

}  // namespace

const char* RoundProtocolName(RoundProtocol protocol) {
  return protocol == RoundProtocol::kAllToAll ? "all-to-all" : "tree";
}

const char* RoundStartersName(RoundStarters starters) {
  return starters == RoundStarters::kLeaf ? "one leaf" : "all";
}

SimulationResult Simulate(const SimulationConfig& config) {
  CHECK_GE(config.nodes, 2) << "a round needs at least 2 nodes";
  CHECK_GE(config.rounds, 1);
  CHECK(config.protocol != RoundProtocol::kTree ||
        (config.fanout >= 2 && config.fanout <= 64))
      << "fanout " << config.fanout << ": give 2..64";
  RoundsModel model(config);
  return model.Run();
}

}  // namespace baton::agent::sim
