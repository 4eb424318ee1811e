// The agent's per-job series: what an operation's outcome adds, and how long
// the series of an ended job stay on the endpoint.
#include "agent/agent_metrics.h"

#include <chrono>
#include <memory>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/integration/metrics_scrape.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

std::string Scrape(const AgentMetrics& metrics) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, metrics.registry()->Collect());
  return out.str();
}

TEST(AgentMetricsTest, CompletedOperationsFillTheTensorsLatencyHistogram) {
  AgentMetrics metrics(absl::Seconds(300));
  std::shared_ptr<JobMetrics> job = metrics.ForJob("j1");
  job->OperationCompleted("layer1.weight", milliseconds(2), 4096);
  job->OperationCompleted("layer1.weight", milliseconds(40), 4096);
  job->OperationCompleted("layer2.bias", milliseconds(1), 64);
  job->OperationFailed();
  job->EnqueueRefused();
  job->EnqueueRefused();
  job->SetDataPlane(3, 1 << 20);
  job->SetTrainersAttached(2);
  job->BytesSkipped(1000);
  job->BytesSkipped(24);

  const std::string text = Scrape(metrics);
  const std::string w = "{job_name=\"j1\",tensor=\"layer1.weight\"";
  const std::optional<double> sum =
      SampleValue(text, "baton_tensor_latency_seconds_sum" + w + "}");
  ASSERT_TRUE(sum.has_value()) << text;
  EXPECT_NEAR(*sum, 0.042, 1e-9);
  EXPECT_EQ(
      SampleMismatches(
          text,
          {
              {"baton_tensor_latency_seconds_count" + w + "}", 2},
              // 2 ms is in the 2.5 ms bucket, 40 ms only from 50 ms on.
              {"baton_tensor_latency_seconds_bucket" + w + ",le=\"0.0025\"}",
               1},
              {"baton_tensor_latency_seconds_bucket" + w + ",le=\"0.025\"}", 1},
              {"baton_tensor_latency_seconds_bucket" + w + ",le=\"0.05\"}", 2},
              {"baton_data_bytes_total{job_name=\"j1\"}", 4096 * 2 + 64},
              {"baton_data_skipped_bytes_total{job_name=\"j1\"}", 1024},
              {"baton_operations_total{job_name=\"j1\",result=\"ok\"}", 3},
              {"baton_operations_total{job_name=\"j1\",result=\"failed\"}", 1},
              {"baton_operations_total{job_name=\"j1\",result=\"refused\"}", 2},
              {"baton_queue_depth{job_name=\"j1\"}", 3},
              {"baton_credit_in_use_bytes{job_name=\"j1\"}", 1 << 20},
              {"baton_trainers_attached{job_name=\"j1\"}", 2},
          }),
      "")
      << text;
}

TEST(AgentMetricsTest, NegotiationRoundsAreCountedByWhoStartedThem) {
  AgentMetrics metrics(absl::Seconds(300));
  std::shared_ptr<JobMetrics> job = metrics.ForJob("j1");
  job->NegotiationRound(std::chrono::microseconds(180), /*started=*/true);
  job->NegotiationRound(std::chrono::microseconds(900), /*started=*/true);
  job->NegotiationRound(std::chrono::microseconds(40), /*started=*/false);
  const std::string text = Scrape(metrics);
  const std::string started = "{job_name=\"j1\",started_by=\"this_node\"";
  const std::string joined = "{job_name=\"j1\",started_by=\"peer\"";
  EXPECT_EQ(
      SampleMismatches(
          text,
          {
              {"baton_negotiation_round_seconds_count" + started + "}", 2},
              {"baton_negotiation_round_seconds_count" + joined + "}", 1},
              // 180 us is in the 200 us bucket, 900 us only from 1 ms on.
              {"baton_negotiation_round_seconds_bucket" + started +
                   ",le=\"0.0002\"}",
               1},
              {"baton_negotiation_round_seconds_bucket" + started +
                   ",le=\"0.00075\"}",
               1},
              {"baton_negotiation_round_seconds_bucket" + started +
                   ",le=\"0.001\"}",
               2},
              {"baton_negotiation_round_seconds_bucket" + joined +
                   ",le=\"5e-05\"}",
               1},
          }),
      "")
      << text;
}

TEST(AgentMetricsTest, AJobAttachedAgainKeepsCounting) {
  AgentMetrics metrics(absl::Seconds(300));
  metrics.ForJob("j1")->OperationCompleted("w", milliseconds(1), 8);
  metrics.ForJob("j1")->OperationCompleted("w", milliseconds(1), 8);
  EXPECT_THAT(
      SampleValue(Scrape(metrics), "baton_data_bytes_total{job_name=\"j1\"}"),
      Optional(16.0));
}

TEST(AgentMetricsTest, EndedJobsSeriesStayForTheRetentionThenGo) {
  AgentMetrics metrics(absl::Seconds(300));
  std::shared_ptr<JobMetrics> running = metrics.ForJob("running");
  std::shared_ptr<JobMetrics> ended = metrics.ForJob("ended");
  running->OperationCompleted("w", milliseconds(1), 8);
  ended->OperationCompleted("w", milliseconds(1), 8);
  ended.reset();

  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  metrics.RemoveIdle(t0);
  metrics.RemoveIdle(t0 + absl::Seconds(299));
  EXPECT_THAT(Scrape(metrics), HasSubstr("job_name=\"ended\""));

  metrics.RemoveIdle(t0 + absl::Seconds(300));
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, Not(HasSubstr("job_name=\"ended\"")));
  // A job still held is never removed, however long it runs.
  metrics.RemoveIdle(t0 + absl::Seconds(3600));
  EXPECT_THAT(SampleValue(Scrape(metrics),
                          "baton_data_bytes_total{job_name=\"running\"}"),
              Optional(8.0));
}

TEST(AgentMetricsTest, AJobAttachedAgainWithinTheRetentionIsKept) {
  AgentMetrics metrics(absl::Seconds(300));
  metrics.ForJob("j1")->OperationCompleted("w", milliseconds(1), 8);
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  metrics.RemoveIdle(t0);
  std::shared_ptr<JobMetrics> again = metrics.ForJob("j1");
  metrics.RemoveIdle(t0 + absl::Seconds(301));
  again->OperationCompleted("w", milliseconds(1), 8);
  EXPECT_THAT(
      SampleValue(Scrape(metrics), "baton_data_bytes_total{job_name=\"j1\"}"),
      Optional(16.0));
}

}  // namespace
}  // namespace baton::agent
