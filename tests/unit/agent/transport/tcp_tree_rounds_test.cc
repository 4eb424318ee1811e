// The scheduler's negotiation rounds along a tree (TcpTreeRounds, through
// TcpTransport::ConnectNegotiation): N nodes as N threads of one process on
// 127.0.0.1, bootstrapped through an in-memory store. Failures are checked
// by what every node's error says, never by how long it took.
#include "agent/transport/tcp/tcp_tree_rounds.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/gloo_cluster.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::AnyOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;

constexpr milliseconds kOpTimeout{20000};

// The tree rounds of `nodes` nodes of `fanout`, connected.
std::unique_ptr<Cluster> ConnectedTree(int nodes, int fanout) {
  auto cluster = std::make_unique<Cluster>(nodes, DataTransport::kTcp);
  cluster->negotiation.wire = NegotiationChoice::Wire::kTree;
  cluster->negotiation.fanout = fanout;
  EXPECT_TRUE(cluster->ConnectNegotiation());
  return cluster;
}

// The minimum over the nodes of value(rank, i), for the expected results.
template <typename Value>
int64_t MinOverNodes(int nodes, size_t i, const Value& value) {
  int64_t expected = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < nodes; ++r) expected = std::min(expected, value(r, i));
  return expected;
}

// (nodes, fanout)
class TcpTreeRoundsTest
    : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  int nodes() const { return std::get<0>(GetParam()); }
  int fanout() const { return std::get<1>(GetParam()); }
};

std::string TreeName(
    const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
  return absl::StrCat(std::get<0>(info.param), "Nodes_Fanout",
                      std::get<1>(info.param));
}

// --- Rounds ------------------------------------------------------------------

// Every node starts every round (nobody waits in AwaitRound); the count
// changes from round to round, so a node that read more or less than its
// messages gets wrong values.
TEST_P(TcpTreeRoundsTest,
       ExchangeMinGivesTheElementwiseMinimumRoundAfterRound) {
  std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  for (int rank = 0; rank < nodes(); ++rank) {
    auto* tree =
        dynamic_cast<TcpTreeRounds*>(cluster->negotiations[rank].get());
    ASSERT_NE(tree, nullptr) << "node " << rank << " is not on the tree";
    EXPECT_EQ(tree->rank(), rank);
    EXPECT_EQ(tree->size(), nodes());
    EXPECT_EQ(tree->tree().parent(), rank == 0 ? -1 : (rank - 1) / fanout());
  }
  constexpr size_t kCounts[] = {1, 5, 1001, 2, 4099, 1, 64};
  constexpr int kRounds = sizeof kCounts / sizeof kCounts[0];
  const auto value = [](int round) {
    return [round](int rank, size_t i) -> int64_t {
      if (i % 5 == static_cast<size_t>(rank % 5)) {
        return std::numeric_limits<int64_t>::min() + static_cast<int64_t>(i) +
               round + rank;
      }
      if (i % 7 == static_cast<size_t>(rank % 7)) {
        return std::numeric_limits<int64_t>::max() - round;
      }
      return int64_t{1000000000000} * rank - static_cast<int64_t>(i) * 3 +
             round;
    };
  };
  OnEveryNode(nodes(), [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    for (int round = 0; round < kRounds; ++round) {
      const size_t count = kCounts[round];
      const auto round_value = value(round);
      std::vector<int64_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = round_value(rank, i);
      const absl::Status status = rounds.ExchangeMin(
          data.data(), count, CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok())
          << "node " << rank << " round " << round << ": " << status;
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(data[i], MinOverNodes(nodes(), i, round_value))
            << "node " << rank << " round " << round << " index " << i;
      }
    }
    EXPECT_FALSE(rounds.poisoned()) << "node " << rank;
  });
}

