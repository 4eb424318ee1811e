// batonctl end to end: the real binary against a real coordinator, agents
// and trainer processes on loopback, as an operator runs it.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "baton/job_status.h"
#include "baton/v1/status.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"
#include "tests/integration/child_process.h"
#include "tests/unit/tools/trace_events.h"

#ifndef BATONCTL_BIN
#error "BATONCTL_BIN must name the batonctl binary"
#endif

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

struct Outcome {
  ProcessExit exit;
  std::string out;
  std::string err;
  // From start to end, the process start included.
  absl::Duration took;
};

// batonctl with `args`, its stderr in a file; a helper to run it to its end
// or to signal it.
class Batonctl {
 public:
  explicit Batonctl(const std::vector<std::string>& args,
                    const std::vector<std::string>& env = {}) {
    char path[] = "/tmp/batonctl-test.XXXXXX";
    close(mkstemp(path));
    err_path_ = path;
    ChildProcess::Options options;
    options.argv = {BATONCTL_BIN};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.env = env;
    options.stderr_path = err_path_;
    start_ = absl::Now();
    started_ = process_.Start(options);
  }
  ~Batonctl() { unlink(err_path_.c_str()); }

  const absl::Status& started() const { return started_; }
  ChildProcess& process() { return process_; }

  Outcome Wait(absl::Duration timeout = absl::Seconds(20)) {
    const ProcessExit exit = process_.Wait(timeout);
    return {exit, process_.stdout_text(), ReadFile(err_path_),
            absl::Now() - start_};
  }

 private:
  std::string err_path_;
  absl::Time start_;
  ChildProcess process_;
  absl::Status started_;
};

Outcome RunBatonctl(const std::vector<std::string>& args,
                    const std::vector<std::string>& env = {}) {
  Batonctl batonctl(args, env);
  EXPECT_TRUE(batonctl.started().ok()) << batonctl.started();
  return batonctl.Wait();
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// A loopback port nothing listens on.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

TEST(BatonctlTest, UnreachableCoordinatorIsOneLineAndExit1WithinTheDeadline) {
  const std::string address = absl::StrCat("127.0.0.1:", ClosedPort());
  for (const char* command : {"status", "jobs", "tensors"}) {
    std::vector<std::string> args = {"--coordinator", address,
                                     "--timeout_ms=1000", command};
    if (std::string(command) == "tensors") args.push_back("some-job");
    const Outcome result = RunBatonctl(args);
    EXPECT_TRUE(result.exit.exited) << result.exit.ToString();
    EXPECT_EQ(result.exit.exit_code, 1) << result.err;
    EXPECT_LT(result.took, absl::Seconds(2));
    EXPECT_EQ(result.out, "");
    ASSERT_EQ(Lines(result.err).size(), 1u) << result.err;
    EXPECT_THAT(result.err,
                StartsWith(absl::StrCat("batonctl: cannot reach the "
                                        "coordinator at ",
                                        address)));
    EXPECT_THAT(result.err,
                HasSubstr("check that baton-coordinator runs there and that "
                          "--coordinator or BATON_COORDINATOR names its "
                          "address\n"));
  }
}

TEST(BatonctlTest, UsageErrorsExit2WithAUsageLine) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--coordinator=h:1", "frobnicate"}, "unknown command \"frobnicate\""},
      {{"--coordinator=h:1", "members"}, "members needs a job"},
      {{"--coordinator=h:1", "timeline", "j", "--steps", "9:3", "-o", "t.json"},
       "--steps=9:3 is not a step range"},
      {{"--coordinator=h:1", "timeline", "j", "-o", "t.json"},
       "timeline needs --steps FIRST:LAST"},
      {{"jobs"},
       "no coordinator: pass --coordinator HOST:PORT or set "
       "BATON_COORDINATOR"},
      {{"--coordinator=h:1", "--page_size=-1", "status", "j"},
       "--page_size=-1 is negative"},
  };
  for (const auto& [args, error] : cases) {
    const Outcome result = RunBatonctl(args);
    EXPECT_EQ(result.exit.exit_code, 2) << result.err;
    const std::vector<std::string> lines = Lines(result.err);
    ASSERT_EQ(lines.size(), 2u) << result.err;
    EXPECT_THAT(lines[0], HasSubstr(error));
    EXPECT_THAT(lines[1], StartsWith("usage: batonctl [--coordinator "
                                     "HOST:PORT] [--json]"));
  }
}

// One running 2-node job for every test below: trainers of the priority
// scenario (an urgent tensor of 1 KiB, a large one of 1 MiB in 16
// partitions of 64 KiB) running steps until the suite ends.
class BatonctlJobTest : public ::testing::Test {
 protected:
  static constexpr char kJob[] = "ctl";

