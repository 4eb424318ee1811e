// The scheduler's negotiation rounds on their own TCP connections
// (TcpRounds, through GlooTransport::ConnectNegotiation): N nodes as N
// threads of one process on 127.0.0.1, bootstrapped through an in-memory
// store.
#include "agent/transport/tcp/tcp_rounds.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/gloo_cluster.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::AnyOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

constexpr milliseconds kOpTimeout{10000};
// Error tests: how long a peer may stay silent before a round or a connect
// fails, and the bound on how long a failure may take to surface
// (scheduling slack on a loaded 2-core machine included).
constexpr milliseconds kShortTimeout{300};
constexpr milliseconds kFailFast{3000};

// The rounds of every node of `nodes`, connected.
std::unique_ptr<Cluster> Connected(int nodes) {
  auto cluster = std::make_unique<Cluster>(nodes);
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

// --- Rounds on 1 to 4 nodes --------------------------------------------------

class TcpRoundsTest : public ::testing::TestWithParam<int> {};

// Every node starts every round (nobody waits in AwaitRound); the count
// changes from round to round, so a node that read more or less than one
// message per round gets wrong values.
TEST_P(TcpRoundsTest, ExchangeMinGivesTheElementwiseMinimumRoundAfterRound) {
  const int nodes = GetParam();
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  for (int rank = 0; rank < nodes; ++rank) {
    EXPECT_EQ(cluster->negotiations[rank]->rank(), rank);
    EXPECT_EQ(cluster->negotiations[rank]->size(), nodes);
  }
  constexpr size_t kCounts[] = {1, 5, 1001, 2, 4099, 1, 64};
  constexpr int kRounds = sizeof kCounts / sizeof kCounts[0];
  // Node r holds the extremes at some indices; every value differs from
  // round to round.
  const auto value = [](int round) {
    return [round](int rank, size_t i) -> int64_t {
      if (i % 5 == static_cast<size_t>(rank)) {
        return std::numeric_limits<int64_t>::min() + static_cast<int64_t>(i) +
               round;
      }
      if (i % 7 == static_cast<size_t>(rank)) {
        return std::numeric_limits<int64_t>::max() - round;
      }
      return int64_t{1000000000000} * rank - static_cast<int64_t>(i) * 3 +
             round;
    };
  };
  OnEveryNode(nodes, [&](int rank) {
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
        ASSERT_EQ(data[i], MinOverNodes(nodes, i, round_value))
            << "node " << rank << " round " << round << " index " << i;
      }
    }
    EXPECT_FALSE(rounds.poisoned()) << "node " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(Nodes, TcpRoundsTest, ::testing::Values(1, 2, 3, 4));

// One node negotiates with nobody: no round can start, ExchangeMin keeps
// the node's own vector.
TEST(TcpRoundsOneNodeTest, AwaitRoundReturnsAtOnceAndExchangeMinKeepsTheData) {
  std::unique_ptr<Cluster> cluster = Connected(1);
  ASSERT_FALSE(HasFailure());
  NegotiationWire& rounds = *cluster->negotiations[0];
  const absl::StatusOr<bool> started = rounds.AwaitRound(3);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started);
  std::vector<int64_t> data = {3, -7, std::numeric_limits<int64_t>::max()};
  const std::vector<int64_t> before = data;
  ASSERT_TRUE(
      rounds.ExchangeMin(data.data(), 3, CollectiveOptions{kOpTimeout, 0})
          .ok());
  EXPECT_EQ(data, before);
}

// --- Waiting for rounds ------------------------------------------------------

class TcpRoundsWaitTest : public ::testing::TestWithParam<int> {};

// Rounds started by one node at a time: the others wait in AwaitRound, which
// returns true once the starter's vector arrives (or had arrived before the
// call), and join; every node gets the minimum. The count grows from round
// to round.
TEST_P(TcpRoundsWaitTest, AnyNodeStartsARoundAndTheOthersJoin) {
  const int nodes = GetParam();
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  constexpr int kRounds = 8;
  OnEveryNode(nodes, [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    for (int round = 0; round < kRounds; ++round) {
      const size_t count = static_cast<size_t>(3 + round * round * 50);
      const int starter = round % nodes;
      if (rank != starter) {
        const absl::StatusOr<bool> started = rounds.AwaitRound(count);
        ASSERT_TRUE(started.ok())
            << "node " << rank << ": " << started.status();
        ASSERT_TRUE(*started) << "node " << rank << " round " << round;
      }
      const auto value = [round](int r, size_t i) {
        return static_cast<int64_t>((i + r * 7 + round) % 11) - 5;
      };
      std::vector<int64_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(rank, i);
      const absl::Status status = rounds.ExchangeMin(
          data.data(), count, CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(data[i], MinOverNodes(nodes, i, value))
            << "node " << rank << " round " << round << " index " << i;
      }
    }
  });
}

// Interrupt ends a waiting AwaitRound, or makes the next one return at once
// (several calls before one wait end that wait only); ExchangeMin is not
// disturbed by it, and the rounds that follow work.
TEST_P(TcpRoundsWaitTest, InterruptWakesTheWaitAndRoundsGoOn) {
  const int nodes = GetParam();
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  constexpr size_t kCount = 5;
  NegotiationWire& first = *cluster->negotiations[0];

  first.Interrupt();
  first.Interrupt();
  auto start = SteadyClock::now();
  absl::StatusOr<bool> started = first.AwaitRound(kCount);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started) << "an Interrupt() before the wait ends it";
  EXPECT_LT(Since(start).count(), kFailFast.count());

  std::thread interrupter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    first.Interrupt();
  });
  start = SteadyClock::now();
  started = first.AwaitRound(kCount);
  interrupter.join();
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started);
  EXPECT_GE(Since(start).count(), 40)
      << "returned before the Interrupt(): the earlier calls were left over";

  // Every node exchanges twice; node 0's Interrupt() calls left nothing
  // behind that breaks a round, and node 0 waits in AwaitRound for the
  // second round that node 1 starts.
  OnEveryNode(nodes, [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    for (int round = 0; round < 2; ++round) {
      if (round == 1 && rank != 1) {
        const absl::StatusOr<bool> joined = rounds.AwaitRound(kCount);
        ASSERT_TRUE(joined.ok()) << "node " << rank << ": " << joined.status();
        EXPECT_TRUE(*joined) << "node " << rank;
      }
      std::vector<int64_t> data(kCount, 100 - rank - round);
      const absl::Status status = rounds.ExchangeMin(
          data.data(), kCount, CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
      EXPECT_EQ(data[kCount - 1], 100 - (nodes - 1) - round)
          << "node " << rank << " round " << round;
    }
  });

  // An Interrupt() just before a round: the round completes, and the next
  // AwaitRound returns false at once.
  OnEveryNode(nodes, [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    if (rank == 0) rounds.Interrupt();
    std::vector<int64_t> data(kCount, rank);
    const absl::Status status = rounds.ExchangeMin(
        data.data(), kCount, CollectiveOptions{kOpTimeout, 0});
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(data, std::vector<int64_t>(kCount, 0)) << "node " << rank;
  });
  start = SteadyClock::now();
  started = first.AwaitRound(kCount);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started);
  EXPECT_LT(Since(start).count(), kFailFast.count());
  EXPECT_FALSE(first.poisoned());
}