// Rounds started by one node at a time, each node in turn (the root, inner
// nodes and leaves): the others wait in AwaitRound, which returns true once
// the round reaches them through the tree, and join; every node gets the
// minimum.
TEST_P(TcpTreeRoundsTest, AnyNodeStartsARoundAndTheOthersJoin) {
  std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  const int rounds_to_run = std::max(nodes(), 2);
  OnEveryNode(nodes(), [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    for (int round = 0; round < rounds_to_run; ++round) {
      const size_t count = static_cast<size_t>(3 + (round % 4) * 300);
      const int starter = (nodes() - 1 + round) % nodes();  // a leaf first
      if (rank != starter && nodes() > 1) {
        const absl::StatusOr<bool> started = rounds.AwaitRound(count);
        ASSERT_TRUE(started.ok())
            << "node " << rank << ": " << started.status();
        ASSERT_TRUE(*started) << "node " << rank << " round " << round;
      }
      const auto value = [round](int r, size_t i) {
        return static_cast<int64_t>((i + r * 7 + round) % 23) - 11;
      };
      std::vector<int64_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(rank, i);
      const absl::Status status = rounds.ExchangeMin(
          data.data(), count, CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(data[i], MinOverNodes(nodes(), i, value))
            << "node " << rank << " round " << round << " index " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Trees, TcpTreeRoundsTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 9,
                                                              17),
                                            ::testing::Values(2, 4)),
                         TreeName);

// --- Waiting for rounds ------------------------------------------------------

class TcpTreeRoundsWaitTest : public TcpTreeRoundsTest {};

// Interrupt ends a waiting AwaitRound, or makes the next one return at once;
// ExchangeMin is not disturbed by it, and the rounds that follow work.
TEST_P(TcpTreeRoundsWaitTest, InterruptWakesTheWaitAndRoundsGoOn) {
  std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  constexpr size_t kCount = 5;
  // An inner node when there is one, else the root.
  const int waiter = nodes() > fanout() + 1 ? 1 : 0;
  NegotiationWire& waiting = *cluster->negotiations[waiter];

  waiting.Interrupt();
  waiting.Interrupt();
  absl::StatusOr<bool> started = waiting.AwaitRound(kCount);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started) << "an Interrupt() before the wait ends it";

  std::thread interrupter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    waiting.Interrupt();
  });
  started = waiting.AwaitRound(kCount);
  interrupter.join();
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started);

  // The last node (a leaf) starts a round; everyone else, the interrupted
  // node included, waits for it.
  OnEveryNode(nodes(), [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    if (rank != nodes() - 1) {
      const absl::StatusOr<bool> joined = rounds.AwaitRound(kCount);
      ASSERT_TRUE(joined.ok()) << "node " << rank << ": " << joined.status();
      EXPECT_TRUE(*joined) << "node " << rank;
    }
    if (rank == waiter) rounds.Interrupt();  // during the round: no effect
    std::vector<int64_t> data(kCount, 100 - rank);
    const absl::Status status = rounds.ExchangeMin(
        data.data(), kCount, CollectiveOptions{kOpTimeout, 0});
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(data, std::vector<int64_t>(kCount, 100 - (nodes() - 1)))
        << "node " << rank;
  });
  // The Interrupt() of the round is taken by the next wait.
  started = waiting.AwaitRound(kCount);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started);
  EXPECT_FALSE(waiting.poisoned());
}

// Abort ends a round that waits for silent peers and a wait for a round,
// naming the reason; the wire is poisoned.
TEST_P(TcpTreeRoundsWaitTest, AbortEndsARoundAndAWait) {
  std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  NegotiationWire& first = *cluster->negotiations[0];
  absl::Status round;
  std::thread exchanger([&] {
    std::vector<int64_t> data(3, 1);
    round = first.ExchangeMin(data.data(), data.size(),
                              CollectiveOptions{kOpTimeout, 0});
  });
  std::this_thread::sleep_for(milliseconds(50));
  first.Abort(absl::AbortedError("generation 4 began"));
  exchanger.join();
  EXPECT_EQ(round.code(), absl::StatusCode::kAborted) << round;
  EXPECT_THAT(std::string(round.message()),
              HasSubstr("negotiation round of 24 bytes (int64)"));
  EXPECT_THAT(std::string(round.message()), HasSubstr("generation 4 began"));
  EXPECT_TRUE(first.poisoned());
  EXPECT_EQ(first.AwaitRound(3).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A wait with no round coming ends too.
  std::unique_ptr<Cluster> quiet = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  NegotiationWire& leaf = *quiet->negotiations[nodes() - 1];
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    leaf.Abort(absl::AbortedError("generation 5 began"));
  });
  const absl::StatusOr<bool> waited = leaf.AwaitRound(3);
  aborter.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kAborted)
      << waited.status();
  EXPECT_THAT(std::string(waited.status().message()),
              HasSubstr("generation 5 began"));
}

