// Bad input from trainers and disagreements between nodes: each gets a clear
// error on the right call, and nothing hangs. The test process itself is the
// trainers (the client library, in-process); coordinator and agents are real
// processes.
#include <unistd.h>

#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include "baton/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"

namespace baton {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr auto kWait = std::chrono::seconds(20);

// Connects every trainer at once (a job forms only when all are there).
std::vector<std::unique_ptr<Client>> ConnectAll(
    const std::vector<ClientOptions>& options) {
  std::vector<std::future<absl::StatusOr<std::unique_ptr<Client>>>> futures;
  for (const ClientOptions& o : options) {
    futures.push_back(
        std::async(std::launch::async, [o] { return Client::Connect(o); }));
  }
  std::vector<std::unique_ptr<Client>> clients;
  for (auto& f : futures) {
    auto client = f.get();
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) clients.push_back(std::move(*client));
  }
  return clients;
}

v1::TensorSpec Spec(const std::string& name, v1::DataType dtype,
                    std::vector<int64_t> shape,
                    v1::CollectiveOp op = v1::COLLECTIVE_OP_PUSH_PULL) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(dtype);
  for (int64_t d : shape) spec.add_shape(d);
  spec.set_op(op);
  return spec;
}

// Declares one float32 tensor "g" of 8 elements.
std::vector<std::shared_ptr<Tensor>> DeclareG(Client& client) {
  auto declared = client.Declare({Spec("g", v1::DATA_TYPE_FLOAT32, {8})});
  EXPECT_TRUE(declared.ok()) << declared.status();
  return declared.ok() ? *declared : std::vector<std::shared_ptr<Tensor>>{};
}

class AgentErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(cluster_.Start(2).ok()); }
  LocalCluster cluster_;
};

TEST_F(AgentErrorsTest, BadAttachIsRefusedWithTheFieldNamed) {
  ClientOptions bad_rank = cluster_.TrainerOptions(1, "attach", 2, 2);
  auto client = Client::Connect(bad_rank);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("local_rank is 2"));

  ClientOptions bad_job = cluster_.TrainerOptions(1, "no spaces");
  client = Client::Connect(bad_job);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("AttachRequest.job"));

  ClientOptions bad_mode = cluster_.TrainerOptions(1, "mode");
  bad_mode.scheduling = "lifo";
  client = Client::Connect(bad_mode);
  EXPECT_THAT(client.status().message(), HasSubstr("scheduling is \"lifo\""));

  ClientOptions no_agent = cluster_.TrainerOptions(1, "x");
  no_agent.socket = cluster_.dir() + "/nobody.sock";
  client = Client::Connect(no_agent);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("nobody.sock"));
}

TEST_F(AgentErrorsTest, LocalRanksMustAgreeAndBeUnique) {
  // Rank 0 of 2 attaches and waits for rank 1.
  auto first = std::async(std::launch::async, [&] {
    return Client::Connect(cluster_.TrainerOptions(1, "local", 0, 2));
  });
  absl::SleepFor(absl::Milliseconds(300));
  auto other_size = Client::Connect(cluster_.TrainerOptions(1, "local", 1, 3));
  EXPECT_EQ(other_size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other_size.status().message(),
              AllOf(HasSubstr("local_size is 3"), HasSubstr("gave 2")));
  auto same_rank = Client::Connect(cluster_.TrainerOptions(1, "local", 0, 2));
  EXPECT_EQ(same_rank.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(same_rank.status().message(), HasSubstr("local rank 0"));
  auto second = Client::Connect(cluster_.TrainerOptions(1, "local", 1, 2));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(first.get().ok());
}

TEST_F(AgentErrorsTest, BadDeclarationsNameTheTensorAndField) {
  auto clients = ConnectAll({cluster_.TrainerOptions(1, "declare", 0, 2),
                             cluster_.TrainerOptions(1, "declare", 1, 2)});
  ASSERT_EQ(clients.size(), 2u);
  auto bad = clients[0]->Declare({Spec("w", v1::DATA_TYPE_UNSPECIFIED, {4})});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("tensors[0]"), HasSubstr("dtype")));
  bad = clients[0]->Declare({Spec("w", v1::DATA_TYPE_FLOAT32, {-1})});
  EXPECT_THAT(bad.status().message(), HasSubstr("dimensions must be >= 0"));

  // All or nothing: "a" is not declared when "b" is refused.
  bad = clients[0]->Declare({Spec("a", v1::DATA_TYPE_FLOAT32, {2}),
                             Spec("b", v1::DATA_TYPE_FLOAT32, {-3})});
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("tensors[1]"), HasSubstr("nothing of this")));
  auto w = clients[0]->Declare({Spec("w", v1::DATA_TYPE_FLOAT32, {4})});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)[0]->index(), 0);
  bad = clients[0]->Declare({Spec("w", v1::DATA_TYPE_FLOAT32, {4})});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("declares \"w\" (float32 [4] push_pull) but its "
                        "latest version is 0: declare a name anew as its "
                        "next version (1)"));
  v1::TensorSpec skipped = Spec("w", v1::DATA_TYPE_FLOAT32, {2});
  skipped.set_version(2);
  bad = clients[0]->Declare({skipped});
  EXPECT_THAT(bad.status().message(),
              HasSubstr("its latest version is 0: declare a name anew as its "
                        "next version (1)"));
  // The other local rank declares #0 differently.
  bad = clients[1]->Declare({Spec("w", v1::DATA_TYPE_INT64, {4})});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("dtype int64 vs float32"));
}