// Abort (the data plane stopping on a generation change) ends a round that
// waits for a silent peer at once, not at its timeout, and a wait for a
// round too; both name the reason, the wire is poisoned, and the peers'
// connections stay open (a re-form may keep them).
TEST_P(TcpRoundsWaitTest, AbortEndsARoundAndAWaitAtOnce) {
  const int nodes = GetParam();
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  NegotiationWire& first = *cluster->negotiations[0];
  absl::Status round;
  std::thread exchanger([&] {
    std::vector<int64_t> data(3, 1);
    round = first.ExchangeMin(data.data(), data.size(),
                              CollectiveOptions{kOpTimeout, 0});
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = SteadyClock::now();
  first.Abort(absl::AbortedError("generation 4 began"));
  exchanger.join();
  EXPECT_LT(Since(start).count(), kFailFast.count()) << round;
  EXPECT_EQ(round.code(), absl::StatusCode::kAborted) << round;
  EXPECT_THAT(std::string(round.message()),
              HasSubstr("negotiation round of 24 bytes (int64)"));
  EXPECT_THAT(std::string(round.message()), HasSubstr("generation 4 began"));
  EXPECT_TRUE(first.poisoned());
  EXPECT_EQ(first.AwaitRound(3).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A wait with no round coming ends too.
  std::unique_ptr<Cluster> quiet = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  NegotiationWire& waiting = *quiet->negotiations[0];
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    waiting.Abort(absl::AbortedError("generation 4 began"));
  });
  const auto wait_start = SteadyClock::now();
  const absl::StatusOr<bool> waited = waiting.AwaitRound(3);
  aborter.join();
  EXPECT_LT(Since(wait_start).count(), kFailFast.count());
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kAborted)
      << waited.status();
  EXPECT_THAT(std::string(waited.status().message()),
              HasSubstr("generation 4 began"));
  // Nothing was closed: a third node's wait sees no end of stream.
  if (nodes > 2) {
    NegotiationWire& third = *cluster->negotiations[2];
    std::thread interrupter([&] {
      std::this_thread::sleep_for(milliseconds(100));
      third.Interrupt();
    });
    const absl::StatusOr<bool> quiet = third.AwaitRound(3);
    interrupter.join();
    // Node 0's half-sent round may wait in its socket (true), but no peer
    // closed its connection (which would be an error).
    EXPECT_TRUE(quiet.ok()) << quiet.status();
  }
}

