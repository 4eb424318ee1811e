// The agent's RendezvousClient against the real baton-coordinator binary:
// gloo communicators bootstrapped through the coordinator's store, stale
// generations, waiting Gets, and a coordinator restart.
#include "agent/rendezvous_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/transport/gloo/gloo_transport.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator_process.h"
#include "tests/integration/test_agent.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr absl::Duration kLiveness = absl::Milliseconds(1000);
constexpr absl::Duration kTick = absl::Milliseconds(50);
// Scheduling slack on a loaded 2-core machine; bounds stay functional.
constexpr milliseconds kSlack{3000};

// On the clock the client's timeouts are measured on (Clock::Real(), the
// wall clock): a slewed wall clock could make a 300 ms timeout last 299.9 ms
// on the steady clock.
milliseconds Since(absl::Time start) {
  return absl::ToChronoMilliseconds(Clock::Real()->Now() - start);
}

class RendezvousClientTest : public ::testing::Test {
 protected:
  void SetUp() override { StartCoordinator(0); }

  void StartCoordinator(int port) {
    const absl::Status started = coordinator_.Start(
        {"--heartbeat_interval_ms=200",
         absl::StrCat("--liveness_timeout_ms=",
                      absl::ToInt64Milliseconds(kLiveness)),
         absl::StrCat("--tick_interval_ms=", absl::ToInt64Milliseconds(kTick)),
         "--reform_timeout_ms=30000"},
        port);
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(coordinator_.address(),
                                   grpc::InsecureChannelCredentials());
  }

  std::unique_ptr<TestAgent> Agent(const std::string& node) {
    return TestAgent::Connected(coordinator_.address(), node);
  }

  // Agents n0..n<nodes-1> (one trainer each, joining in that order) form job
  // "job"; returns once every agent has generation 1's membership.
  struct FormedJob {
    std::vector<std::unique_ptr<TestAgent>> agents;
    // The generation as the last agent was told it (the shared fields).
    v1::Membership membership;
    // Each agent's own view, by node rank.
    std::vector<v1::Membership> views;
  };
  FormedJob FormJob(int nodes, int min_nodes = 0) {
    FormedJob formed;
    for (int i = 0; i < nodes; ++i) {
      formed.agents.push_back(Agent(absl::StrCat("n", i)));
      const uint64_t seq = formed.agents.back()->Join(
          "job", absl::StrCat("127.0.0.1:", 7000 + i), 1, nodes, min_nodes);
      EXPECT_TRUE(formed.agents.back()->WaitForReply(seq).has_value());
    }
    for (auto& agent : formed.agents) {
      formed.views.push_back(agent->AwaitMembership());
    }
    formed.membership = formed.views.back();
    return formed;
  }

  std::shared_ptr<RendezvousClient> Client(int64_t generation) {
    RendezvousClient::Options options;
    options.rpc_margin = milliseconds(2000);
    options.set_timeout = milliseconds(5000);
    return std::make_shared<RendezvousClient>(channel_, "job", generation,
                                              options);
  }

  CoordinatorProcess coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RendezvousClientTest, ThreeNodesConnectGlooThroughTheCoordinator) {
  constexpr int kNodes = 3;
  constexpr int kCommunicators = 2;
  constexpr size_t kCount = (size_t{1} << 20) + 1;
  const FormedJob job = FormJob(kNodes);
  ASSERT_EQ(job.membership.generation(), 1);
  ASSERT_FALSE(job.membership.store_prefix().empty());
  // The generation's data-plane secret, drawn by the real coordinator.
  EXPECT_EQ(job.membership.data_plane_secret().size(), size_t{32});
  std::vector<std::thread> nodes;
  for (int rank = 0; rank < kNodes; ++rank) {
    nodes.emplace_back([&, rank] {
      auto transport = GlooTransport::Create("127.0.0.1");
      ASSERT_TRUE(transport.ok()) << transport.status();
      ConnectRequest request;
      request.node_rank = rank;
      request.num_nodes = kNodes;
      request.prefix = job.membership.store_prefix();
      request.secret = job.membership.data_plane_secret();
      request.store = Client(job.membership.generation());
      request.count = kCommunicators;
      request.timeout = milliseconds(10000);
      auto communicators = (*transport)->Connect(request);
      ASSERT_TRUE(communicators.ok())
          << "node " << rank << ": " << communicators.status();
      ASSERT_EQ(communicators->size(), size_t{kCommunicators});
      for (int c = 0; c < kCommunicators; ++c) {
        std::vector<float> data(kCount);
        for (size_t i = 0; i < kCount; ++i) {
          data[i] = static_cast<float>((i + rank + c) % 100);
        }
        const absl::Status status = (*communicators)[c]->Allreduce(
            data.data(), kCount, v1::DATA_TYPE_FLOAT32, CollectiveOptions{});
        ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
        for (size_t i = 0; i < kCount; ++i) {
          float expected = 0;
          for (int r = 0; r < kNodes; ++r) {
            expected += static_cast<float>((i + r + c) % 100);
          }
          ASSERT_EQ(data[i], expected) << "node " << rank << " index " << i;
        }
      }
    });
  }
  for (std::thread& node : nodes) node.join();
}

