// The /metrics endpoints of the real coordinator and agents during and after
// a small job, checked by value and by promtool; the agents' log lines
// tagged with the job; a bad --metrics_listen refused at start.
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"
#include "tests/integration/coordinator_process.h"
#include "tests/integration/metrics_scrape.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

constexpr char kMetricsFlag[] = "--metrics_listen=127.0.0.1:0";
constexpr int kSteps = 30;
// Elements of the loop scenario's float32 tensor.
constexpr int kCount = 1024;

// The URL a process printed as "metrics on URL" on its stdout (after its
// ready line), waiting up to 10 s for it; empty if it never came.
template <typename StdoutText>
std::string MetricsUrl(const StdoutText& stdout_text) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    for (absl::string_view line : absl::StrSplit(stdout_text(), '\n')) {
      if (absl::ConsumePrefix(&line, "metrics on ")) return std::string(line);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return "";
}

// Scrapes `url` until `ready` holds for the text (or 60 s pass); returns the
// last text.
std::string ScrapeUntil(const std::string& url,
                        const std::function<bool(const std::string&)>& ready) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string text;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> scraped = HttpGet(url);
    EXPECT_TRUE(scraped.ok()) << scraped.status();
    if (!scraped.ok()) return "";
    text = *std::move(scraped);
    if (ready(text)) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return text;
}

void ExpectPromtoolAccepts(const std::string& text, const std::string& what) {
  absl::Status status = CheckWithPromtool(text);
  if (absl::IsNotFound(status)) {
    GTEST_SKIP() << "promtool is absent, so the exposition format is not "
                    "checked: "
                 << status.message();
  }
  EXPECT_TRUE(status.ok()) << what << ": " << status.message() << "\n" << text;
}