// A node waiting for a round while a peer goes away fails at once with
// UNAVAILABLE instead of waiting forever. With more than two nodes a
// survivor may see another survivor's closed connection first (each closes
// its connections once it failed), so only two nodes check the rank named.
TEST_P(TcpRoundsWaitTest, PeerGoneDuringTheWaitEndsIt) {
  const int nodes = GetParam();
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  OnEveryNode(nodes, [&](int rank) {
    auto& rounds = cluster->negotiations[rank];
    if (rank == nodes - 1) {
      std::this_thread::sleep_for(milliseconds(50));
      rounds.reset();
      return;
    }
    const auto start = SteadyClock::now();
    const absl::StatusOr<bool> started = rounds->AwaitRound(7);
    EXPECT_LT(Since(start).count(), kFailFast.count()) << "node " << rank;
    EXPECT_EQ(started.status().code(), absl::StatusCode::kUnavailable)
        << "node " << rank << ": " << started.status();
    EXPECT_THAT(started.status().message(),
                HasSubstr("waiting for a negotiation round"));
    EXPECT_THAT(started.status().message(), HasSubstr("closed its connection"));
    if (nodes == 2) {
      EXPECT_THAT(started.status().message(), HasSubstr("node rank 1 closed"));
    }
    EXPECT_TRUE(rounds->poisoned());
  });
}

// A node that never joins a round: the others fail with DEADLINE_EXCEEDED
// after the round's timeout, naming it (and only it: the others' vectors
// came).
TEST_P(TcpRoundsWaitTest, RoundWithoutAPeerTimesOutNamingIt) {
  const int nodes = GetParam();
  constexpr milliseconds kRoundTimeout{500};
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  const int silent = nodes - 1;
  OnEveryNode(nodes - 1, [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    std::vector<int64_t> data(4, rank);
    const auto start = SteadyClock::now();
    const absl::Status status = rounds.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kRoundTimeout, 0});
    EXPECT_GE(Since(start).count(), kRoundTimeout.count() - 10);
    EXPECT_LT(Since(start).count(), (kRoundTimeout + kFailFast).count());
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded)
        << "node " << rank << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("timed out after 500 ms"));
    EXPECT_THAT(std::string(status.message()),
                EndsWith(absl::StrCat("waiting for node rank(s) ", silent)));
    EXPECT_TRUE(rounds.poisoned());
    const absl::Status again = rounds.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kRoundTimeout, 0});
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  });
  // The silent node finds the others' vectors waiting: a round started. The
  // others gave up on it, so the round must end promptly, however it ends
  // (a node that comes late may still read the vectors that were sent).
  NegotiationWire& late = *cluster->negotiations[silent];
  const absl::StatusOr<bool> started = late.AwaitRound(4);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_TRUE(*started);
  std::vector<int64_t> data(4, 100);
  const auto start = SteadyClock::now();
  const absl::Status status = late.ExchangeMin(
      data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
  EXPECT_LT(Since(start).count(), kFailFast.count()) << status;
  EXPECT_THAT(status.code(),
              AnyOf(absl::StatusCode::kOk, absl::StatusCode::kUnavailable))
      << status;
}

