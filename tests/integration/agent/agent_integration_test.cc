// The agent end to end: a real coordinator, baton-agent processes and
// trainer processes (baton-test-trainer, on the client library) on loopback.
#include <signal.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "baton/v1/status.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

// Small partitions make "partition +/- 1" tensors small and big tensors
// split into many partitions.
constexpr char kPartition[] = "BATON_PARTITION_BYTES=65536";

// The big tensors' size: 100 MiB, except under ThreadSanitizer, where moving
// them through three agents takes minutes, and where /dev/shm cannot hold
// them (the node with 3 trainers needs 2 tensors x 4 regions: ~800 MiB).
std::string BigFlag() {
#if defined(__SANITIZE_THREAD__)
  return "--big=4";
#else
  struct statvfs shm;
  if (statvfs("/dev/shm", &shm) == 0 &&
      static_cast<uint64_t>(shm.f_bavail) * shm.f_frsize <
          (uint64_t{2} << 30)) {
    std::fprintf(stderr,
                 "/dev/shm has less than 2 GiB free: big tensors of 8 MiB "
                 "instead of 100 MiB\n");
    return "--big=8";
  }
  return "--big=100";
#endif
}

void ExpectAllPass(LocalCluster& cluster,
                   const std::vector<ProcessExit>& exits) {
  for (size_t i = 0; i < exits.size(); ++i) {
    EXPECT_TRUE(exits[i].ok()) << Describe(cluster.trainer(i), exits[i]);
    EXPECT_THAT(cluster.trainer(i).stdout_text(), HasSubstr("PASS"));
  }
}

// Waits until `trainer` printed `text` (or ended, or 60 s passed).
bool WaitForOutput(ChildProcess& trainer, const std::string& text) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    if (absl::StrContains(trainer.stdout_text(), text)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Every agent must have launched the same partitions in the same order.
void ExpectSameLaunches(LocalCluster& cluster, const std::string& job,
                        int nodes) {
  const std::vector<std::string> first = cluster.Launches(job, 1);
  EXPECT_FALSE(first.empty());
  for (int node = 2; node <= nodes; ++node) {
    EXPECT_EQ(cluster.Launches(job, node), first)
        << "launch order of node " << node << " differs from node 1";
  }
}

TEST(AgentIntegrationTest, SumAverageBroadcastEveryDtypeOnUnevenNodes) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  // 1 + 2 + 3 trainers: world size 6; steps 0 (sum, root 0) and 1 (average,
  // root 1); a 100 MiB float32 tensor besides.
  ASSERT_TRUE(cluster
                  .StartTrainers("every-dtype", {1, 2, 3},
                                 {"--counts=1,p-1,p+1", BigFlag(), "--steps=2"},
                                 {kPartition})
                  .ok());
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(3)));
  ExpectSameLaunches(cluster, "every-dtype", 3);
}

TEST(AgentIntegrationTest, RandomDelaysKeepOneLaunchOrderAndRightResults) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  ASSERT_TRUE(cluster
                  .StartTrainers("delays", {1, 1, 2},
                                 {"--dtypes=float32,int64,bfloat16",
                                  "--counts=1,p-1,p+1,40000", "--steps=4",
                                  "--max_delay_ms=3"},
                                 {kPartition})
                  .ok());
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(2)));
  ExpectSameLaunches(cluster, "delays", 3);
}

// The negotiation along a tree (--negotiation=tree): five agents, a binary
// tree of depth 2 (node rank 1 an inner node, 3 and 4 its leaves): the
// results and the launch order are the same as on the all-to-all.
TEST(AgentIntegrationTest, NegotiationAlongATreeGivesTheSameResults) {
  LocalCluster cluster;
  ASSERT_TRUE(
      cluster.Start(5, {}, {"--negotiation=tree", "--negotiation_fanout=2"})
          .ok());
  ASSERT_TRUE(
      cluster
          .StartTrainers("tree", {1, 1, 2, 1, 1},
                         {"--dtypes=float32,int64", "--counts=1,p-1,p+1,40000",
                          "--steps=3", "--max_delay_ms=3"},
                         {kPartition})
          .ok());
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(3)));
  ExpectSameLaunches(cluster, "tree", 5);
}

// Also the trainers' gRPC path: no shared-memory channel.
TEST(AgentIntegrationTest, FifoModeGivesTheSameResults) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(2, {}, {"--scheduling=fifo"}).ok());
  ASSERT_TRUE(cluster
                  .StartTrainers("fifo", {1, 2},
                                 {"--dtypes=float32,int8", "--steps=2",
                                  "--max_delay_ms=2"},
                                 {kPartition, "BATON_SHM_CHANNEL=0"})
                  .ok());
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(2)));
  ExpectSameLaunches(cluster, "fifo", 2);
  // No partitioning: one launch per tensor per step.
  for (const std::string& line : cluster.Launches("fifo", 1)) {
    EXPECT_THAT(line, HasSubstr("partition=0 ")) << line;
  }
}

