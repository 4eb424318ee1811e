// The real baton-coordinator binary driven by real gRPC clients acting as
// agents: membership, mismatches, losses, steps and stalls, the store, many
// jobs, and restart with state rebuilt from reconnecting agents.
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "baton/v1/rendezvous.grpc.pb.h"
#include "baton/v1/status.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator_process.h"
#include "tests/integration/test_agent.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Short deadlines so the scenarios run in seconds.
constexpr absl::Duration kLiveness = absl::Milliseconds(1000);
constexpr absl::Duration kTick = absl::Milliseconds(50);
constexpr absl::Duration kStall = absl::Milliseconds(500);
// Scheduling slack on a loaded 2-core machine; bounds stay functional.
constexpr absl::Duration kSlack = absl::Seconds(3);

v1::TensorSpec Spec(const std::string& name, std::vector<int64_t> shape,
                    v1::DataType dtype = v1::DATA_TYPE_FLOAT32) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(dtype);
  for (int64_t dim : shape) spec.add_shape(dim);
  spec.set_op(v1::COLLECTIVE_OP_PUSH_PULL);
  return spec;
}

class CoordinatorScenariosTest : public ::testing::Test {
 protected:
  void SetUp() override { StartCoordinator(0); }

  void StartCoordinator(int port) {
    const absl::Status started = coordinator_.Start(
        {"--heartbeat_interval_ms=200",
         absl::StrCat("--liveness_timeout_ms=",
                      absl::ToInt64Milliseconds(kLiveness)),
         absl::StrCat("--tick_interval_ms=", absl::ToInt64Milliseconds(kTick)),
         absl::StrCat("--stall_threshold_ms=",
                      absl::ToInt64Milliseconds(kStall)),
         "--reform_timeout_ms=30000"},
        port);
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(coordinator_.address(),
                                   grpc::InsecureChannelCredentials());
    status_ = v1::Status::NewStub(channel_);
    store_ = v1::RendezvousStore::NewStub(channel_);
  }

  std::unique_ptr<TestAgent> Agent(const std::string& node,
                                   const std::string& instance = "") {
    return TestAgent::Connected(coordinator_.address(), node, instance);
  }

  // Joins and waits for the answer, so that joins from different agents
  // reach the coordinator in the order the test gives (node ranks follow
  // join order). Returns the reply.
  v1::CoordinatorMessage JoinInOrder(TestAgent& agent, const std::string& job,
                                     const std::string& address,
                                     int32_t local_size, int32_t expected,
                                     int32_t min_nodes = 0,
                                     int64_t partition_bytes = 0) {
    const uint64_t seq = agent.Join(job, address, local_size, expected,
                                    min_nodes, partition_bytes);
    auto reply = agent.WaitForReply(seq);
    EXPECT_TRUE(reply.has_value()) << agent.node_name();
    return reply ? *reply : v1::CoordinatorMessage();
  }

  // Agents n0, n1, ... with these trainer counts form job "job" (joining in
  // that order, data planes at 10.0.0.<i+1>:7000); returns once every agent
  // has generation 1's membership.
  struct FormedJob {
    std::vector<std::unique_ptr<TestAgent>> agents;
    // Each agent's own view of generation 1 (by node rank).
    std::vector<v1::Membership> views;
  };
  FormedJob FormJob(const std::vector<int32_t>& local_sizes,
                    int32_t min_nodes = 0, int64_t partition_bytes = 0) {
    FormedJob formed;
    const int32_t nodes = static_cast<int32_t>(local_sizes.size());
    for (int32_t i = 0; i < nodes; ++i) {
      formed.agents.push_back(Agent(absl::StrCat("n", i)));
      JoinInOrder(*formed.agents.back(), "job",
                  absl::StrCat("10.0.0.", i + 1, ":7000"), local_sizes[i],
                  nodes, min_nodes, partition_bytes);
    }
    for (auto& agent : formed.agents) {
      formed.views.push_back(agent->AwaitMembership());
    }
    return formed;
  }