INSTANTIATE_TEST_SUITE_P(Nodes, TcpRoundsWaitTest, ::testing::Values(2, 3, 4));

// --- A peer that is gone -----------------------------------------------------

// (nodes, the node rank that destroys its rounds first). The others run
// once it is gone; the lowest rank is the first connection each survivor
// looks at, so the rank named is the gone node's even with survivors that
// fail (and close their connections) at the same time.
class TcpRoundsPeerGoneTest
    : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  int nodes() const { return std::get<0>(GetParam()); }
  int gone() const { return std::get<1>(GetParam()); }
};

// The others' AwaitRound fails UNAVAILABLE naming the gone node; then every
// round call fails FAILED_PRECONDITION (poisoned) with the first error.
TEST_P(TcpRoundsPeerGoneTest, AwaitRoundFailsNamingThePeerThenPoisoned) {
  std::unique_ptr<Cluster> cluster = Connected(nodes());
  ASSERT_FALSE(HasFailure());
  cluster->negotiations[gone()].reset();
  const std::string named = absl::StrCat("node rank ", gone(), " closed");
  OnEveryNode(nodes(), [&](int rank) {
    if (rank == gone()) return;
    NegotiationWire& rounds = *cluster->negotiations[rank];
    const auto start = SteadyClock::now();
    const absl::StatusOr<bool> started = rounds.AwaitRound(3);
    EXPECT_LT(Since(start).count(), kFailFast.count()) << "node " << rank;
    EXPECT_EQ(started.status().code(), absl::StatusCode::kUnavailable)
        << "node " << rank << ": " << started.status();
    EXPECT_THAT(started.status().message(), HasSubstr(named))
        << "node " << rank;
    EXPECT_THAT(started.status().message(),
                HasSubstr(absl::StrCat("negotiation connections of ", nodes(),
                                       " nodes (node rank ", rank, ")")));
    EXPECT_TRUE(rounds.poisoned());

    const absl::StatusOr<bool> again = rounds.AwaitRound(3);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
        << again.status();
    EXPECT_THAT(again.status().message(), HasSubstr("poisoned by"));
    EXPECT_THAT(again.status().message(), HasSubstr(named));
    std::vector<int64_t> data(3, 1);
    const absl::Status exchanged = rounds.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_EQ(exchanged.code(), absl::StatusCode::kFailedPrecondition)
        << exchanged;
    EXPECT_THAT(exchanged.message(), HasSubstr(named));
    EXPECT_EQ(data, std::vector<int64_t>(3, 1));
  });
}

// The same for a round: ExchangeMin fails UNAVAILABLE naming the gone node
// (closed, or reset once this node's vector reached its closed socket),
// promptly despite the long timeout; then the rounds are poisoned.
TEST_P(TcpRoundsPeerGoneTest, ExchangeMinFailsNamingThePeerThenPoisoned) {
  std::unique_ptr<Cluster> cluster = Connected(nodes());
  ASSERT_FALSE(HasFailure());
  cluster->negotiations[gone()].reset();
  const std::string named = absl::StrCat("node rank ", gone(), " ");
  OnEveryNode(nodes(), [&](int rank) {
    if (rank == gone()) return;
    NegotiationWire& rounds = *cluster->negotiations[rank];
    std::vector<int64_t> data(3, rank);
    const auto start = SteadyClock::now();
    const absl::Status status = rounds.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_LT(Since(start).count(), kFailFast.count()) << "node " << rank;
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable)
        << "node " << rank << ": " << status;
    EXPECT_THAT(status.message(),
                HasSubstr("negotiation round of 24 bytes (int64)"));
    EXPECT_THAT(status.message(), HasSubstr(named)) << "node " << rank;
    EXPECT_TRUE(rounds.poisoned());

    const absl::Status again = rounds.ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_THAT(again.message(), HasSubstr("poisoned by"));
    EXPECT_THAT(again.message(), HasSubstr(named));
    EXPECT_EQ(rounds.AwaitRound(3).status().code(),
              absl::StatusCode::kFailedPrecondition);
  });
}