TEST_F(RendezvousClientTest, GetWaitsUntilAnotherClientSetsTheKey) {
  const FormedJob job = FormJob(1);
  auto getter = Client(1);
  auto setter = Client(1);
  const std::string value("gloo\0address", 12);
  absl::StatusOr<std::vector<std::string>> got;
  const absl::Time start = Clock::Real()->Now();
  std::thread waiter([&] {
    got = getter->Get({"a", "b"}, milliseconds(10000));
  });
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_TRUE(setter->Set("a", "first").ok());
  ASSERT_TRUE(setter->Set("b", value).ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ::testing::ElementsAre("first", value));
  EXPECT_GE(Since(start).count(), 200);
  EXPECT_LT(Since(start).count(), kSlack.count());
}

TEST_F(RendezvousClientTest, GetTimesOutNamingTheMissingKeys) {
  const FormedJob job = FormJob(1);
  auto client = Client(1);
  ASSERT_TRUE(client->Set("here", "v").ok());
  const absl::Time start = Clock::Real()->Now();
  const auto got = client->Get({"here", "missing"}, milliseconds(300));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded)
      << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("\"missing\""));
  EXPECT_GE(Since(start).count(), 300);
  EXPECT_LT(Since(start).count(), (milliseconds(300) + kSlack).count());
  // Without waiting: answered at once.
  EXPECT_EQ(client->Get({"missing"}, milliseconds(0)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  const auto here = client->Get({"here"}, milliseconds(0));
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_THAT(*here, ::testing::ElementsAre("v"));
}

// A lost node ends generation 1: a Get waiting in it, later requests for
// it, and a gloo Connect bootstrapping through it all get ABORTED.
TEST_F(RendezvousClientTest, StaleGenerationIsAborted) {
  FormedJob job = FormJob(2, /*min_nodes=*/1);
  auto stale = Client(1);
  absl::StatusOr<std::vector<std::string>> waited;
  std::thread waiter(
      [&] { waited = stale->Get({"never"}, milliseconds(20000)); });
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> connected;
  std::thread connector([&] {
    auto transport = GlooTransport::Create("127.0.0.1");
    ASSERT_TRUE(transport.ok()) << transport.status();
    ConnectRequest request;
    request.node_rank = 0;
    request.num_nodes = 2;
    request.prefix = job.membership.store_prefix();
    request.secret = job.membership.data_plane_secret();
    request.store = stale;
    request.timeout = milliseconds(20000);
    connected = (*transport)->Connect(request);
  });
  std::this_thread::sleep_for(milliseconds(300));
  const absl::Time lost = Clock::Real()->Now();
  job.agents[1]->Abort();
  waiter.join();
  connector.join();
  EXPECT_LT(Since(lost).count(), kSlack.count());
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kAborted)
      << waited.status();
  EXPECT_EQ(connected.status().code(), absl::StatusCode::kAborted)
      << connected.status();
  EXPECT_THAT(connected.status().message(),
              HasSubstr("connecting communicator c0 of 2 nodes"));

  // min_nodes=1: generation 2 is sealed with the survivor.
  const v1::Membership next = job.agents[0]->AwaitMembership(2);
  EXPECT_EQ(next.generation(), 2);
  const absl::Status set = stale->Set("k", "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kAborted) << set;
  EXPECT_THAT(set.message(), HasSubstr("is at generation 2"));
  EXPECT_TRUE(Client(2)->Set("k", "v").ok());
}

// While the coordinator is down the client retries instead of failing at
// once; after the restart (and the job's recovery) the same client works.
TEST_F(RendezvousClientTest, RetriesWhileTheCoordinatorIsDown) {
  FormedJob job = FormJob(2);
  auto client = Client(1);
  ASSERT_TRUE(client->Set("before", "v").ok());

  const int port = coordinator_.port();
  coordinator_.Kill();
  const absl::Time start = Clock::Real()->Now();
  const auto down = client->Get({"before"}, milliseconds(1000));
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable)
      << down.status();
  EXPECT_GE(Since(start).count(), 1000);
  EXPECT_LT(Since(start).count(), (milliseconds(1000) + kSlack).count());

  StartCoordinator(port);
  for (int i = 0; i < 2; ++i) {
    auto agent = Agent(absl::StrCat("n", i));
    v1::AgentMessage message;
    auto* rejoin = message.mutable_rejoin();
    *rejoin->mutable_membership() = job.views[i];
    rejoin->set_completed_step(0);
    rejoin->set_expected_nodes(2);
    const uint64_t seq = agent->Send(message);
    const auto reply = agent->WaitForReply(seq);
    ASSERT_TRUE(reply.has_value());
    ASSERT_TRUE(reply->has_join_accepted()) << reply->DebugString();
    job.agents[i] = std::move(agent);
  }
  // The client's channel may still be backing off from the dead process:
  // Set retries through that.
  const absl::Status set = client->Set("after", "w");
  ASSERT_TRUE(set.ok()) << set;
  // Keys written before the restart are gone; the scope is open again.
  EXPECT_EQ(client->Get({"before"}, milliseconds(0)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  const auto after = client->Get({"after"}, milliseconds(1000));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_THAT(*after, ::testing::ElementsAre("w"));
}

}  // namespace
}  // namespace baton::agent