  v1::Error AwaitError(TestAgent& agent) {
    auto message = agent.WaitForBody(v1::CoordinatorMessage::kError);
    EXPECT_TRUE(message.has_value()) << agent.node_name();
    return message ? message->error() : v1::Error();
  }

  v1::JobStatus GetJob(const std::string& job) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::GetJobRequest request;
    request.set_job(job);
    v1::JobStatus status;
    const grpc::Status rpc = status_->GetJob(&context, request, &status);
    EXPECT_TRUE(rpc.ok()) << rpc.error_message();
    return status;
  }

  // Polls status until `done` holds, up to `timeout`.
  v1::JobStatus AwaitJob(const std::string& job,
                         const std::function<bool(const v1::JobStatus&)>& done,
                         absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    v1::JobStatus status = GetJob(job);
    while (!done(status) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      status = GetJob(job);
    }
    return status;
  }

  grpc::Status StoreGet(const std::string& job, int64_t generation,
                        std::vector<std::string> keys, int64_t wait_ms,
                        v1::StoreGetResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(wait_ms + 5000));
    v1::StoreGetRequest request;
    request.mutable_scope()->set_job(job);
    request.mutable_scope()->set_generation(generation);
    for (std::string& key : keys) request.add_keys(std::move(key));
    request.set_wait_timeout_ms(wait_ms);
    return store_->Get(&context, request, response);
  }

  grpc::Status StoreSet(const std::string& job, int64_t generation,
                        const std::string& key, const std::string& value) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::StoreSetRequest request;
    request.mutable_scope()->set_job(job);
    request.mutable_scope()->set_generation(generation);
    request.set_key(key);
    request.set_value(value);
    v1::StoreSetResponse response;
    return store_->Set(&context, request, &response);
  }

  CoordinatorProcess coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Status::Stub> status_;
  std::unique_ptr<v1::RendezvousStore::Stub> store_;
};