INSTANTIATE_TEST_SUITE_P(
    NodesAndGone, TcpRoundsPeerGoneTest,
    ::testing::Values(std::make_tuple(2, 0), std::make_tuple(2, 1),
                      std::make_tuple(3, 0), std::make_tuple(4, 0)),
    [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
      return absl::StrCat(std::get<0>(info.param), "Nodes_Rank",
                          std::get<1>(info.param), "Gone");
    });

// --- Mismatches and large vectors --------------------------------------------

// Nodes that disagree on a round's count fail it at once (each sends its
// whole vector before it reads) instead of waiting for the timeout or
// reading the wrong number of words.
TEST(TcpRoundsMismatchTest, DifferentCountsFailBothNodes) {
  std::unique_ptr<Cluster> cluster = Connected(2);
  ASSERT_FALSE(HasFailure());
  std::vector<absl::Status> statuses(2);
  OnEveryNode(2, [&](int rank) {
    std::vector<int64_t> data(rank == 0 ? 3 : 5, 1);
    const auto start = SteadyClock::now();
    statuses[rank] = cluster->negotiations[rank]->ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    EXPECT_LT(Since(start).count(), kFailFast.count()) << "node " << rank;
  });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kFailedPrecondition)
      << statuses[0];
  EXPECT_THAT(statuses[0].message(),
              HasSubstr("node rank 1 sent a vector of 5 words, this node one "
                        "of 3"));
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kFailedPrecondition)
      << statuses[1];
  EXPECT_THAT(statuses[1].message(),
              HasSubstr("node rank 0 sent a vector of 3 words, this node one "
                        "of 5"));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(cluster->negotiations[rank]->poisoned()) << "node " << rank;
  }
}

class TcpRoundsLargeTest : public ::testing::TestWithParam<int> {};