TEST_F(AgentErrorsTest, LocalRanksDisagreeingOnAverageFailThenRetry) {
  auto clients = ConnectAll({cluster_.TrainerOptions(1, "average", 0, 2),
                             cluster_.TrainerOptions(1, "average", 1, 2)});
  ASSERT_EQ(clients.size(), 2u);
  const std::vector<std::shared_ptr<Tensor>> tensors[2] = {
      DeclareG(*clients[0]), DeclareG(*clients[1])};
  ASSERT_FALSE(tensors[0].empty() || tensors[1].empty());
  auto a = clients[0]->PushPullAsync(*tensors[0][0], 0, /*average=*/true);
  auto b = clients[1]->PushPullAsync(*tensors[1][0], 0, /*average=*/false);
  for (auto* h : {&a, &b}) {
    ASSERT_TRUE(h->ok());
    absl::Status status = (**h)->Wait(kWait);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("average="));
  }
  // Both may run the same step again, in agreement.
  a = clients[0]->PushPullAsync(*tensors[0][0], 0, false);
  b = clients[1]->PushPullAsync(*tensors[1][0], 0, false);
  EXPECT_TRUE((*a)->Wait(kWait).ok());
  EXPECT_TRUE((*b)->Wait(kWait).ok());
}

TEST_F(AgentErrorsTest, BadEnqueuesFailTheirHandle) {
  auto clients = ConnectAll({cluster_.TrainerOptions(1, "enqueue")});
  ASSERT_EQ(clients.size(), 1u);
  Client& c = *clients[0];
  auto tensors = c.Declare(
      {Spec("g", v1::DATA_TYPE_FLOAT32, {8}),
       Spec("p", v1::DATA_TYPE_FLOAT32, {8}, v1::COLLECTIVE_OP_BROADCAST)});
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  const Tensor& g = *(*tensors)[0];
  const Tensor& p = *(*tensors)[1];

  auto handle = c.PushPullAsync(g, 3, false);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE((*handle)->Wait(kWait).ok());
  handle = c.PushPullAsync(g, 3, false);
  absl::Status status = (*handle)->Wait(kWait);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("steps of a tensor must increase"));

  handle = c.BroadcastAsync(p, 0, 5);
  status = (*handle)->Wait(kWait);
  EXPECT_THAT(status.message(), HasSubstr("root_rank is 5"));

  const Tensor undeclared(7, g.spec(), g.size_bytes(), g.input_bytes(), nullptr,
                          0, 0);
  handle = c.PushPullAsync(undeclared, 0, false);
  status = (*handle)->Wait(kWait);
  EXPECT_THAT(status.message(), HasSubstr("index is 7"));
}

TEST_F(AgentErrorsTest, NodesEnqueueingDifferentStepsFailInsteadOfHanging) {
  auto clients = ConnectAll({cluster_.TrainerOptions(1, "steps", 0, 1, 2),
                             cluster_.TrainerOptions(2, "steps", 0, 1, 2)});
  ASSERT_EQ(clients.size(), 2u);
  const std::vector<std::shared_ptr<Tensor>> tensors[2] = {
      DeclareG(*clients[0]), DeclareG(*clients[1])};
  ASSERT_FALSE(tensors[0].empty() || tensors[1].empty());
  auto a = clients[0]->PushPullAsync(*tensors[0][0], 1, false);
  auto b = clients[1]->PushPullAsync(*tensors[1][0], 2, false);
  for (auto* h : {&a, &b}) {
    ASSERT_TRUE(h->ok());
    absl::Status status = (**h)->Wait(kWait);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), AllOf(HasSubstr("\"g\""), HasSubstr("step 1"),
                                        HasSubstr("step 2")));
  }
}