TEST_F(CoordinatorScenariosTest, SealsWithHeterogeneousTrainerCounts) {
  auto a = Agent("n0"), b = Agent("n1"), c = Agent("n2");
  JoinInOrder(*a, "job", "10.0.0.1:7000", 4, 3);
  JoinInOrder(*b, "job", "10.0.0.2:7000", 1, 3);
  JoinInOrder(*c, "job", "10.0.0.3:7000", 2, 3);
  const v1::Membership m = a->AwaitMembership();
  // Node ranks 0 and 1 get the table; node rank 2 its own entry only.
  const v1::Membership keeper = b->AwaitMembership();
  const v1::Membership view = c->AwaitMembership();
  EXPECT_EQ(keeper.nodes_size(), 3);
  EXPECT_EQ(keeper.self().node_name(), "n1");
  EXPECT_EQ(view.nodes_size(), 0);
  EXPECT_EQ(view.self().node_name(), "n2");
  EXPECT_EQ(view.self().rank_offset(), 5);
  EXPECT_EQ(view.num_nodes(), 3);
  EXPECT_EQ(view.world_size(), 7);
  EXPECT_EQ(m.world_size(), 7);
  ASSERT_EQ(m.nodes_size(), 3);
  EXPECT_EQ(m.nodes(1).node_name(), "n1");
  EXPECT_EQ(m.nodes(1).rank_offset(), 4);
  EXPECT_EQ(m.nodes(2).rank_offset(), 5);
  const v1::JobStatus status = GetJob("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 1);
  EXPECT_EQ(status.world_size(), 7);
}

TEST_F(CoordinatorScenariosTest, DuplicateNodeNameGetsAClearError) {
  auto a = Agent("n0", "first"), dup = Agent("n0", "second");
  JoinInOrder(*a, "job", "10.0.0.1:7000", 1, 2);
  const v1::Error error =
      JoinInOrder(*dup, "job", "10.0.0.9:7000", 1, 2).error();
  EXPECT_EQ(error.code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(error.message(),
              HasSubstr("node name \"n0\" is already a member of job \"job\" "
                        "(agent at 10.0.0.1:7000): give each agent a unique "
                        "node name"));
}

TEST_F(CoordinatorScenariosTest, AgreeingManifestsGiveEveryAgentTheSamePlan) {
  FormedJob job = FormJob({2, 1}, 0, 1 << 20);
  std::unique_ptr<TestAgent>&a = job.agents[0], &b = job.agents[1];
  const std::vector<v1::TensorSpec> tensors = {
      Spec("layer1.weight", {1024, 768}), Spec("layer1.bias", {768})};
  a->Manifest("job", 1, tensors);
  b->Manifest("job", 1, tensors);
  auto plan_a = a->WaitForBody(v1::CoordinatorMessage::kPlan);
  auto plan_b = b->WaitForBody(v1::CoordinatorMessage::kPlan);
  ASSERT_TRUE(plan_a && plan_b);
  EXPECT_EQ(plan_a->plan().SerializeAsString(),
            plan_b->plan().SerializeAsString());
  const v1::TensorPlan& plan = plan_a->plan();
  EXPECT_EQ(plan.version(), 1);
  EXPECT_EQ(plan.partition_bytes(), 1 << 20);
  ASSERT_EQ(plan.tensors_size(), 2);
  EXPECT_EQ(plan.tensors(0).spec().name(), "layer1.weight");
  EXPECT_EQ(plan.tensors(0).priority(), 0);
  EXPECT_EQ(plan.tensors(0).size_bytes(), 1024 * 768 * 4);
  EXPECT_EQ(plan.tensors(0).num_partitions(), 3);
  EXPECT_EQ(plan.tensors(1).priority(), 1);
  EXPECT_EQ(plan.tensors(1).num_partitions(), 1);
  EXPECT_EQ(GetJob("job").plan().num_tensors(), 2);
}

TEST_F(CoordinatorScenariosTest, MismatchErrorNamesTensorBothValuesAndRanks) {
  FormedJob job = FormJob({2, 1});
  std::unique_ptr<TestAgent>&a = job.agents[0], &b = job.agents[1];
  a->Manifest("job", 1, {Spec("fc.weight", {3, 4})});
  b->Manifest("job", 1, {Spec("fc.weight", {4, 3})});
  for (TestAgent* agent : {a.get(), b.get()}) {
    const v1::Error error = AwaitError(*agent);
    EXPECT_EQ(error.code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(error.mismatch().tensor(), "fc.weight");
    EXPECT_EQ(error.mismatch().field(), "shape");
    ASSERT_EQ(error.mismatch().values_size(), 2);
    EXPECT_EQ(error.mismatch().values(0).value(), "[3, 4]");
    EXPECT_THAT(error.mismatch().values(0).ranks(), ElementsAre(0, 1));
    EXPECT_EQ(error.mismatch().values(1).value(), "[4, 3]");
    EXPECT_THAT(error.mismatch().values(1).ranks(), ElementsAre(2));
    EXPECT_THAT(error.message(), HasSubstr("fc.weight"));
    EXPECT_THAT(error.message(), HasSubstr("[3, 4] on ranks {0,1} (node n0)"));
    EXPECT_THAT(error.message(), HasSubstr("[4, 3] on ranks {2} (node n1)"));
  }
  const v1::JobStatus status = GetJob("job");
  ASSERT_EQ(status.mismatches_size(), 1);
  EXPECT_EQ(status.plan().version(), 0);
}

TEST_F(CoordinatorScenariosTest,
       SilentNodeIsLostWithinTheBoundAndSurvivorsTold) {
  auto a = Agent("n0"), b = Agent("n1");
  auto silent = std::make_unique<TestAgent>();
  ASSERT_TRUE(silent->Connect(coordinator_.address(), "n2", "i-n2").ok());
  JoinInOrder(*a, "job", "10.0.0.1:7000", 1, 3);
  JoinInOrder(*b, "job", "10.0.0.2:7000", 1, 3);
  JoinInOrder(*silent, "job", "10.0.0.3:7000", 1, 3);
  const absl::Time last_word = absl::Now();
  a->AwaitMembership();
  auto notice = a->WaitForBody(v1::CoordinatorMessage::kGenerationAborted,
                               kLiveness + kTick + kSlack);
  const absl::Duration detected_after = absl::Now() - last_word;
  ASSERT_TRUE(notice.has_value()) << "no loss notice within the bound";
  EXPECT_GE(detected_after, kLiveness);
  EXPECT_EQ(notice->generation_aborted().lost_node(), "n2");
  EXPECT_EQ(notice->generation_aborted().aborted_generation(), 1);
  EXPECT_EQ(notice->generation_aborted().new_generation(), 2);
  EXPECT_THAT(notice->generation_aborted().reason(),
              HasSubstr("node n2 missed its liveness deadline"));
  ASSERT_TRUE(b->WaitForBody(v1::CoordinatorMessage::kGenerationAborted));
  auto ended = silent->WaitForStreamEnd();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const v1::JobStatus status = GetJob("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_REFORMING);
  EXPECT_EQ(status.generation(), 2);
}

TEST_F(CoordinatorScenariosTest, CrashedAgentIsLostAtOnce) {
  FormedJob job = FormJob({1, 1}, /*min_nodes=*/1);
  std::unique_ptr<TestAgent>&a = job.agents[0], &b = job.agents[1];
  b->Abort();
  auto notice =
      a->WaitForBody(v1::CoordinatorMessage::kGenerationAborted, kSlack);
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(notice->generation_aborted().lost_node(), "n1");
  EXPECT_THAT(notice->generation_aborted().reason(),
              HasSubstr("lost its session"));
  // min_nodes=1: re-sealed at once with the survivor.
  const v1::Membership m = a->AwaitMembership(2);
  EXPECT_EQ(m.world_size(), 1);
  // The status service reports the re-form.
  const v1::JobStatus status = GetJob("job");
  ASSERT_EQ(status.reforms_size(), 1);
  const v1::Reform& reform = status.reforms(0);
  EXPECT_EQ(reform.aborted_generation(), 1);
  EXPECT_EQ(reform.new_generation(), 2);
  EXPECT_EQ(reform.cause(), "lost");
  EXPECT_EQ(reform.node_name(), "n1");
  EXPECT_EQ(reform.reason(), notice->generation_aborted().reason());
  EXPECT_EQ(reform.nodes_before(), 2);
  EXPECT_EQ(reform.nodes_after(), 1);
  EXPECT_EQ(reform.outcome(), "sealed");
  EXPECT_EQ(status.members_lost(), 1);
  EXPECT_EQ(status.members_joined(), 0);
}

TEST_F(CoordinatorScenariosTest, GlobalStepAndLagFollowTheSlowestRank) {
  FormedJob job = FormJob({2, 1});
  std::unique_ptr<TestAgent>&a = job.agents[0], &b = job.agents[1];
  a->StepReport("job", 1, {{0, 12}, {1, 11}});
  b->StepReport("job", 1, {{2, 9}});
  const v1::JobStatus status = AwaitJob(
      "job", [](const v1::JobStatus& s) { return s.global_step() == 9; },
      kSlack);
  EXPECT_EQ(status.global_step(), 9);
  ASSERT_EQ(status.members_size(), 2);
  ASSERT_EQ(status.members(1).ranks_size(), 1);
  EXPECT_EQ(status.members(1).ranks(0).rank(), 2);
  EXPECT_EQ(status.members(1).ranks(0).lag(), 3);
  EXPECT_EQ(status.members(0).ranks(1).lag(), 1);
}

TEST_F(CoordinatorScenariosTest, StallReportNamesTheMissingRanks) {
  FormedJob job = FormJob({2, 2});
  std::unique_ptr<TestAgent>&a = job.agents[0], &b = job.agents[1];
  const std::vector<v1::TensorSpec> tensors = {Spec("grad.w", {16})};
  a->Manifest("job", 1, tensors);
  b->Manifest("job", 1, tensors);
  ASSERT_TRUE(a->WaitForBody(v1::CoordinatorMessage::kPlan));
  v1::PendingTensor waiting;
  waiting.set_tensor_id(0);
  waiting.set_step(3);
  waiting.add_submitted_ranks(0);
  waiting.add_submitted_ranks(1);
  waiting.set_waiting_ms(100);
  a->StepReport("job", 1, {{0, 2}, {1, 2}}, {waiting});
  v1::PendingTensor partial = waiting;
  partial.clear_submitted_ranks();
  partial.add_submitted_ranks(2);
  b->StepReport("job", 1, {{2, 2}, {3, 2}}, {partial});
  // The stall shows in status once it crosses the threshold, and in the
  // event log at the coordinator's next tick.
  const auto has_stall_event = [](const v1::JobStatus& s) {
    for (const v1::JobEvent& e : s.events()) {
      if (e.kind() == "stall") return true;
    }
    return false;
  };
  const v1::JobStatus status = AwaitJob(
      "job",
      [&](const v1::JobStatus& s) {
        return s.stalls_size() > 0 && has_stall_event(s);
      },
      kStall + kSlack);
  ASSERT_EQ(status.stalls_size(), 1);
  EXPECT_EQ(status.stalls(0).tensor(), "grad.w");
  EXPECT_EQ(status.stalls(0).step(), 3);
  EXPECT_THAT(status.stalls(0).missing_ranks(), ElementsAre(3));
  EXPECT_THAT(status.stalls(0).submitted_ranks(), ElementsAre(0, 1, 2));
  EXPECT_GE(status.stalls(0).waiting_ms(), absl::ToInt64Milliseconds(kStall));
  bool event = false;
  for (const v1::JobEvent& e : status.events()) {
    if (e.kind() == "stall") {
      event = true;
      EXPECT_THAT(e.message(),
                  HasSubstr("tensor grad.w, step 3: waiting for ranks {3}"));
    }
  }
  EXPECT_TRUE(event);
}

TEST_F(CoordinatorScenariosTest, RendezvousStoreServesTheSealedGeneration) {
  FormedJob job = FormJob({1, 1});
  std::unique_ptr<TestAgent>& b = job.agents[1];

  // A waiting Get is woken by a Set from another client.
  v1::StoreGetResponse got;
  grpc::Status get_status;
  std::thread getter([&] {
    get_status = StoreGet("job", 1, {"rank0", "rank1"}, 10000, &got);
  });
  ASSERT_TRUE(StoreSet("job", 1, "rank0", std::string("a\0b", 3)).ok());
  ASSERT_TRUE(StoreSet("job", 1, "rank1", "tcp://n1").ok());
  getter.join();
  ASSERT_TRUE(get_status.ok()) << get_status.error_message();
  ASSERT_EQ(got.values_size(), 2);
  EXPECT_EQ(got.values(0), std::string("a\0b", 3));
  EXPECT_EQ(got.values(1), "tcp://n1");

  grpc::ClientContext context;
  v1::StoreAddRequest add;
  add.mutable_scope()->set_job("job");
  add.mutable_scope()->set_generation(1);
  add.set_key("count");
  add.set_delta(5);
  v1::StoreAddResponse sum;
  ASSERT_TRUE(store_->Add(&context, add, &sum).ok());
  EXPECT_EQ(sum.value(), 5);

  v1::StoreGetResponse missing;
  const grpc::Status timed_out = StoreGet("job", 1, {"nobody"}, 100, &missing);
  EXPECT_EQ(timed_out.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(timed_out.error_message(), HasSubstr("nobody"));
  EXPECT_EQ(StoreSet("other", 1, "k", "v").error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(StoreSet("job", 2, "k", "v").error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // A loss ends generation 1: its waiting Gets and later requests ABORTED.
  std::thread waiter([&] {
    v1::StoreGetResponse never;
    get_status = StoreGet("job", 1, {"never"}, 20000, &never);
  });
  absl::SleepFor(absl::Milliseconds(100));
  b->Abort();
  waiter.join();
  EXPECT_EQ(get_status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(StoreSet("job", 1, "k", "v").error_code(),
            grpc::StatusCode::ABORTED);
}

TEST_F(CoordinatorScenariosTest, TwoJobsRunInParallelIsolated) {
  auto a = Agent("n0"), b = Agent("n1"), c = Agent("n2"), d = Agent("n3");
  JoinInOrder(*a, "alpha", "10.0.0.1:7000", 1, 2);
  JoinInOrder(*c, "beta", "10.0.0.3:7000", 1, 2);
  JoinInOrder(*b, "alpha", "10.0.0.2:7000", 1, 2);
  JoinInOrder(*d, "beta", "10.0.0.4:7000", 1, 2);
  EXPECT_EQ(a->AwaitMembership().nodes(1).node_name(), "n1");
  EXPECT_EQ(c->AwaitMembership().nodes(1).node_name(), "n3");
  b->Abort();
  ASSERT_TRUE(a->WaitForBody(v1::CoordinatorMessage::kGenerationAborted));
  EXPECT_EQ(GetJob("alpha").state(), v1::JOB_STATE_REFORMING);
  const v1::JobStatus beta = GetJob("beta");
  EXPECT_EQ(beta.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(beta.generation(), 1);
  EXPECT_FALSE(c->WaitForBody(v1::CoordinatorMessage::kGenerationAborted,
                              absl::Milliseconds(300)));
}

TEST_F(CoordinatorScenariosTest, UnknownJobAndBadJoinAreAnswered) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_job("nope");
  v1::JobStatus status;
  const grpc::Status rpc = status_->GetJob(&context, request, &status);
  EXPECT_EQ(rpc.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(rpc.error_message(), HasSubstr("\"nope\""));

  auto a = Agent("n0");
  const v1::Error error = JoinInOrder(*a, "job", "10.0.0.1:7000", 0, 2).error();
  EXPECT_EQ(error.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(error.message(), HasSubstr("JoinJob.local_size is 0"));
}

TEST_F(CoordinatorScenariosTest,
       RestartRebuildsRunningJobsFromReconnectingAgents) {
  FormedJob job = FormJob({2, 1});
  std::unique_ptr<TestAgent>&a = job.agents[0], &b = job.agents[1];
  const std::vector<v1::TensorSpec> tensors = {Spec("w", {8})};
  a->Manifest("job", 1, tensors);
  b->Manifest("job", 1, tensors);
  auto plan = a->WaitForBody(v1::CoordinatorMessage::kPlan);
  ASSERT_TRUE(plan.has_value());

  const int port = coordinator_.port();
  const ProcessExit exit = coordinator_.Kill();
  EXPECT_FALSE(exit.exited);
  ASSERT_TRUE(a->WaitForStreamEnd().has_value());
  StartCoordinator(port);

  // The agents reconnect and re-report what they run.
  std::vector<std::unique_ptr<TestAgent>> back;
  for (const int rank : {0, 1}) {
    back.push_back(Agent(absl::StrCat("n", rank)));
    v1::AgentMessage message;
    auto* rejoin = message.mutable_rejoin();
    *rejoin->mutable_membership() = job.views[rank];
    *rejoin->mutable_plan() = plan->plan();
    rejoin->set_completed_step(100);
    rejoin->set_expected_nodes(2);
    const uint64_t seq = back.back()->Send(message);
    auto reply = back.back()->WaitForReply(seq);
    ASSERT_TRUE(reply.has_value());
    ASSERT_TRUE(reply->has_join_accepted()) << reply->DebugString();
    EXPECT_EQ(reply->join_accepted().state(), v1::JOB_STATE_RUNNING);
  }
  const v1::JobStatus status = GetJob("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 1);
  EXPECT_EQ(status.world_size(), 3);
  EXPECT_EQ(status.global_step(), 100);
  EXPECT_EQ(status.plan().version(), 1);
  EXPECT_EQ(status.plan().num_tensors(), 1);
  for (const v1::MemberStatus& member : status.members()) {
    EXPECT_TRUE(member.connected()) << member.node_name();
  }
  EXPECT_EQ(status.events(0).kind(), "recovered");
  // The recovered job keeps running: step reports for generation 1 work.
  back[0]->StepReport("job", 1, {{0, 101}, {1, 101}});
  back[1]->StepReport("job", 1, {{2, 101}});
  EXPECT_EQ(
      AwaitJob(
          "job", [](const v1::JobStatus& s) { return s.global_step() == 101; },
          kSlack)
          .global_step(),
      101);
  EXPECT_FALSE(back[0]->WaitForBody(v1::CoordinatorMessage::kGenerationAborted,
                                    kLiveness + absl::Milliseconds(500)));
}

// Runs the coordinator binary with `args` to completion; its exit code and
// combined output.
std::pair<int, std::string> RunCoordinator(const std::string& args) {
  const std::string command =
      CoordinatorProcess::BinaryPath() + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    output += buffer;
  }
  const int status = pipe == nullptr ? -1 : pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(CoordinatorFlagsTest, UsageErrorsExit2WithOneLineNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--bogus=1", "unknown flag --bogus"},
      {"--liveness_timeout_ms=abc",
       "--liveness_timeout_ms=abc is not a valid int64"},
      {"--liveness_timeout_ms=1000 --heartbeat_interval_ms=2000",
       "--liveness_timeout_ms=1000 must exceed --heartbeat_interval_ms=2000"},
      {"--partition_bytes=12", "--partition_bytes=12 must be a multiple of 8"},
      {"--listen=nohost", "--listen"},
  };
  for (const auto& [args, expected] : cases) {
    const auto [code, output] = RunCoordinator(args);
    EXPECT_EQ(code, 2) << args << ": " << output;
    EXPECT_THAT(output, HasSubstr(expected)) << args;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1)
        << args << ": " << output;
  }
}

TEST(CoordinatorFlagsTest, EnvironmentSetsFlagsAndBadValuesAreNamed) {
  // The variable reaches the flag: its value fails the flag's own check.
  setenv("BATON_LIVENESS_TIMEOUT_MS", "100", 1);
  const auto [code, output] = RunCoordinator("--listen=127.0.0.1:0");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(output, HasSubstr("--liveness_timeout_ms=100 must exceed"));
  // The command line wins over the environment.
  const auto [code_cli, output_cli] = RunCoordinator(
      "--listen=127.0.0.1:0 --liveness_timeout_ms=3000 "
      "--heartbeat_interval_ms=5000");
  EXPECT_EQ(code_cli, 2);
  EXPECT_THAT(output_cli, HasSubstr("--liveness_timeout_ms=3000 must exceed"));
  setenv("BATON_LIVENESS_TIMEOUT_MS", "soon", 1);
  const auto [bad_code, bad_output] = RunCoordinator("--listen=127.0.0.1:0");
  unsetenv("BATON_LIVENESS_TIMEOUT_MS");
  EXPECT_EQ(bad_code, 2);
  EXPECT_THAT(bad_output, HasSubstr("environment variable "
                                    "BATON_LIVENESS_TIMEOUT_MS=\"soon\""));
}

TEST(CoordinatorFlagsTest, HelpListsEveryFlagWithItsDefault) {
  const auto [code, output] = RunCoordinator("--help");
  EXPECT_EQ(code, 0);
  for (const char* flag :
       {"--listen", "--heartbeat_interval_ms", "--liveness_timeout_ms",
        "--report_interval_ms", "--tick_interval_ms", "--stall_threshold_ms",
        "--reform_timeout_ms", "--job_retention_ms", "--partition_bytes",
        "--shutdown_grace_ms", "--events_per_job", "--max_message_bytes"}) {
    EXPECT_THAT(output, HasSubstr(flag)) << output;
  }
  EXPECT_THAT(output, HasSubstr("default: \"0.0.0.0:50051\""));
  EXPECT_THAT(output, Not(HasSubstr("--log_dir")));
}

}  // namespace
}  // namespace baton