// A node that never joins a round: every other node fails with
// DEADLINE_EXCEEDED naming it, those next to it at their timeout, the
// others through their notice.
TEST_P(TcpTreeRoundsWaitTest, RoundWithoutANodeTimesOutNamingItEverywhere) {
  constexpr milliseconds kRoundTimeout{1500};
  for (const int silent : {nodes() - 1, 1}) {
    SCOPED_TRACE(absl::StrCat("silent node rank ", silent));
    std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
    ASSERT_FALSE(HasFailure());
    OnEveryNode(nodes(), [&](int rank) {
      if (rank == silent) return;
      NegotiationWire& rounds = *cluster->negotiations[rank];
      std::vector<int64_t> data(4, rank);
      const absl::Status status = rounds.ExchangeMin(
          data.data(), data.size(), CollectiveOptions{kRoundTimeout, 0});
      EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded)
          << "node " << rank << ": " << status;
      EXPECT_THAT(status.message(), HasSubstr("timed out after 1500 ms"));
      EXPECT_THAT(
          std::string(status.message()),
          AnyOf(EndsWith(absl::StrCat("waiting for node rank(s) ", silent)),
                HasSubstr(absl::StrCat("waiting for node rank(s) ", silent,
                                       " (reported by"))))
          << "node " << rank;
      EXPECT_TRUE(rounds.poisoned());
      const absl::Status again = rounds.ExchangeMin(
          data.data(), data.size(), CollectiveOptions{kRoundTimeout, 0});
      EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    });
    // The silent node finds its neighbours' joins: a round started. It ends
    // (with the notice they left) instead of waiting for its timeout.
    NegotiationWire& late = *cluster->negotiations[silent];
    const absl::StatusOr<bool> started = late.AwaitRound(4);
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_TRUE(*started);
    std::vector<int64_t> data(4, 100);
    const absl::Status status = late.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("waiting for node rank(s) ", silent)));
  }
}

INSTANTIATE_TEST_SUITE_P(Trees, TcpTreeRoundsWaitTest,
                         ::testing::Values(std::make_tuple(2, 2),
                                           std::make_tuple(5, 2),
                                           std::make_tuple(9, 2),
                                           std::make_tuple(17, 4)),
                         TreeName);

// --- A node that is gone -----------------------------------------------------

// (nodes, fanout, the node rank whose rounds end first): a leaf, an inner
// node, the root. Only its tree neighbours see its connection end; every
// other survivor learns it from a notice, and names it all the same.
class TcpTreeRoundsNodeGoneTest
    : public ::testing::TestWithParam<std::tuple<int, int, int>> {
 protected:
  int nodes() const { return std::get<0>(GetParam()); }
  int fanout() const { return std::get<1>(GetParam()); }
  int gone() const { return std::get<2>(GetParam()); }
  bool Neighbour(int rank) const {
    const std::vector<int> ranks =
        NegotiationTree(rank, nodes(), fanout()).Neighbours();
    return std::find(ranks.begin(), ranks.end(), gone()) != ranks.end();
  }
};

TEST_P(TcpTreeRoundsNodeGoneTest, AwaitRoundFailsNamingItOnEveryNode) {
  std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  cluster->negotiations[gone()].reset();
  const std::string named =
      absl::StrCat("node rank ", gone(), " closed its connection");
  OnEveryNode(nodes(), [&](int rank) {
    if (rank == gone()) return;
    NegotiationWire& rounds = *cluster->negotiations[rank];
    const absl::StatusOr<bool> started = rounds.AwaitRound(3);
    EXPECT_EQ(started.status().code(), absl::StatusCode::kUnavailable)
        << "node " << rank << ": " << started.status();
    EXPECT_THAT(started.status().message(),
                HasSubstr("waiting for a negotiation round"));
    EXPECT_THAT(started.status().message(), HasSubstr(named))
        << "node " << rank;
    if (Neighbour(rank)) {
      EXPECT_THAT(started.status().message(), Not(HasSubstr("reported by")))
          << "node " << rank;
    } else {
      EXPECT_THAT(started.status().message(),
                  HasSubstr("(reported by node rank"))
          << "node " << rank;
    }
    EXPECT_TRUE(rounds.poisoned());
    const absl::StatusOr<bool> again = rounds.AwaitRound(3);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
        << again.status();
    EXPECT_THAT(again.status().message(), HasSubstr(named));
  });
}

TEST_P(TcpTreeRoundsNodeGoneTest, ExchangeMinFailsNamingItOnEveryNode) {
  std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  cluster->negotiations[gone()].reset();
  const std::string named = absl::StrCat("node rank ", gone(), " ");
  OnEveryNode(nodes(), [&](int rank) {
    if (rank == gone()) return;
    NegotiationWire& rounds = *cluster->negotiations[rank];
    std::vector<int64_t> data(3, rank);
    const absl::Status status = rounds.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable)
        << "node " << rank << ": " << status;
    EXPECT_THAT(status.message(),
                HasSubstr("negotiation round of 24 bytes (int64)"));
    EXPECT_THAT(status.message(), HasSubstr(named)) << "node " << rank;
    EXPECT_TRUE(rounds.poisoned());
    const absl::Status again = rounds.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_THAT(again.message(), HasSubstr(named));
  });
}