  static void SetUpTestSuite() {
    cluster_ = new LocalCluster();
    ASSERT_TRUE(cluster_->Start(2, {}, {"--credit_bytes=131072"}).ok());
    ASSERT_TRUE(cluster_
                    ->StartTrainers(kJob, {1, 1},
                                    {"--scenario=priority", "--count=262144",
                                     "--steps=1000000"},
                                    {"BATON_PARTITION_BYTES=65536"})
                    .ok());
    // The job is unknown until the agents join; agents report steps every
    // second: wait for a few.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    absl::StatusOr<v1::JobStatus> job;
    do {
      absl::SleepFor(absl::Milliseconds(100));
      job = FetchJobStatus(cluster_->coordinator().address(), kJob, 3,
                           std::chrono::seconds(1));
    } while ((!job.ok() || job->global_step() < 3) && absl::Now() < deadline);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_GE(job->global_step(), 3) << "the job does not progress";
  }

  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    address_ = cluster_->coordinator().address();
  }

  std::string address_;
  static LocalCluster* cluster_;
};

LocalCluster* BatonctlJobTest::cluster_ = nullptr;

TEST_F(BatonctlJobTest, StatusShowsTheRunningJobFromBatonCoordinator) {
  // The address from the environment, as batonrun sets it for trainers.
  const Outcome result =
      RunBatonctl({"status", kJob}, {"BATON_COORDINATOR=" + address_});
  ASSERT_EQ(result.exit.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, StartsWith("======== job ctl ========\nState\n"
                                     "  state: running"));
  EXPECT_THAT(result.out, HasSubstr("\nMembership\n  NODE  DATA ADDRESS"));
  EXPECT_THAT(result.out, HasSubstr("\n  n1  "));
  EXPECT_THAT(result.out, HasSubstr("\n  n2  "));
  EXPECT_THAT(result.out, HasSubstr("\nStalls\n  (none)\nMismatches\n  "
                                    "(none)\nRecent events\n"));
  EXPECT_THAT(result.out, HasSubstr("plan: version 1 from step 0, 2 tensors"));
  EXPECT_EQ(result.err, "");
}

TEST_F(BatonctlJobTest, JobsIsOneLinePerJob) {
  const Outcome result = RunBatonctl({"--coordinator", address_, "jobs"});
  ASSERT_EQ(result.exit.exit_code, 0) << result.err;
  const std::vector<std::string> lines = Lines(result.out);
  ASSERT_EQ(lines.size(), 2u) << result.out;
  EXPECT_THAT(lines[0], StartsWith("JOB  STATE    GENERATION  WORLD SIZE"));
  EXPECT_THAT(lines[1], StartsWith("ctl  running  1           2           "));
}

// batonctl `args` (with --json), its output parsed back into a `Message`.
template <typename Message>
Message RunJson(std::vector<std::string> args) {
  args.insert(args.begin(), "--json");
  const Outcome result = RunBatonctl(args);
  EXPECT_EQ(result.exit.exit_code, 0) << result.err;
  Message message;
  EXPECT_TRUE(
      google::protobuf::util::JsonStringToMessage(result.out, &message).ok())
      << result.out;
  return message;
}

TEST_F(BatonctlJobTest, JsonIsTheProtoMessage) {
  const auto job =
      RunJson<v1::JobStatus>({"--coordinator", address_, "status", kJob});
  EXPECT_EQ(job.job(), kJob);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.world_size(), 2);
  // Ordered by node rank, which follows the order the nodes joined in.
  ASSERT_EQ(job.members_size(), 2);
  EXPECT_EQ(job.members(0).node_rank(), 0);
  EXPECT_EQ(job.members(1).node_rank(), 1);
  EXPECT_THAT((std::vector<std::string>{job.members(0).node_name(),
                                        job.members(1).node_name()}),
              UnorderedElementsAre("n1", "n2"));
  EXPECT_GE(job.global_step(), 3);

  const auto jobs =
      RunJson<v1::ListJobsResponse>({"--coordinator", address_, "jobs"});
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).job(), kJob);

  const auto tensors =
      RunJson<v1::TensorsStatus>({"--coordinator", address_, "tensors", kJob});
  EXPECT_EQ(tensors.job(), kJob);
  EXPECT_EQ(tensors.plan_version(), 1);
  EXPECT_EQ(tensors.partition_bytes(), 65536);
  ASSERT_EQ(tensors.tensors_size(), 2);
  EXPECT_EQ(tensors.tensors(0).spec().name(), "urgent");
  EXPECT_EQ(tensors.tensors(0).priority(), 0);
  EXPECT_EQ(tensors.tensors(0).num_partitions(), 1);
  EXPECT_EQ(tensors.tensors(1).spec().name(), "large");
  EXPECT_EQ(tensors.tensors(1).size_bytes(), 1 << 20);
  EXPECT_EQ(tensors.tensors(1).num_partitions(), 16);
}

TEST_F(BatonctlJobTest, StatusFetchesEveryPageOfTheMembers) {
  const auto job = RunJson<v1::JobStatus>(
      {"--coordinator", address_, "--page_size=1", "status", kJob});
  EXPECT_EQ(job.total_members(), 2);
  ASSERT_EQ(job.members_size(), 2);
  EXPECT_EQ(job.members(0).node_rank(), 0);
  EXPECT_EQ(job.members(1).node_rank(), 1);
  EXPECT_EQ(job.next_page_token(), "");

  const Outcome members = RunBatonctl(
      {"--coordinator", address_, "--page_size=1", "members", kJob});
  ASSERT_EQ(members.exit.exit_code, 0) << members.err;
  EXPECT_THAT(members.out, HasSubstr("\n  n1  "));
  EXPECT_THAT(members.out, HasSubstr("\n  n2  "));
}