// Vectors far larger than the socket buffers: every node sends to every
// other at once, so sends and receives must interleave (a node that sent
// everything before reading would wait on its peers forever).
TEST_P(TcpRoundsLargeTest, VectorsLargerThanTheSocketBuffersComplete) {
  const int nodes = GetParam();
  constexpr size_t kCount = size_t{1} << 20;  // 8 MiB
  constexpr int kRounds = 2;
  const auto value = [](int round, int rank, size_t i) {
    return static_cast<int64_t>((i * 31 + rank * 17 + round) % 1009) - rank;
  };
  std::vector<std::vector<int64_t>> expected(kRounds);
  for (int round = 0; round < kRounds; ++round) {
    expected[round].resize(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      expected[round][i] = MinOverNodes(
          nodes, i, [&](int rank, size_t j) { return value(round, rank, j); });
    }
  }
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  OnEveryNode(nodes, [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    for (int round = 0; round < kRounds; ++round) {
      std::vector<int64_t> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = value(round, rank, i);
      const absl::Status status = rounds.ExchangeMin(
          data.data(), kCount, CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok())
          << "node " << rank << " round " << round << ": " << status;
      const auto mismatch =
          std::mismatch(data.begin(), data.end(), expected[round].begin());
      EXPECT_TRUE(mismatch.first == data.end())
          << "node " << rank << " round " << round << " index "
          << (mismatch.first - data.begin()) << ": " << *mismatch.first
          << " instead of " << *mismatch.second;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Nodes, TcpRoundsLargeTest, ::testing::Values(2, 3));

// --- Bad arguments -----------------------------------------------------------

class TcpRoundsArgumentsTest : public ::testing::TestWithParam<int> {};

// Bad arguments are answered without touching the network: no node hangs
// and the rounds stay usable.
TEST_P(TcpRoundsArgumentsTest, BadArgumentsDoNotPoison) {
  const int nodes = GetParam();
  std::unique_ptr<Cluster> cluster = Connected(nodes);
  ASSERT_FALSE(HasFailure());
  // One word more than a round may carry: never read (nor even touched:
  // uninitialized).
  constexpr size_t kTooMany = (size_t{1} << 24) + 1;
  const std::unique_ptr<int64_t[]> too_many(new int64_t[kTooMany]);
  OnEveryNode(nodes, [&](int rank) {
    NegotiationWire& rounds = *cluster->negotiations[rank];
    const CollectiveOptions options{kOpTimeout, 0};
    const absl::Status null = rounds.ExchangeMin(nullptr, 3, options);
    EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument) << null;
    EXPECT_THAT(null.message(), HasSubstr("data is null"));
    // No words: no round (nothing is sent), whatever the pointer.
    EXPECT_TRUE(rounds.ExchangeMin(nullptr, 0, options).ok());
    int64_t word = 5;
    EXPECT_EQ(
        rounds.ExchangeMin(&word, 1, CollectiveOptions{milliseconds(0), 0})
            .code(),
        absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        rounds.ExchangeMin(&word, 1, CollectiveOptions{milliseconds(-1), 0})
            .code(),
        absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(word, 5);
    const absl::Status large =
        rounds.ExchangeMin(too_many.get(), kTooMany, options);
    EXPECT_EQ(large.code(), absl::StatusCode::kInvalidArgument) << large;
    EXPECT_THAT(large.message(), HasSubstr("more than 16777216 words"));
    const absl::StatusOr<bool> zero = rounds.AwaitRound(0);
    EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument)
        << zero.status();
    EXPECT_FALSE(rounds.poisoned()) << "node " << rank;

    std::vector<int64_t> data(10, rank + 1);
    const absl::Status status =
        rounds.ExchangeMin(data.data(), data.size(), options);
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(data, std::vector<int64_t>(10, 1)) << "node " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(Nodes, TcpRoundsArgumentsTest,
                         ::testing::Values(1, 2));

// --- Connecting --------------------------------------------------------------

// A node rank higher than the connecting ones never shows up: they fail with
// DEADLINE_EXCEEDED naming it, once the request's timeout has passed.
TEST(TcpRoundsConnectTest, MissingHigherPeerGivesDeadlineExceededNamingIt) {
  Cluster cluster(3);
  std::vector<absl::Status> statuses(2);
  std::vector<milliseconds> took(2);
  OnEveryNode(2, [&](int rank) {
    const auto start = SteadyClock::now();
    statuses[rank] =
        cluster.transports[rank]
            ->ConnectNegotiation(cluster.Request(rank, 1, kShortTimeout))
            .status();
    took[rank] = Since(start);
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(statuses[rank].code(), absl::StatusCode::kDeadlineExceeded)
        << statuses[rank];
    // Every node reads every peer's address first (it may keep a
    // connection with any of them): the store names the one missing.
    EXPECT_THAT(std::string(statuses[rank].message()),
                HasSubstr("still missing \"baton/job/1/rounds/2\""));
    EXPECT_THAT(statuses[rank].message(),
                HasSubstr(absl::StrCat("connecting the negotiation of 3 nodes "
                                       "(node rank ",
                                       rank,
                                       ", keys under \"baton/job/1/"
                                       "rounds/\")")));
    EXPECT_GE(took[rank].count(), kShortTimeout.count() - 10)
        << "node " << rank;
    EXPECT_LT(took[rank].count(), (kShortTimeout + kFailFast).count())
        << "node " << rank;
  }
}

// A lower node rank never publishes its address: the node waiting for it
// fails with DEADLINE_EXCEEDED naming it and its store key.
TEST(TcpRoundsConnectTest, MissingLowerPeerGivesDeadlineExceededNamingIt) {
  Cluster cluster(2);
  const auto start = SteadyClock::now();
  const absl::Status status =
      cluster.transports[1]
          ->ConnectNegotiation(cluster.Request(1, 1, kShortTimeout))
          .status();
  EXPECT_GE(Since(start).count(), kShortTimeout.count() - 10);
  EXPECT_LT(Since(start).count(), (kShortTimeout + kFailFast).count());
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("waiting for the addresses of node rank(s) 0..0"));
  EXPECT_THAT(status.message(), HasSubstr("\"baton/job/1/rounds/0\""));
}

TEST(TcpRoundsConnectTest, AbortedStoreGivesAborted) {
  Cluster cluster(2);
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    cluster.store->Abort(absl::AbortedError(
        "job \"job\" generation 1 was aborted while this Get waited"));
  });
  const auto start = SteadyClock::now();
  const absl::Status status =
      cluster.transports[1]
          ->ConnectNegotiation(cluster.Request(1, 1, kConnectTimeout))
          .status();
  aborter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(), HasSubstr("was aborted while this Get waited"));
  EXPECT_LT(Since(start).count(), kFailFast.count());
}

TEST(TcpRoundsConnectTest, InvalidRequestsAreRejected) {
  Cluster cluster(1);
  Transport& transport = *cluster.transports[0];
  const auto code = [&](const ConnectRequest& request) {
    return transport.ConnectNegotiation(request).status().code();
  };
  ConnectRequest request = cluster.Request(0, 1, kShortTimeout);
  request.node_rank = 1;
  EXPECT_EQ(code(request), absl::StatusCode::kInvalidArgument);
  request.node_rank = -1;
  EXPECT_EQ(code(request), absl::StatusCode::kInvalidArgument);
  request = cluster.Request(0, 1, kShortTimeout);
  request.num_nodes = 0;
  EXPECT_EQ(code(request), absl::StatusCode::kInvalidArgument);
  request = cluster.Request(0, 1, kShortTimeout);
  request.store = nullptr;
  EXPECT_EQ(code(request), absl::StatusCode::kInvalidArgument);
  request = cluster.Request(0, 1, kShortTimeout);
  request.prefix.clear();
  EXPECT_EQ(code(request), absl::StatusCode::kInvalidArgument);
  // No secret is no connect, never an unauthenticated one.
  request = cluster.Request(0, 1, kShortTimeout);
  request.secret.clear();
  const absl::Status no_secret = transport.ConnectNegotiation(request).status();
  EXPECT_EQ(no_secret.code(), absl::StatusCode::kInvalidArgument) << no_secret;
  EXPECT_THAT(no_secret.message(), HasSubstr("ConnectRequest.secret is empty"));
  EXPECT_EQ(code(cluster.Request(0, 1, milliseconds(0))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(cluster.Request(0, 1, milliseconds(-5))),
            absl::StatusCode::kInvalidArgument);
  // The count is ignored: the rounds are one set of connections.
  absl::StatusOr<std::unique_ptr<NegotiationWire>> rounds =
      transport.ConnectNegotiation(cluster.Request(0, 0, kShortTimeout));
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  EXPECT_EQ((*rounds)->size(), 1);
  EXPECT_EQ((*rounds)->rank(), 0);
}

// The address TcpRounds listens on must be a numeric IP address of this
// machine; nothing is published otherwise.
TEST(TcpRoundsConnectTest, AddressThatCannotBeListenedOnIsRejected) {
  Cluster cluster(2);
  const ConnectRequest request = cluster.Request(0, 1, kShortTimeout);
  for (const std::string address : {"localhost", "no-such-host.invalid", ""}) {
    SCOPED_TRACE(address);
    const auto start = SteadyClock::now();
    const absl::Status status =
        TcpRounds::Connect(request, address, Clock::Real(), nullptr).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("is not a numeric IP address"));
    EXPECT_LT(Since(start).count(), kShortTimeout.count());
  }
  // 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
  const absl::Status foreign =
      TcpRounds::Connect(request, "192.0.2.1", Clock::Real(), nullptr).status();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kUnavailable) << foreign;
  EXPECT_THAT(foreign.message(),
              HasSubstr("binding the negotiation socket to 192.0.2.1"));
  EXPECT_EQ(cluster.store->Get({"baton/job/1/rounds/0"}, milliseconds(1))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded)
      << "published an address it does not listen on";
}

// A TCP connection to 127.0.0.1:`port` that sends `bytes` (none: closes at
// once). Returns the socket (-1 on failure) for the caller to close.
int StrayConnection(int port, const std::vector<char>& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) !=
          0 ||
      (!bytes.empty() && ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
                             static_cast<ssize_t>(bytes.size()))) {
    ::close(fd);
    return -1;
  }
  if (bytes.empty()) {
    ::close(fd);
    return -2;  // connected and closed
  }
  return fd;
}