TEST(MetricsIntegrationTest, CoordinatorAndAgentsExposeAJobsProgress) {
  LocalCluster cluster;
  ASSERT_TRUE(
      cluster
          .Start(2, {kMetricsFlag, "--report_interval_ms=100"}, {kMetricsFlag})
          .ok());
  const std::string coordinator_url =
      MetricsUrl([&] { return cluster.coordinator().stdout_text(); });
  ASSERT_THAT(coordinator_url, ::testing::StartsWith("http://127.0.0.1:"));
  std::vector<std::string> agent_urls;
  for (int node = 1; node <= 2; ++node) {
    agent_urls.push_back(
        MetricsUrl([&] { return cluster.agent(node).stdout_text(); }));
    ASSERT_FALSE(agent_urls.back().empty()) << "node " << node;
  }

  ASSERT_TRUE(cluster
                  .StartTrainers(
                      "metrics", {1, 1},
                      {"--scenario=loop", absl::StrCat("--steps=", kSteps),
                       absl::StrCat("--count=", kCount), "--step_sleep_ms=50"})
                  .ok());

  // While the job runs: its step and every rank's lag.
  const std::string running = ScrapeUntil(coordinator_url, [](auto& text) {
    const std::optional<double> step =
        SampleValue(text, "baton_job_global_step{job_name=\"metrics\"}");
    return step.has_value() && *step >= 1 &&
           SampleValue(text,
                       "baton_rank_lag_steps{job_name=\"metrics\",rank=\"1\"}")
               .has_value();
  });
  EXPECT_EQ(SampleMismatches(
                running,
                {
                    {"baton_connected_agents", 2},
                    {"baton_jobs{state=\"running\"}", 1},
                    {"baton_job_generation{job_name=\"metrics\"}", 1},
                    {"baton_job_world_size{job_name=\"metrics\"}", 2},
                    {"baton_job_nodes{job_name=\"metrics\"}", 2},
                    {"baton_job_stalled_tensors{job_name=\"metrics\"}", 0},
                }),
            "")
      << running;
  EXPECT_TRUE(
      SampleValue(running,
                  "baton_rank_lag_steps{job_name=\"metrics\",rank=\"0\"}")
          .has_value())
      << running;
  ExpectPromtoolAccepts(running, "coordinator, job running");

  for (const ProcessExit& exit : cluster.WaitTrainers(absl::Minutes(2))) {
    ASSERT_TRUE(exit.ok()) << exit.ToString();
  }

  // After the job: every step's operation on each node, counted.
  for (int node = 1; node <= 2; ++node) {
    const std::string text =
        ScrapeUntil(agent_urls[node - 1], [](auto& scraped) {
          return SampleValue(scraped,
                             "baton_trainers_attached{job_name=\"metrics\"}") ==
                 0.0;
        });
    const std::string loop = "{job_name=\"metrics\",tensor=\"loop\"}";
    EXPECT_GT(SampleValue(text, "baton_tensor_latency_seconds_sum" + loop)
                  .value_or(0),
              0)
        << "node " << node << ":\n"
        << text;
    EXPECT_EQ(
        SampleMismatches(
            text,
            {
                {"baton_tensor_latency_seconds_count" + loop, kSteps},
                {"baton_data_bytes_total{job_name=\"metrics\"}",
                 kSteps * kCount * 4},
                {"baton_operations_total{job_name=\"metrics\",result=\"ok\"}",
                 kSteps},
                {"baton_operations_total{job_name=\"metrics\",result="
                 "\"failed\"}",
                 0},
                {"baton_queue_depth{job_name=\"metrics\"}", 0},
                {"baton_credit_in_use_bytes{job_name=\"metrics\"}", 0},
            }),
        "")
        << "node " << node << ":\n"
        << text;
    // The job's negotiation rounds: each node counts every round, as one
    // it started or one a peer's round woke it for.
    const double rounds =
        SampleValue(text,
                    "baton_negotiation_round_seconds_count{job_name="
                    "\"metrics\",started_by=\"this_node\"}")
            .value_or(0) +
        SampleValue(text,
                    "baton_negotiation_round_seconds_count{job_name="
                    "\"metrics\",started_by=\"peer\"}")
            .value_or(0);
    EXPECT_GE(rounds, 1) << "node " << node << ":\n" << text;
    ExpectPromtoolAccepts(text, absl::StrCat("agent of node ", node));
  }

  const std::string finished = ScrapeUntil(coordinator_url, [](auto& text) {
    return SampleValue(text, "baton_jobs{state=\"finished\"}") == 1.0;
  });
  EXPECT_EQ(SampleMismatches(
                finished,
                {
                    {"baton_jobs{state=\"finished\"}", 1},
                    {"baton_job_global_step{job_name=\"metrics\"}", kSteps - 1},
                    {"baton_members_lost_total{job_name=\"metrics\"}", 0},
                }),
            "")
      << finished;
  ExpectPromtoolAccepts(finished, "coordinator, job finished");

  // One grep follows the job in each agent's log.
  for (int node = 1; node <= 2; ++node) {
    EXPECT_THAT(ReadFile(absl::StrCat(cluster.dir(), "/agent", node, ".log")),
                HasSubstr(absl::StrCat("job=metrics gen=1 node=n", node,
                                       " generation 1 sealed")));
  }
}

TEST(MetricsIntegrationTest, BadMetricsListenIsAUsageError) {
  const std::string dir = ::testing::TempDir();
  const std::vector<std::string> binaries = {CoordinatorProcess::BinaryPath(),
                                             LocalCluster::AgentBinary()};
  for (const std::string& binary : binaries) {
    ChildProcess process;
    ChildProcess::Options options;
    options.argv = {binary, "--metrics_listen=no-port"};
    options.stderr_path = dir + "/bad_metrics_listen.log";
    std::remove(options.stderr_path.c_str());
    ASSERT_TRUE(process.Start(options).ok()) << binary;
    const ProcessExit exit = process.Wait(absl::Seconds(10));
    EXPECT_TRUE(exit.exited && exit.exit_code == 2)
        << binary << ": " << exit.ToString();
    EXPECT_THAT(ReadFile(options.stderr_path),
                HasSubstr("--metrics_listen \"no-port\" has no host or no "
                          "port; expected host:port"))
        << binary;
  }
}

}  // namespace
}  // namespace baton