// Regression: a node whose trainers finished first used to fail its peers'
// last operations, still completing on their side, when it left.
TEST(AgentIntegrationTest, NodesFinishingFirstLetThePeersCompleteTheLastStep) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(2).ok());
  ASSERT_TRUE(
      cluster
          .StartTrainers("finish", {2, 2},
                         {"--scenario=loop", "--count=16", "--steps=60"})
          .ok());
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(1)));
}

// Completions reach the trainers from the data plane's thread, before the
// agent's job thread retired the operation: a local rank that enqueues the
// next step at once must wait for that, not count as a second enqueue of
// the previous step. One node with three trainers (small operations run
// inline) and two nodes, many short steps each.
TEST(AgentIntegrationTest, LocalRanksThatEnqueueTheNextStepAtOnceGetItsResult) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(2).ok());
  ASSERT_TRUE(
      cluster
          .StartTrainers("eager1", {3},
                         {"--scenario=loop", "--count=16", "--steps=300"})
          .ok());
  ASSERT_TRUE(
      cluster
          .StartTrainers("eager2", {2, 3},
                         {"--scenario=loop", "--count=1024", "--steps=200"})
          .ok());
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(2)));
}

// Fields of one launch trace line ("generation=1 seq=0 tensor=3 ...").
int64_t Field(const std::string& line, const std::string& name) {
  for (absl::string_view part : absl::StrSplit(line, ' ')) {
    if (absl::StartsWith(part, name + "=")) {
      int64_t value = 0;
      if (absl::SimpleAtoi(part.substr(name.size() + 1), &value)) return value;
    }
  }
  return -1;
}

TEST(AgentIntegrationTest, UrgentTensorOvertakesTheRestOfALargeOne) {
  LocalCluster cluster;
  // 1 MiB partitions, 2 MiB of credit: the 32 MiB tensor goes out two
  // partitions at a time.
  ASSERT_TRUE(cluster.Start(2, {}, {"--credit_bytes=2097152"}).ok());
  ASSERT_TRUE(cluster
                  .StartTrainers(
                      "priority", {1, 1},
                      {"--scenario=priority", "--count=8388608", "--steps=3"},
                      {"BATON_PARTITION_BYTES=1048576"})
                  .ok());
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(2)));
  ExpectSameLaunches(cluster, "priority", 2);
  // Per step: the urgent tensor (declared first: id 0) launches before the
  // large one's (id 1) last partition, although it was enqueued after it.
  const std::vector<std::string> launches = cluster.Launches("priority", 1);
  for (int64_t step = 0; step < 3; ++step) {
    int64_t urgent = -1;
    int64_t last_large = -1;
    int large_before_urgent = 0;
    for (const std::string& line : launches) {
      if (Field(line, "step") != step) continue;
      if (Field(line, "tensor") == 0) urgent = Field(line, "seq");
      if (Field(line, "tensor") == 1) {
        last_large = Field(line, "seq");
        if (urgent < 0) ++large_before_urgent;
      }
    }
    ASSERT_GE(urgent, 0) << "step " << step;
    EXPECT_LT(urgent, last_large)
        << "step " << step << ": the urgent tensor waited for all of the "
        << "large one";
    EXPECT_LT(large_before_urgent, 32)
        << "step " << step << ": the urgent tensor waited for all 32 "
        << "partitions of the large one";
  }
}

TEST(AgentIntegrationTest, KilledAgentFailsSurvivorsNamingTheLostNode) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  // 16 MiB allreduces back to back: the kill lands mid-collective.
  ASSERT_TRUE(cluster
                  .StartTrainers(
                      "kill", {1, 1, 1},
                      {"--scenario=loop", "--count=4194304", "--steps=100000"})
                  .ok());
  ASSERT_TRUE(WaitForOutput(cluster.trainer(0), "step 2 ok"));
  const absl::Time killed = absl::Now();
  cluster.agent(3).Kill();
  // Liveness bound: 6 s by default, plus the coordinator's tick.
  const absl::Duration bound = absl::Seconds(6) + absl::Milliseconds(500);
  for (size_t i = 0; i < 2; ++i) {
    const ProcessExit exit = cluster.trainer(i).Wait(absl::Seconds(30));
    const absl::Duration took = absl::Now() - killed;
    const std::string out = cluster.trainer(i).stdout_text();
    EXPECT_TRUE(exit.exited && exit.exit_code == 3)
        << Describe(cluster.trainer(i), exit);
    EXPECT_LT(took, bound) << Describe(cluster.trainer(i), exit);
    EXPECT_THAT(out, HasSubstr("FAILED")) << out;
    EXPECT_THAT(out, HasSubstr("node n3")) << out;
  }
}

