// The coordinator's metrics as a scrape sees them: values from the job
// state (generation, world size, global step, lags, losses) and the scrape's
// trip through the control loop.
#include "coordinator/coordinator_metrics.h"

#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/control_loop.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/unit/coordinator/coordinator_harness.h"

namespace baton::coordinator {
namespace {

using ::testing::IsEmpty;

std::string Text(const std::vector<prometheus::MetricFamily>& families) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

class CoordinatorMetricsTest : public CoordinatorTest {
 protected:
  // Job "job": node n0 with ranks 0 and 1, node n1 with rank 2.
  void SetUp() override {
    nodes_ = JoinNodes("job", {2, 1});
    ASSERT_EQ(Status("job").world_size(), 3);
  }

  // `node` reports its ranks' completed steps: {rank, step}.
  void Report(Agent& node,
              const std::vector<std::pair<int32_t, int64_t>>& steps) {
    v1::AgentMessage message;
    v1::StepReport* report = message.mutable_step_report();
    report->set_job("job");
    report->set_generation(1);
    for (const auto& [rank, step] : steps) {
      v1::RankProgress* progress = report->add_ranks();
      progress->set_rank(rank);
      progress->set_completed_step(step);
    }
    Send(node, message);
  }

  std::string Scrape() {
    return Text(
        CoordinatorMetrics::Families(CoordinatorMetrics::Take(*coordinator_)));
  }

