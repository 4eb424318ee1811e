// Coordinator::CancelJob, the admin's cancel: the job ends as failed through
// the path of every failure, its agents are told the reason, status shows
// it; unknown and ended jobs are errors; other jobs run on.

#include <string>
#include <vector>

#include "coordinator_harness.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

class CoordinatorCancelTest : public CoordinatorTest {};

TEST_F(CoordinatorCancelTest, EndsTheJobAsFailedAndTellsEveryAgent) {
  std::vector<Agent> agents = JoinNodes("job", {2, 2});
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);

  absl::StatusOr<std::string> reason =
      coordinator_->CancelJob("job", "alice", "wrong learning rate");
  ASSERT_TRUE(reason.ok()) << reason.status();
  EXPECT_EQ(*reason, "cancelled by alice: wrong learning rate");

  for (const Agent& agent : agents) {
    const auto ended = agent.Received(v1::CoordinatorMessage::kJobEnded);
    ASSERT_THAT(ended, SizeIs(1)) << agent.node;
    EXPECT_EQ(ended[0].job_ended().job(), "job");
    EXPECT_EQ(ended[0].job_ended().state(), v1::JOB_STATE_FAILED);
    EXPECT_EQ(ended[0].job_ended().reason(),
              "cancelled by alice: wrong learning rate");
  }
  const v1::JobStatus status = Status("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(status.state_reason(), "cancelled by alice: wrong learning rate");
}

TEST_F(CoordinatorCancelTest, WithoutAReasonSaysWhoCancelled) {
  JoinNodes("job", {1});
  absl::StatusOr<std::string> reason =
      coordinator_->CancelJob("job", "an admin", "");
  ASSERT_TRUE(reason.ok()) << reason.status();
  EXPECT_EQ(*reason, "cancelled by an admin");
  EXPECT_EQ(Status("job").state_reason(), "cancelled by an admin");
}

TEST_F(CoordinatorCancelTest, AFormingJobCanBeCancelled) {
  Agent a = Connect("n0");
  Join(a, "job", 1, /*expected_nodes=*/2);
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_FORMING);
  ASSERT_TRUE(coordinator_->CancelJob("job", "bob", "never mind").ok());
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kJobEnded), SizeIs(1));
}

TEST_F(CoordinatorCancelTest, UnknownJobIsNotFound) {
  JoinNodes("job", {1});
  absl::StatusOr<std::string> reason =
      coordinator_->CancelJob("nosuch", "alice", "");
  EXPECT_EQ(reason.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reason.status().message(), HasSubstr("\"nosuch\""));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorCancelTest, EndedJobIsAFailedPrecondition) {
  std::vector<Agent> agents = JoinNodes("job", {1});
  ASSERT_TRUE(coordinator_->CancelJob("job", "alice", "first").ok());
  absl::StatusOr<std::string> again =
      coordinator_->CancelJob("job", "bob", "second");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(),
              HasSubstr("has already failed: cancelled by alice: first"));
  // The first reason stands; the agent heard of the end once.
  EXPECT_EQ(Status("job").state_reason(), "cancelled by alice: first");
  EXPECT_THAT(agents[0].Received(v1::CoordinatorMessage::kJobEnded), SizeIs(1));
}

TEST_F(CoordinatorCancelTest, AFinishedJobIsAFailedPrecondition) {
  std::vector<Agent> agents = JoinNodes("job", {1});
  const int64_t generation = Status("job").generation();
  Leave(agents[0], "job", generation);
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_FINISHED);
  absl::StatusOr<std::string> reason =
      coordinator_->CancelJob("job", "alice", "");
  EXPECT_EQ(reason.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reason.status().message(), HasSubstr("has already finished"));
}

TEST_F(CoordinatorCancelTest, OtherJobsRunOn) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "doomed", 1, 1);
  Join(b, "other", 1, 1);
  ASSERT_TRUE(coordinator_->CancelJob("doomed", "alice", "").ok());
  EXPECT_EQ(Status("other").state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(b.Received(v1::CoordinatorMessage::kJobEnded), SizeIs(0));
}

TEST_F(CoordinatorCancelTest, AnOverlongReasonIsRefused) {
  JoinNodes("job", {1});
  absl::StatusOr<std::string> reason = coordinator_->CancelJob(
      "job", "alice", std::string(Coordinator::kMaxCancelReasonBytes + 1, 'x'));
  EXPECT_EQ(reason.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
}

}  // namespace
}  // namespace baton::coordinator