// Connections to node 0's listener that are not peers of this round (junk,
// an introduction with another prefix's hash, one closed before it says
// anything, one that says 3 bytes and then nothing while staying open) are
// dropped or left waiting, and the real mesh still connects within a
// timeout shorter than the silent one's life, and works.
TEST(TcpRoundsConnectTest, StrayConnectionsAreIgnored) {
  Cluster cluster(2);
  // Introductions are read as they arrive: the silent stray must not hold
  // node 1's introduction up until this runs out.
  const std::chrono::milliseconds kConnectTimeout(3000);
  absl::StatusOr<std::unique_ptr<NegotiationWire>> first =
      absl::UnknownError("not connected");
  std::thread node0([&] {
    first = cluster.transports[0]->ConnectNegotiation(
        cluster.Request(0, 1, kConnectTimeout));
  });
  // Node 0 publishes "<host> <port>" once it listens.
  const absl::StatusOr<std::vector<std::string>> published = cluster.store->Get(
      {StoreKey(cluster.Request(0, 1, kConnectTimeout).prefix, "rounds/0")},
      kConnectTimeout);
  std::vector<int> strays;
  int port = 0;
  if (published.ok()) {
    const std::vector<std::string> parts = absl::StrSplit((*published)[0], ' ');
    EXPECT_EQ(parts.size(), 2u) << (*published)[0];
    EXPECT_EQ(parts[0], "127.0.0.1");
    EXPECT_TRUE(parts.size() == 2 && absl::SimpleAtoi(parts[1], &port))
        << (*published)[0];
  }
  if (port > 0) {
    // 16 junk bytes: the size of an introduction, a wrong magic.
    strays.push_back(StrayConnection(port, std::vector<char>(16, '\xab')));
    // The right magic and a plausible rank, from another prefix.
    struct {
      uint32_t magic = 0x42524e44;
      int32_t rank = 1;
      uint64_t prefix_hash = 0;
    } other_prefix;
    const char* raw = reinterpret_cast<const char*>(&other_prefix);
    strays.push_back(StrayConnection(
        port, std::vector<char>(raw, raw + sizeof other_prefix)));
    strays.push_back(StrayConnection(port, {}));
    strays.push_back(StrayConnection(port, {'\x44', '\x4e', '\x52'}));
  }
  absl::StatusOr<std::unique_ptr<NegotiationWire>> second =
      cluster.transports[1]->ConnectNegotiation(
          cluster.Request(1, 1, kConnectTimeout));
  node0.join();
  for (int fd : strays) {
    if (fd >= 0) ::close(fd);
  }
  ASSERT_TRUE(published.ok()) << published.status();
  for (int fd : strays) EXPECT_NE(fd, -1) << "a stray could not connect";
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  cluster.negotiations[0] = std::move(first).value();
  cluster.negotiations[1] = std::move(second).value();
  OnEveryNode(2, [&](int rank) {
    std::vector<int64_t> data = {rank, -rank, 7};
    const absl::Status status = cluster.negotiations[rank]->ExchangeMin(
        data.data(), data.size(), CollectiveOptions{kOpTimeout, 0});
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(data, (std::vector<int64_t>{0, -1, 7})) << "node " << rank;
  });
}

}  // namespace
}  // namespace baton::agent