// A node lost in the middle of a run of rounds, while the others wait for
// the next one: they all fail naming it, whichever round they were in.
TEST_P(TcpTreeRoundsNodeGoneTest, NodeLostBetweenRoundsIsNamedEverywhere) {
  std::unique_ptr<Cluster> cluster = ConnectedTree(nodes(), fanout());
  ASSERT_FALSE(HasFailure());
  const std::string named = absl::StrCat("node rank ", gone(), " ");
  OnEveryNode(nodes(), [&](int rank) {
    auto& rounds = cluster->negotiations[rank];
    for (int round = 0; round < 3; ++round) {
      std::vector<int64_t> data(8, rank + round);
      const absl::Status status = rounds->ExchangeMin(
          data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
      EXPECT_EQ(data, std::vector<int64_t>(8, round));
    }
    if (rank == gone()) {
      rounds.reset();
      return;
    }
    absl::Status status;
    while (status.ok()) {
      absl::StatusOr<bool> started = rounds->AwaitRound(8);
      if (!started.ok()) {
        status = started.status();
        break;
      }
      std::vector<int64_t> data(8, rank);
      status = rounds->ExchangeMin(data.data(), data.size(),
                                   CollectiveOptions{kOpTimeout, 0});
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable)
        << "node " << rank << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(named)) << "node " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Trees, TcpTreeRoundsNodeGoneTest,
    ::testing::Values(std::make_tuple(9, 2, 8),    // a leaf
                      std::make_tuple(9, 2, 1),    // an inner node
                      std::make_tuple(17, 4, 16),  // a leaf
                      std::make_tuple(17, 4, 2),   // an inner node
                      std::make_tuple(5, 2, 0),    // the root
                      std::make_tuple(2, 4, 1)),
    [](const ::testing::TestParamInfo<std::tuple<int, int, int>>& info) {
      return absl::StrCat(std::get<0>(info.param), "Nodes_Fanout",
                          std::get<1>(info.param), "_Rank",
                          std::get<2>(info.param), "Gone");
    });

// --- Mismatches, large vectors, connecting -----------------------------------

// One node's round has another count: every node fails with
// FAILED_PRECONDITION, those next to it seeing it, the others told.
TEST(TcpTreeRoundsMismatchTest, DifferentCountsFailEveryNode) {
  constexpr int kNodes = 9;
  constexpr int kOdd = 4;  // an inner node of the binary tree
  std::unique_ptr<Cluster> cluster = ConnectedTree(kNodes, 2);
  ASSERT_FALSE(HasFailure());
  OnEveryNode(kNodes, [&](int rank) {
    std::vector<int64_t> data(rank == kOdd ? 5 : 3, 1);
    const absl::Status status = cluster->negotiations[rank]->ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition)
        << "node " << rank << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("sent a vector of"))
        << "node " << rank;
    EXPECT_THAT(status.message(), HasSubstr("the nodes disagree on the plan"));
    if (rank != kOdd) {
      EXPECT_THAT(status.message(),
                  HasSubstr(absl::StrCat("node rank ", kOdd,
                                         " sent a vector of 5 words")))
          << "node " << rank;
    }
    EXPECT_TRUE(cluster->negotiations[rank]->poisoned());
  });
}

// Vectors far larger than the socket buffers: bodies up and results down
// interleave with the joins, and every node gets the minimum.
TEST(TcpTreeRoundsLargeTest, VectorsLargerThanTheSocketBuffersComplete) {
  constexpr int kNodes = 5;
  constexpr size_t kCount = size_t{1} << 20;  // 8 MiB
  const auto value = [](int round, int rank, size_t i) {
    return static_cast<int64_t>((i * 31 + rank * 17 + round) % 1009) - rank;
  };
  std::unique_ptr<Cluster> cluster = ConnectedTree(kNodes, 2);
  ASSERT_FALSE(HasFailure());
  OnEveryNode(kNodes, [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    for (int round = 0; round < 2; ++round) {
      std::vector<int64_t> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = value(round, rank, i);
      const absl::Status status = rounds.ExchangeMin(
          data.data(), kCount, CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok())
          << "node " << rank << " round " << round << ": " << status;
      for (size_t i = 0; i < kCount; ++i) {
        const int64_t expected = MinOverNodes(
            kNodes, i, [&](int r, size_t j) { return value(round, r, j); });
        ASSERT_EQ(data[i], expected)
            << "node " << rank << " round " << round << " index " << i;
      }
    }
  });
}