TEST_F(AgentErrorsTest, NodesDeclaringATensorDifferentlyGetTheMismatch) {
  auto clients = ConnectAll({cluster_.TrainerOptions(1, "mismatch", 0, 1, 2),
                             cluster_.TrainerOptions(2, "mismatch", 0, 1, 2)});
  ASSERT_EQ(clients.size(), 2u);
  auto t0 = clients[0]->Declare({Spec("w", v1::DATA_TYPE_FLOAT32, {4})});
  auto t1 = clients[1]->Declare({Spec("w", v1::DATA_TYPE_FLOAT32, {5})});
  ASSERT_TRUE(t0.ok() && t1.ok());
  auto handle = clients[0]->PushPullAsync(*(*t0)[0], 0, false);
  ASSERT_TRUE(handle.ok());
  absl::Status status = (*handle)->Wait(kWait);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("w"), HasSubstr("shape")));
}

TEST_F(AgentErrorsTest, NodesWithDifferentSchedulingModesFail) {
  ClientOptions fifo = cluster_.TrainerOptions(1, "modes", 0, 1, 2);
  fifo.scheduling = "fifo";
  auto clients =
      ConnectAll({fifo, cluster_.TrainerOptions(2, "modes", 0, 1, 2)});
  ASSERT_EQ(clients.size(), 2u);
  const std::vector<std::shared_ptr<Tensor>> tensors[2] = {
      DeclareG(*clients[0]), DeclareG(*clients[1])};
  ASSERT_FALSE(tensors[0].empty() || tensors[1].empty());
  auto handle = clients[0]->PushPullAsync(*tensors[0][0], 0, false);
  ASSERT_TRUE(handle.ok());
  absl::Status status = (*handle)->Wait(kWait);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("scheduling mode"));
}

// Runs baton-agent with `flags` to its end; returns (exit code, stderr).
std::pair<int, std::string> RunAgent(const std::vector<std::string>& flags) {
  ChildProcess agent;
  ChildProcess::Options options;
  options.argv = {LocalCluster::AgentBinary()};
  options.argv.insert(options.argv.end(), flags.begin(), flags.end());
  char path[] = "/tmp/baton-agent-flags.XXXXXX";
  const int fd = mkstemp(path);
  close(fd);
  options.stderr_path = path;
  EXPECT_TRUE(agent.Start(options).ok());
  const ProcessExit exit = agent.Wait(absl::Seconds(10));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  unlink(path);
  return {exit.exited ? exit.exit_code : -1, text + agent.stdout_text()};
}

TEST(AgentFlagsTest, BadFlagsExitWithTwoAndSayWhatToFix) {
  const struct {
    std::string flag;
    std::string says;
  } cases[] = {
      {"--scheduling=lifo", "--scheduling=lifo is unknown"},
      {"--credit_bytes=0", "--credit_bytes=0 must be positive"},
      {"--data_channels=17", "at most 16"},
      {"--coordinator=nohost", "--coordinator"},
      {"--node=bad name", "--node"},
      {"--op_timeout_ms=soon", "op_timeout_ms"},
  };
  for (const auto& c : cases) {
    const auto [code, output] = RunAgent({c.flag, "--socket=/tmp/unused.sock"});
    EXPECT_EQ(code, 2) << c.flag << ": " << output;
    EXPECT_THAT(output, HasSubstr(c.says)) << c.flag;
  }
}

TEST(AgentFlagsTest, HelpListsTheAgentsFlagsWithDefaults) {
  const auto [code, output] = RunAgent({"--help"});
  EXPECT_THAT(output, HasSubstr("-credit_bytes"));
  EXPECT_THAT(output, HasSubstr("default: 16777216"));
  EXPECT_THAT(output, HasSubstr("-scheduling"));
  EXPECT_THAT(output, HasSubstr("-data_channels"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("-logtostderr")));
}

}  // namespace
}  // namespace baton