// Three nodes: node rank 2 holds only its own view of the membership, so
// its re-report waits until node rank 0 or 1 rebuilt the job.
TEST(AgentIntegrationTest, TrainingContinuesAcrossACoordinatorRestart) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(3).ok());
  // About 6 s of training, 60 ms per step.
  ASSERT_TRUE(cluster
                  .StartTrainers("restart", {1, 2, 1},
                                 {"--scenario=loop", "--count=4096",
                                  "--steps=100", "--step_sleep_ms=50"})
                  .ok());
  ASSERT_TRUE(WaitForOutput(cluster.trainer(0), "step 5 ok"));
  cluster.coordinator().Kill();
  // Steps go on while the coordinator is away.
  const std::string before = cluster.trainer(0).stdout_text();
  absl::SleepFor(absl::Seconds(1));
  EXPECT_GT(cluster.trainer(0).stdout_text().size(), before.size())
      << "training stopped while the coordinator was down";
  ASSERT_TRUE(cluster.RestartCoordinator().ok());

  // The agents reconnect and re-report: the job is rebuilt, same generation.
  auto stub = v1::Status::NewStub(grpc::CreateChannel(
      cluster.coordinator().address(), grpc::InsecureChannelCredentials()));
  // The reports carry the data plane's stats, per-tensor latency included.
  const auto has_stats = [](const v1::JobStatus& job) {
    for (const v1::MemberStatus& member : job.members()) {
      for (const v1::TensorLatency& latency : member.tensor_latencies()) {
        if (latency.count() > 0 && latency.mean_us() > 0 &&
            member.throughput_bytes_per_second() > 0) {
          return true;
        }
      }
    }
    return false;
  };
  v1::JobStatus job;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool rebuilt = false;
  while (!rebuilt && absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(2));
    v1::GetJobRequest request;
    request.set_job("restart");
    if (stub->GetJob(&context, request, &job).ok()) {
      rebuilt = job.state() == v1::JOB_STATE_RUNNING &&
                job.members_size() == 3 && job.global_step() > 5 &&
                has_stats(job);
      for (const v1::MemberStatus& member : job.members()) {
        rebuilt = rebuilt && member.connected();
      }
    }
    if (!rebuilt) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(rebuilt) << job.DebugString();
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.world_size(), 4);
  ExpectAllPass(cluster, cluster.WaitTrainers(absl::Minutes(1)));
}

// A hung (stopped) agent: the collectives time out, the failure is reported
// naming the operation, the communicators are rebuilt in a new generation,
// and trainers that retry go on from the step rank 0 failed at (a ring
// collective may complete on one node and time out on the other: they would
// otherwise retry different steps).
TEST(AgentIntegrationTest, TimedOutCollectiveFailsThenTheDataPlaneIsRebuilt) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(2, {}, {"--op_timeout_ms=1000"}).ok());
  ASSERT_TRUE(
      cluster
          .StartTrainers("hang", {1, 1},
                         {"--scenario=loop", "--count=1024", "--steps=40",
                          "--step_sleep_ms=20", "--retry"})
          .ok());
  ASSERT_TRUE(WaitForOutput(cluster.trainer(0), "step 5 ok"));
  // Shorter than the coordinator's liveness timeout (6 s): the agent is
  // hung, not lost.
  kill(cluster.agent(2).pid(), SIGSTOP);
  absl::SleepFor(absl::Seconds(3));
  kill(cluster.agent(2).pid(), SIGCONT);
  const std::vector<ProcessExit> exits = cluster.WaitTrainers(absl::Minutes(1));
  ExpectAllPass(cluster, exits);
  std::string both;
  for (int i = 0; i < 2; ++i) {
    const std::string out = cluster.trainer(i).stdout_text();
    EXPECT_THAT(out, HasSubstr("RETRY")) << out;
    EXPECT_THAT(out, HasSubstr("step 39 ok generation=2")) << out;
    both += out;
  }
  // A node whose collective completed before the other one's timed out
  // hears of the new generation (ABORTED) instead; at least one timed out
  // (DEADLINE_EXCEEDED), naming the operation and the peer it waited for.
  EXPECT_THAT(both, HasSubstr("code=4: push_pull of tensor \"loop\" step"))
      << both;
  EXPECT_THAT(both, HasSubstr("timed out")) << both;
  EXPECT_THAT(both, HasSubstr("(peers: n")) << both;
}

TEST(AgentIntegrationTest, DisconnectedTrainerIsALostMember) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(2).ok());
  ASSERT_TRUE(
      cluster
          .StartTrainers("gone", {1, 1},
                         {"--scenario=loop", "--count=1024", "--steps=100000"})
          .ok());
  ASSERT_TRUE(WaitForOutput(cluster.trainer(1), "step 2 ok"));
  cluster.trainer(1).Kill();
  const ProcessExit exit = cluster.trainer(0).Wait(absl::Seconds(10));
  const std::string out = cluster.trainer(0).stdout_text();
  EXPECT_TRUE(exit.exited && exit.exit_code == 3)
      << Describe(cluster.trainer(0), exit);
  EXPECT_THAT(out, HasSubstr("code=10"));  // ABORTED
  EXPECT_THAT(out, HasSubstr("node n2"));
  EXPECT_THAT(out, HasSubstr("disconnected"));
}

}  // namespace
}  // namespace baton
