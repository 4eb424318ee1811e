// TcpTransport keeps connections between generations (tcp::LinkPool): after
// a re-form the survivors carry on with the connections they have, skipping
// what an aborted operation left unread, and connect only to new or changed
// peers. Real TCP on loopback, one thread per node.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/transport/memory_key_value_store.h"
#include "agent/transport/tcp/tcp_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/node_threads.h"

namespace baton::agent {
namespace {

using ::testing::HasSubstr;

constexpr std::chrono::milliseconds kTimeout{10000};

// One node: an agent's transport and what it connected for the generation
// it is in. Members are destroyed in reverse order: the communicators before
// the transport they borrowed their connections from.
struct Node {
  std::unique_ptr<TcpTransport> transport;
  std::vector<std::unique_ptr<Communicator>> rings;
  std::unique_ptr<NegotiationWire> rounds;
};

std::unique_ptr<TcpTransport> NewTransport() {
  auto transport = TcpTransport::Create("127.0.0.1");
  EXPECT_TRUE(transport.ok()) << transport.status();
  return std::move(transport).value();
}

ConnectRequest Request(int rank, int nodes, int generation,
                       std::shared_ptr<KeyValueStore> store,
                       NegotiationChoice negotiation = {}) {
  ConnectRequest request;
  request.node_rank = rank;
  request.num_nodes = nodes;
  request.prefix = absl::StrCat("baton/job/", generation, "/data");
  request.store = std::move(store);
  request.count = 2;
  request.timeout = kTimeout;
  request.reuse_key = "job/data";
  request.secret = std::string(32, '\x5a');
  request.negotiation = negotiation;
  return request;
}

// Connects a generation of `members` (node indices, in rank order): each
// member drops what it held (as the agent does once the last generation's
// data plane is gone), then connects rings and rounds. Returns each
// member's connections kept and made in this connect.
std::vector<LinkCounts> ConnectGeneration(std::vector<Node>& nodes,
                                          const std::vector<int>& members,
                                          int generation,
                                          NegotiationChoice negotiation = {}) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  const int size = static_cast<int>(members.size());
  std::vector<LinkCounts> counts(size);
  OnEveryNode(size, [&](int rank) {
    Node& node = nodes[members[rank]];
    node.rings.clear();
    node.rounds.reset();
    const LinkCounts before = node.transport->link_counts();
    const ConnectRequest request =
        Request(rank, size, generation, store, negotiation);
    auto rounds = node.transport->ConnectNegotiation(request);
    ASSERT_TRUE(rounds.ok()) << "rank " << rank << ": " << rounds.status();
    auto rings = node.transport->Connect(request);
    ASSERT_TRUE(rings.ok()) << "rank " << rank << ": " << rings.status();
    node.rounds = std::move(rounds).value();
    node.rings = std::move(rings).value();
    const LinkCounts after = node.transport->link_counts();
    counts[rank] = {after.kept - before.kept, after.made - before.made};
  });
  return counts;
}

// Every member runs an allreduce on each ring and a negotiation round, and
// gets the exact results.
void ExpectExactCollectives(std::vector<Node>& nodes,
                            const std::vector<int>& members) {
  const int size = static_cast<int>(members.size());
  constexpr size_t kCount = size_t{1} << 18;
  OnEveryNode(size, [&](int rank) {
    Node& node = nodes[members[rank]];
    for (auto& ring : node.rings) {
      std::vector<float> data(kCount, static_cast<float>(rank + 1));
      ASSERT_TRUE(ring->Allreduce(data.data(), kCount, v1::DATA_TYPE_FLOAT32,
                                  CollectiveOptions{kTimeout, 0})
                      .ok());
      const float sum = static_cast<float>(size * (size + 1) / 2);
      EXPECT_EQ(data.front(), sum) << "rank " << rank;
      EXPECT_EQ(data.back(), sum) << "rank " << rank;
    }
    std::vector<int64_t> vector = {rank + 10, 100 - rank};
    ASSERT_TRUE(node.rounds
                    ->ExchangeMin(vector.data(), vector.size(),
                                  CollectiveOptions{kTimeout, 0})
                    .ok());
    EXPECT_EQ(vector, (std::vector<int64_t>{10, 100 - (size - 1)}))
        << "rank " << rank;
  });
}

// Bytes in flight when a generation ends: members but the last start an
// allreduce on ring 0, which the last never joins, and a negotiation round;
// then every member's data plane aborts them (the generation changed).
void AbortMidCollective(std::vector<Node>& nodes,
                        const std::vector<int>& members) {
  const int size = static_cast<int>(members.size());
  constexpr size_t kCount = size_t{4} << 20;
  std::vector<std::thread> threads;
  std::vector<absl::Notification> started(size - 1);
  std::vector<absl::Status> statuses(size - 1);
  for (int rank = 0; rank + 1 < size; ++rank) {
    threads.emplace_back([&, rank] {
      Node& node = nodes[members[rank]];
      std::vector<float> data(kCount, 1.0f);
      started[rank].Notify();
      statuses[rank] =
          node.rings[0]->Allreduce(data.data(), kCount, v1::DATA_TYPE_FLOAT32,
                                   CollectiveOptions{kTimeout, 0});
    });
  }
  for (auto& notification : started) notification.WaitForNotification();
  // Half a round from the last member: the others never read it.
  std::vector<int64_t> vector(1000, 7);
  Node& last = nodes[members.back()];
  std::thread round([&] {
    (void)last.rounds->ExchangeMin(
        vector.data(), vector.size(),
        CollectiveOptions{std::chrono::milliseconds(300), 0});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int member : members) {
    for (auto& ring : nodes[member].rings) {
      ring->Abort(absl::AbortedError("generation ended"));
    }
  }
  for (std::thread& thread : threads) thread.join();
  round.join();
  for (int rank = 0; rank + 1 < size; ++rank) {
    EXPECT_THAT(statuses[rank].message(), HasSubstr("generation ended"))
        << "rank " << rank << ": " << statuses[rank];
  }
}

// The same members re-form after an abort mid-allreduce and mid-round: every
// connection is kept, none made, and the bytes left unread are skipped.
TEST(TcpKeptLinksTest, SameMembersKeepEveryConnectionAfterAnAbort) {
  std::vector<Node> nodes(3);
  for (Node& node : nodes) node.transport = NewTransport();
  const std::vector<int> all = {0, 1, 2};
  for (const auto& counts : ConnectGeneration(nodes, all, 1)) {
    // 2 rings of 2 neighbours, rounds with both others.
    EXPECT_EQ(counts.kept, 0);
    EXPECT_EQ(counts.made, 6);
  }
  ExpectExactCollectives(nodes, all);
  AbortMidCollective(nodes, all);
  for (const auto& counts : ConnectGeneration(nodes, all, 2)) {
    EXPECT_EQ(counts.kept, 6);
    EXPECT_EQ(counts.made, 0);
  }
  ExpectExactCollectives(nodes, all);
}

// The rounds along a tree keep their connections too: the same members
// re-form after an abort (a leaf's half round, timed out, and its notice left
// unread) and keep every one; a later generation on the all-to-all keeps
// the tree's edges and makes only the others.
TEST(TcpKeptLinksTest, TreeRoundsKeepTheirEdges) {
  std::vector<Node> nodes(5);
  for (Node& node : nodes) node.transport = NewTransport();
  const std::vector<int> all = {0, 1, 2, 3, 4};
  NegotiationChoice tree;
  tree.wire = NegotiationChoice::Wire::kTree;
  tree.fanout = 2;
  // Tree neighbours by node rank (0: 1 and 2; 1: 0, 3 and 4); 2 rings of 2
  // neighbours each besides.
  const int neighbours[] = {2, 3, 1, 1, 1};
  std::vector<LinkCounts> counts = ConnectGeneration(nodes, all, 1, tree);
  for (int rank = 0; rank < 5; ++rank) {
    EXPECT_EQ(counts[rank].kept, 0) << "rank " << rank;
    EXPECT_EQ(counts[rank].made, 4 + neighbours[rank]) << "rank " << rank;
  }
  ExpectExactCollectives(nodes, all);
  AbortMidCollective(nodes, all);
  counts = ConnectGeneration(nodes, all, 2, tree);
  for (int rank = 0; rank < 5; ++rank) {
    EXPECT_EQ(counts[rank].kept, 4 + neighbours[rank]) << "rank " << rank;
    EXPECT_EQ(counts[rank].made, 0) << "rank " << rank;
  }
  ExpectExactCollectives(nodes, all);
  NegotiationChoice all_to_all;
  all_to_all.wire = NegotiationChoice::Wire::kAllToAll;
  counts = ConnectGeneration(nodes, all, 3, all_to_all);
  for (int rank = 0; rank < 5; ++rank) {
    EXPECT_EQ(counts[rank].kept, 4 + neighbours[rank]) << "rank " << rank;
    EXPECT_EQ(counts[rank].made, 4 - neighbours[rank]) << "rank " << rank;
  }
  ExpectExactCollectives(nodes, all);
}

// A node is lost mid-allreduce: the survivors keep their connections to each
// other and connect only where the ring closes the gap. A replacement joins:
// only its own connections are made, and the gap's is closed again.
TEST(TcpKeptLinksTest, SurvivorsConnectOnlyToNewPeers) {
  std::vector<Node> nodes(5);
  for (int i = 0; i < 4; ++i) nodes[i].transport = NewTransport();
  ConnectGeneration(nodes, {0, 1, 2, 3}, 1);
  ExpectExactCollectives(nodes, {0, 1, 2, 3});
  AbortMidCollective(nodes, {0, 1, 3, 2});
  // Killed: its connections close. The communicators go before the
  // transport, whose pool they give their connections back to (as in the
  // agent, whose transport outlives its jobs).
  nodes[2].rounds.reset();
  nodes[2].rings.clear();
  nodes[2].transport.reset();

  // Ranks 0, 1, 2 are nodes 0, 1, 3. Rounds: the two others, kept. Rings:
  // 0-1 and 3-0 kept, 1-3 made.
  const std::vector<LinkCounts> survivors =
      ConnectGeneration(nodes, {0, 1, 3}, 2);
  EXPECT_EQ(survivors[0].kept, 2 + 2 * 2);
  EXPECT_EQ(survivors[0].made, 0);
  EXPECT_EQ(survivors[1].kept, 2 + 2 * 1);
  EXPECT_EQ(survivors[1].made, 2 * 1);
  EXPECT_EQ(survivors[2].kept, 2 + 2 * 1);
  EXPECT_EQ(survivors[2].made, 2 * 1);
  ExpectExactCollectives(nodes, {0, 1, 3});

  nodes[4].transport = NewTransport();
  const std::vector<LinkCounts> grown =
      ConnectGeneration(nodes, {0, 1, 3, 4}, 3);
  // Rings 0-1-3-4-0: 0-1 and 1-3 kept, 3-4 and 4-0 made. Rounds: the
  // joiner's three made.
  EXPECT_EQ(grown[0].kept, 2 + 2 * 1);
  EXPECT_EQ(grown[0].made, 1 + 2 * 1);
  EXPECT_EQ(grown[1].kept, 2 + 2 * 2);
  EXPECT_EQ(grown[1].made, 1);
  EXPECT_EQ(grown[2].kept, 2 + 2 * 1);
  EXPECT_EQ(grown[2].made, 1 + 2 * 1);
  EXPECT_EQ(grown[3].kept, 0);
  EXPECT_EQ(grown[3].made, 3 + 2 * 2);
  ExpectExactCollectives(nodes, {0, 1, 3, 4});
}

// A job that ended drops what it kept: the next run connects anew.
TEST(TcpKeptLinksTest, DroppedKeysKeepNothing) {
  std::vector<Node> nodes(2);
  for (Node& node : nodes) node.transport = NewTransport();
  ConnectGeneration(nodes, {0, 1}, 1);
  for (Node& node : nodes) {
    node.rings.clear();
    node.rounds.reset();
    node.transport->DropKept("job/");
  }
  for (const auto& counts : ConnectGeneration(nodes, {0, 1}, 2)) {
    EXPECT_EQ(counts.kept, 0);
    EXPECT_EQ(counts.made, 1 + 2);
  }
  ExpectExactCollectives(nodes, {0, 1});
}

// What a peer publishes is validated: a kept-link entry that does not parse
// fails the connect naming the peer, instead of being trusted.
TEST(TcpKeptLinksTest, MalformedPublicationIsRefusedNamingThePeer) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  ASSERT_TRUE(
      store->Set("baton/job/1/data/rounds/1", "127.0.0.1 9 zz:12").ok());
  std::unique_ptr<TcpTransport> transport = NewTransport();
  auto rounds = transport->ConnectNegotiation(Request(0, 2, 1, store));
  ASSERT_FALSE(rounds.ok());
  EXPECT_EQ(rounds.status().code(), absl::StatusCode::kInvalidArgument)
      << rounds.status();
  EXPECT_THAT(rounds.status().message(), HasSubstr("node rank 1"));
  EXPECT_THAT(rounds.status().message(), HasSubstr("127.0.0.1 9 zz:12"));
}

}  // namespace
}  // namespace baton::agent