TEST(TcpTreeRoundsConnectTest, FanoutBelowTwoIsRejected) {
  Cluster cluster(2, DataTransport::kTcp);
  cluster.negotiation.wire = NegotiationChoice::Wire::kTree;
  cluster.negotiation.fanout = 1;
  const absl::Status status =
      cluster.transports[0]
          ->ConnectNegotiation(cluster.Request(0, 1, milliseconds(300)))
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("fanout 1: give at least 2"));
}

// auto: the all-to-all up to kAllToAllUpTo nodes, the tree above; both
// transports connect what the request names.
TEST(NegotiationChoiceTest, AutoChoosesByNodeCountAndTransportsFollow) {
  NegotiationChoice choice;
  EXPECT_EQ(choice.Resolve(NegotiationChoice::kAllToAllUpTo).wire,
            NegotiationChoice::Wire::kAllToAll);
  EXPECT_EQ(choice.Resolve(NegotiationChoice::kAllToAllUpTo + 1).wire,
            NegotiationChoice::Wire::kTree);
  EXPECT_EQ(choice.Resolve(2).wire, NegotiationChoice::Wire::kAllToAll);
  const int large = NegotiationChoice::kAllToAllUpTo + 1;
  for (const DataTransport kind : {DataTransport::kTcp, DataTransport::kGloo}) {
    Cluster cluster(large, kind);
    ASSERT_TRUE(cluster.ConnectNegotiation());
    for (int rank = 0; rank < large; ++rank) {
      EXPECT_NE(dynamic_cast<TcpTreeRounds*>(cluster.negotiations[rank].get()),
                nullptr)
          << "node " << rank;
    }
  }
}

TEST(NegotiationChoiceTest, PublicationsRoundTripAndBadOnesAreNamed) {
  NegotiationChoice tree;
  tree.wire = NegotiationChoice::Wire::kTree;
  tree.fanout = 8;
  EXPECT_EQ(tree.Publication(), "tree 8");
  absl::StatusOr<NegotiationChoice> parsed =
      NegotiationChoice::FromPublication("tree 8");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, tree);
  parsed = NegotiationChoice::FromPublication("all_to_all");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->wire, NegotiationChoice::Wire::kAllToAll);
  for (const char* bad : {"auto", "tree", "tree 1", "tree 65", "ring 2", ""}) {
    EXPECT_EQ(NegotiationChoice::FromPublication(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(NegotiationChoice::ParseWire("tree").value(),
            NegotiationChoice::Wire::kTree);
  const absl::Status unknown = NegotiationChoice::ParseWire("star").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("auto, all_to_all or tree"));
}

// Node rank 0's choice holds on every node, whatever theirs.
TEST(NegotiationChoiceTest, EveryNodeAgreesOnNodeRankZerosChoice) {
  Cluster cluster(3, DataTransport::kTcp);
  std::vector<absl::StatusOr<NegotiationChoice>> agreed(
      3, absl::UnknownError("not run"));
  OnEveryNode(3, [&](int rank) {
    ConnectRequest request = cluster.Request(rank, 1, milliseconds(10000));
    request.negotiation.wire = rank == 0 ? NegotiationChoice::Wire::kTree
                                         : NegotiationChoice::Wire::kAuto;
    request.negotiation.fanout = rank == 0 ? 3 : 2;
    agreed[rank] = AgreeOnNegotiation(request);
  });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(agreed[rank].ok()) << agreed[rank].status();
    EXPECT_EQ(agreed[rank]->wire, NegotiationChoice::Wire::kTree);
    EXPECT_EQ(agreed[rank]->fanout, 3);
  }
  // Auto is resolved before it is published: 3 nodes run all-to-all.
  Cluster small(3, DataTransport::kTcp);
  ConnectRequest request = small.Request(0, 1, milliseconds(1000));
  ASSERT_TRUE(AgreeOnNegotiation(request).ok());
  request.node_rank = 2;
  request.negotiation.wire = NegotiationChoice::Wire::kTree;
  const absl::StatusOr<NegotiationChoice> theirs = AgreeOnNegotiation(request);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_EQ(theirs->wire, NegotiationChoice::Wire::kAllToAll);
}

}  // namespace
}  // namespace baton::agent