  std::vector<Agent> nodes_;
};

TEST_F(CoordinatorMetricsTest, RunningJobShowsItsGenerationStepAndLags) {
  Report(nodes_[0], {{0, 5}, {1, 4}});
  Report(nodes_[1], {{2, 3}});
  const std::string text = Scrape();
  EXPECT_EQ(SampleMismatches(
                text,
                {
                    {"baton_connected_agents", 2},
                    {"baton_jobs{state=\"running\"}", 1},
                    {"baton_jobs{state=\"forming\"}", 0},
                    {"baton_jobs{state=\"failed\"}", 0},
                    {"baton_job_generation{job_name=\"job\"}", 1},
                    {"baton_job_world_size{job_name=\"job\"}", 3},
                    {"baton_job_nodes{job_name=\"job\"}", 2},
                    {"baton_job_global_step{job_name=\"job\"}", 3},
                    {"baton_rank_lag_steps{job_name=\"job\",rank=\"0\"}", 0},
                    {"baton_rank_lag_steps{job_name=\"job\",rank=\"1\"}", 1},
                    {"baton_rank_lag_steps{job_name=\"job\",rank=\"2\"}", 2},
                    {"baton_job_stalled_tensors{job_name=\"job\"}", 0},
                    {"baton_members_lost_total{job_name=\"job\"}", 0},
                    {"baton_members_joined_total{job_name=\"job\"}", 0},
                    {"baton_reform_seconds_count{job_name=\"job\"}", 0},
                }),
            "")
      << text;
}

TEST_F(CoordinatorMetricsTest, LostMemberIsCountedAndTheJobReforms) {
  coordinator_->OnSessionClosed(nodes_[1].id, "connection reset");
  const std::string lost = Scrape();
  EXPECT_EQ(
      SampleMismatches(lost,
                       {
                           {"baton_connected_agents", 1},
                           {"baton_members_lost_total{job_name=\"job\"}", 1},
                           {"baton_jobs{state=\"reforming\"}", 1},
                           {"baton_job_generation{job_name=\"job\"}", 2},
                           {"baton_job_nodes{job_name=\"job\"}", 1},
                       }),
      "")
      << lost;

  // The node comes back: the loss stays counted, the job runs again.
  Agent back = Connect("n1", "i-n1-restarted");
  Join(back, "job", 1, 2);
  const std::string resealed = Scrape();
  EXPECT_EQ(
      SampleMismatches(resealed,
                       {
                           {"baton_members_lost_total{job_name=\"job\"}", 1},
                           {"baton_jobs{state=\"running\"}", 1},
                           {"baton_jobs{state=\"reforming\"}", 0},
                       }),
      "")
      << resealed;
}

// The node comes back 1.5 s after it was lost: one re-form of 1.5 s in the
// histogram, one join after the first seal.
TEST_F(CoordinatorMetricsTest, ReformDurationAndJoinsAreCounted) {
  coordinator_->OnSessionClosed(nodes_[1].id, "connection reset");
  clock_.Advance(absl::Milliseconds(1500));
  Agent back = Connect("n1", "i-n1-restarted");
  Join(back, "job", 1, 2);
  const std::string text = Scrape();
  EXPECT_EQ(
      SampleMismatches(
          text,
          {
              {"baton_members_lost_total{job_name=\"job\"}", 1},
              {"baton_members_joined_total{job_name=\"job\"}", 1},
              {"baton_reform_seconds_count{job_name=\"job\"}", 1},
              {"baton_reform_seconds_sum{job_name=\"job\"}", 1.5},
              {"baton_reform_seconds_bucket{job_name=\"job\",le=\"0.01\"}", 0},
              {"baton_reform_seconds_bucket{job_name=\"job\",le=\"1\"}", 0},
              {"baton_reform_seconds_bucket{job_name=\"job\",le=\"2.5\"}", 1},
              {"baton_reform_seconds_bucket{job_name=\"job\",le=\"600\"}", 1},
              {"baton_reform_seconds_bucket{job_name=\"job\",le=\"+Inf\"}", 1},
          }),
      "")
      << text;
  const absl::Status promtool = CheckWithPromtool(text);
  if (promtool.code() != absl::StatusCode::kNotFound) {
    EXPECT_TRUE(promtool.ok()) << promtool;
  }
}

// Two messages handled: one as it arrived, one 30 ms after (it waited for
// the loop); each lands in the bucket of its wait.
TEST_F(CoordinatorMetricsTest, MessageHandlingTimesAreCounted) {
  const absl::Time arrived = clock_.Now();
  coordinator_->MessageHandled(arrived);
  clock_.Advance(absl::Milliseconds(30));
  coordinator_->MessageHandled(arrived);
  const std::string text = Scrape();
  EXPECT_EQ(SampleMismatches(
                text,
                {
                    {"baton_agent_message_seconds_count", 2},
                    {"baton_agent_message_seconds_sum", 0.03},
                    {"baton_agent_message_seconds_bucket{le=\"0.0001\"}", 1},
                    {"baton_agent_message_seconds_bucket{le=\"0.025\"}", 1},
                    {"baton_agent_message_seconds_bucket{le=\"0.05\"}", 2},
                    {"baton_agent_message_seconds_bucket{le=\"+Inf\"}", 2},
                }),
            "")
      << text;
}

TEST_F(CoordinatorMetricsTest, ScrapeIsAnsweredOnTheControlLoop) {
  ControlLoop loop;
  const CoordinatorMetrics metrics(&loop, coordinator_.get());
  std::atomic<bool> done{false};
  std::string text;
  std::thread scrape([&] {
    text = Text(metrics.Collect());
    done = true;
  });
  // This thread plays the loop's: the scrape waits until it runs the task.
  while (!done) {
    loop.RunUntilIdle();
    absl::SleepFor(absl::Milliseconds(1));
  }
  scrape.join();
  EXPECT_EQ(
      SampleMismatches(text, {{"baton_job_world_size{job_name=\"job\"}", 3}}),
      "")
      << text;
}

TEST_F(CoordinatorMetricsTest, ScrapeOfAStuckLoopEndsEmptyAtItsTimeout) {
  ControlLoop loop;  // never run
  const CoordinatorMetrics metrics(&loop, coordinator_.get(),
                                   absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  EXPECT_THAT(metrics.Collect(), IsEmpty());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace baton::coordinator