TEST_F(BatonctlJobTest, TensorsListsThePlan) {
  const Outcome result =
      RunBatonctl({"--coordinator", address_, "tensors", kJob});
  ASSERT_EQ(result.exit.exit_code, 0) << result.err;
  const std::vector<std::string> lines = Lines(result.out);
  ASSERT_EQ(lines.size(), 4u) << result.out;
  EXPECT_EQ(lines[0],
            "Tensors of job ctl: plan version 1, partitions of at most 64.0 "
            "KiB");
  EXPECT_THAT(lines[2],
              StartsWith("  0   urgent  float32  [256]     1.0 KiB "));
  EXPECT_THAT(lines[3],
              StartsWith("  1   large   float32  [262144]  1.0 MiB "));
}

TEST_F(BatonctlJobTest, UnknownJobSaysHowToListTheJobs) {
  const Outcome result =
      RunBatonctl({"--coordinator", address_, "members", "nope"});
  EXPECT_EQ(result.exit.exit_code, 1);
  EXPECT_EQ(
      result.err,
      absl::StrCat("batonctl: job \"nope\" is unknown to the coordinator "
                   "(coordinator ",
                   address_, "): batonctl jobs lists the jobs it knows\n"));
}

TEST_F(BatonctlJobTest, TimelineOfARealRunHasEveryPhaseInOrder) {
  absl::StatusOr<v1::JobStatus> job =
      FetchJobStatus(address_, kJob, -1, std::chrono::seconds(0));
  ASSERT_TRUE(job.ok()) << job.status();
  const int64_t last = job->global_step();
  const std::string trace_path = cluster_->dir() + "/trace.json";
  const std::string svg_path = cluster_->dir() + "/trace.svg";
  const Outcome result = RunBatonctl(
      {"--coordinator", address_, "timeline", kJob, "--steps",
       absl::StrCat(last - 1, ":", last), "-o", trace_path, "--svg", svg_path});
  ASSERT_EQ(result.exit.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "") << "no node missing, nothing truncated";
  EXPECT_THAT(result.out, StartsWith(absl::StrCat(
                              "wrote 68 partitions of steps ", last - 1, "..",
                              last, " from 2 nodes to ", trace_path)));

  const batonctl::TraceEvents trace =
      batonctl::ReadTraceEvents(ReadFile(trace_path));
  // One process per node: pid = node rank, named by the node.
  std::map<int, std::string> nodes;
  for (const v1::MemberStatus& m : job->members()) {
    nodes[m.node_rank()] = m.node_name();
  }
  EXPECT_EQ(trace.processes, nodes);
  EXPECT_EQ(nodes.size(), 2u);
  // 2 nodes x 2 steps x (1 urgent + 16 large partitions).
  EXPECT_EQ(trace.partitions.size(), 68u);
  batonctl::ExpectEveryPhaseInOrder(trace);
  EXPECT_EQ(std::system(("xmllint --noout " + svg_path).c_str()), 0)
      << ReadFile(svg_path);
}

TEST_F(BatonctlJobTest, TimelineOfStepsNotRecordedSaysSo) {
  const Outcome result =
      RunBatonctl({"--coordinator", address_, "timeline", kJob, "--steps",
                   "900000:900001", "-o", cluster_->dir() + "/none.json"});
  EXPECT_EQ(result.exit.exit_code, 1);
  EXPECT_THAT(result.err,
              StartsWith("batonctl: no partitions recorded for steps "
                         "900000..900001 of job \"ctl\": the agents keep only "
                         "their most recent records"));
  EXPECT_EQ(Lines(result.err).size(), 1u) << result.err;
}

int Count(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

TEST_F(BatonctlJobTest, WatchRedrawsUntilSigint) {
  Batonctl watch(
      {"--coordinator", address_, "watch", kJob, "--interval_ms", "100"});
  ASSERT_TRUE(watch.started().ok()) << watch.started();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Count(watch.process().stdout_text(), "======== job ctl") < 2 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(watch.process().pid(), SIGINT);
  const Outcome result = watch.Wait(absl::Seconds(5));
  EXPECT_TRUE(result.exit.ok()) << result.exit.ToString() << result.err;
  EXPECT_LT(result.exit.elapsed, absl::Seconds(1));
  EXPECT_THAT(result.out, StartsWith("\033[H\033[2Jbatonctl status ctl every "
                                     "0.1s (coordinator " +
                                     address_ + "), "));
  // Each round clears the screen and draws the whole status again.
  EXPECT_GE(Count(result.out, "\033[H\033[2J"), 2);
  EXPECT_EQ(Count(result.out, "\033[H\033[2J"),
            Count(result.out, "\nRecent events\n"));
}

}  // namespace
}  // namespace baton
