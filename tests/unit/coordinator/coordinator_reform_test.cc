// Re-form records and the nodes lost and joined, as the status API shows
// them (JobStatus.reforms, members_lost, members_joined): what started each
// re-form, how long it took on the FakeClock and how it ended.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/reform_log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/coordinator_harness.h"

namespace baton::coordinator {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Two of three nodes go silent together; with min_nodes 2 the survivor waits
// for a replacement, which joins 1.5 s later.
TEST_F(CoordinatorTest, LossWaitingForAReplacementIsOneReformTimedByTheClock) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, /*min_nodes=*/2);
  RunUntil(
      {&a},
      [&] {
        return !a.Received(v1::CoordinatorMessage::kGenerationAborted).empty();
      },
      absl::Seconds(30));
  const absl::Time lost = clock_.Now();
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_REFORMING);

  clock_.Advance(absl::Milliseconds(1500));
  Agent d = Connect("n3");
  Join(d, "job", 1, 3, 2);

  const v1::JobStatus status = Status("job");
  ASSERT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  ASSERT_THAT(status.reforms(), SizeIs(1));
  const v1::Reform& reform = status.reforms(0);
  EXPECT_EQ(reform.aborted_generation(), 1);
  EXPECT_EQ(reform.new_generation(), 2);
  EXPECT_EQ(reform.cause(), "lost");
  // The first of the two lost in one tick (either: sessions are unordered).
  EXPECT_THAT(reform.node_name(), AnyOf("n1", "n2"));
  EXPECT_THAT(reform.reason(),
              HasSubstr(absl::StrCat("node ", reform.node_name(),
                                     " missed its liveness deadline")));
  EXPECT_EQ(reform.started_unix_ms(), absl::ToUnixMillis(lost));
  EXPECT_EQ(reform.duration_ms(), 1500);
  EXPECT_EQ(reform.nodes_before(), 3);
  EXPECT_EQ(reform.nodes_after(), 2);
  EXPECT_EQ(reform.outcome(), "sealed");
  EXPECT_EQ(status.members_lost(), 2);
  EXPECT_EQ(status.members_joined(), 1);

  const ReformHistogram seconds = coordinator_->ReformSeconds("job");
  EXPECT_EQ(seconds.count, 1u);
  EXPECT_DOUBLE_EQ(seconds.sum_seconds, 1.5);
}

// With enough survivors the job re-seals at once; a node joining the job
// below expected_nodes re-forms it again to grow it.
TEST_F(CoordinatorTest, SurvivorsResealAtOnceAndAJoinGrowsTheJobAgain) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, /*min_nodes=*/2);
  coordinator_->OnSessionClosed(c.id, "connection reset");
  clock_.Advance(absl::Seconds(7));
  Agent d = Connect("n3");
  Join(d, "job", 1, 3, 2);
  // It waits for the members' next commit: the re-form starts there.
  clock_.Advance(absl::Seconds(1));
  AdmitJoins(a, "job", 2);

  const v1::JobStatus status = Status("job");
  ASSERT_THAT(status.reforms(), SizeIs(2));
  const v1::Reform& loss = status.reforms(0);
  EXPECT_EQ(loss.cause(), "lost");
  EXPECT_EQ(loss.node_name(), "n2");
  EXPECT_EQ(loss.reason(),
            "node n2 lost its session to the coordinator (connection reset)");
  EXPECT_EQ(loss.duration_ms(), 0);
  EXPECT_EQ(loss.nodes_before(), 3);
  EXPECT_EQ(loss.nodes_after(), 2);
  EXPECT_EQ(loss.outcome(), "sealed");
  const v1::Reform& growth = status.reforms(1);
  EXPECT_EQ(growth.aborted_generation(), 2);
  EXPECT_EQ(growth.new_generation(), 3);
  EXPECT_EQ(growth.cause(), "joined");
  EXPECT_EQ(growth.node_name(), "n3");
  EXPECT_EQ(growth.reason(),
            "node n3 joins the running job (node n0's trainers reached a "
            "commit)");
  EXPECT_EQ(growth.started_unix_ms(), loss.started_unix_ms() + 8000);
  EXPECT_EQ(growth.duration_ms(), 0);
  EXPECT_EQ(growth.nodes_before(), 2);
  EXPECT_EQ(growth.nodes_after(), 3);
  EXPECT_EQ(growth.outcome(), "sealed");
  EXPECT_EQ(status.members_lost(), 1);
  EXPECT_EQ(status.members_joined(), 1);
  EXPECT_EQ(coordinator_->ReformSeconds("job").count, 2u);
}

TEST_F(CoordinatorTest, LeavingWithWorkUnfinishedIsALeftReform) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 2, 2, /*min_nodes=*/1);
  Join(b, "job", 2, 2, 1);
  Leave(b, "job", 1, "trainer local rank 0 failed: CUDA error");
  const v1::JobStatus status = Status("job");
  ASSERT_THAT(status.reforms(), SizeIs(1));
  EXPECT_EQ(status.reforms(0).cause(), "left");
  EXPECT_EQ(status.reforms(0).node_name(), "n1");
  EXPECT_EQ(status.reforms(0).reason(),
            "node n1 left the job: trainer local rank 0 failed: CUDA error");
  EXPECT_EQ(status.reforms(0).outcome(), "sealed");
  EXPECT_EQ(status.members_lost(), 1);
}

// In progress, a re-form shows how long it has waited so far; at
// reform_timeout it ends failed, and is not observed as a sealed re-form.
TEST_F(CoordinatorTest, ReformThatTimesOutIsRecordedFailed) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  coordinator_->OnSessionClosed(b.id, "crashed");
  RunUntil(
      {&a}, [] { return false; }, absl::Seconds(10));
  v1::JobStatus status = Status("job");
  ASSERT_THAT(status.reforms(), SizeIs(1));
  EXPECT_EQ(status.reforms(0).outcome(), "");
  EXPECT_EQ(status.reforms(0).duration_ms(), 10000);
  EXPECT_EQ(status.reforms(0).nodes_after(), 1);

  RunUntil(
      {&a},
      [&] { return !a.Received(v1::CoordinatorMessage::kJobEnded).empty(); },
      options_.reform_timeout);
  status = Status("job");
  ASSERT_EQ(status.state(), v1::JOB_STATE_FAILED);
  ASSERT_THAT(status.reforms(), SizeIs(1));
  const v1::Reform& reform = status.reforms(0);
  EXPECT_EQ(reform.aborted_generation(), 1);
  EXPECT_EQ(reform.new_generation(), 2);
  EXPECT_EQ(reform.duration_ms(),
            absl::ToInt64Milliseconds(options_.reform_timeout));
  EXPECT_EQ(reform.nodes_before(), 2);
  EXPECT_EQ(reform.nodes_after(), 1);
  EXPECT_EQ(reform.outcome(), "failed: " + status.state_reason());
  EXPECT_THAT(reform.outcome(),
              HasSubstr("failed: not whole again within 60.0 s"));
  EXPECT_EQ(coordinator_->ReformSeconds("job").count, 0u);
}

TEST_F(CoordinatorTest, ReformsThatEndTheJobSayHow) {
  // The last node is lost: the re-form it started fails at once.
  Agent a = Connect("n0");
  Join(a, "solo", 1, 1);
  coordinator_->OnSessionClosed(a.id, "crashed");
  v1::JobStatus status = Status("solo");
  ASSERT_THAT(status.reforms(), SizeIs(1));
  EXPECT_EQ(status.reforms(0).nodes_after(), 0);
  EXPECT_THAT(status.reforms(0).outcome(),
              HasSubstr("failed: every node was lost (last: node n0 lost"));

  // The survivors finish while waiting for a replacement.
  Agent b = Connect("n1"), c = Connect("n2"), d = Connect("n3");
  for (Agent* agent : {&b, &c, &d}) Join(*agent, "trio", 1, 3);
  coordinator_->OnSessionClosed(d.id, "crashed");
  Leave(b, "trio", 1);
  Leave(c, "trio", 1);
  status = Status("trio");
  ASSERT_EQ(status.state(), v1::JOB_STATE_FINISHED);
  ASSERT_THAT(status.reforms(), SizeIs(1));
  EXPECT_EQ(status.reforms(0).outcome(), "finished: all 2 nodes finished");
  EXPECT_EQ(status.reforms(0).nodes_after(), 2);
}

// Only joins after the first seal count; an agent that joins again on a new
// session (a reconnect) is no new node.
TEST_F(CoordinatorTest, JoinsAreCountedOnlyAfterTheFirstSeal) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.members_joined(), 0);
  EXPECT_EQ(status.members_lost(), 0);
  EXPECT_THAT(status.reforms(), IsEmpty());

  Agent b2 = Connect("n1");  // Same instance: the agent reconnected.
  Join(b2, "job", 1, 2);
  EXPECT_EQ(Status("job").members_joined(), 0);
  EXPECT_THAT(Status("job").reforms(), IsEmpty());

  coordinator_->OnSessionClosed(a.id, "crashed");
  Agent c = Connect("n2");
  Join(c, "job", 1, 2);  // into the re-forming job: sealed again
  status = Status("job");
  EXPECT_EQ(status.members_lost(), 1);
  EXPECT_EQ(status.members_joined(), 1);
  ASSERT_THAT(status.reforms(), SizeIs(1));
  EXPECT_EQ(status.reforms(0).cause(), "lost");
}

TEST_F(CoordinatorTest, OnlyTheLastReformsAreKept) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2, /*min_nodes=*/1);
  Join(b, "job", 1, 2, 1);
  // Each round: n1 leaves (re-sealed with n0), then joins again (grown).
  const int rounds = ReformLog::kKept / 2 + 2;
  for (int i = 0; i < rounds; ++i) {
    Leave(b, "job", Status("job").generation(), absl::StrCat("round ", i));
    Join(b, "job", 1, 2, 1);
    AdmitJoins(a, "job", Status("job").generation());
  }
  const v1::JobStatus status = Status("job");
  ASSERT_THAT(status.reforms(), SizeIs(ReformLog::kKept));
  // 2 * rounds re-forms from generation 1 on: the first 4 were dropped.
  EXPECT_EQ(status.reforms(0).aborted_generation(), 5);
  EXPECT_EQ(status.reforms(0).cause(), "left");
  EXPECT_EQ(status.reforms(0).reason(), "node n1 left the job: round 2");
  EXPECT_EQ(status.reforms().rbegin()->cause(), "joined");
  EXPECT_EQ(status.reforms().rbegin()->new_generation(), 2 * rounds + 1);
  EXPECT_EQ(status.members_lost(), rounds);
  EXPECT_EQ(status.members_joined(), rounds);
  // The histogram counts every sealed re-form, not only those kept.
  EXPECT_EQ(coordinator_->ReformSeconds("job").count,
            static_cast<uint64_t>(2 * rounds));
}

// The records are soft state: a rebuilt job starts without them, and its
// first re-form aborts the recovered generation.
TEST_F(CoordinatorTest, RestartForgetsTheReformsAndCountsAgainFromRecovery) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, /*min_nodes=*/2);
  coordinator_->OnSessionClosed(c.id, "crashed");
  const v1::Membership sealed =
      a.Received(v1::CoordinatorMessage::kMembership).back().membership();
  ASSERT_EQ(sealed.generation(), 2);

  Restart();
  a = Connect("n0");
  b = Connect("n1");
  for (Agent* agent : {&a, &b}) {
    v1::AgentMessage message;
    *message.mutable_rejoin()->mutable_membership() = sealed;
    message.mutable_rejoin()->set_expected_nodes(3);
    message.mutable_rejoin()->set_min_nodes(2);
    Send(*agent, message);
  }
  v1::JobStatus status = Status("job");
  ASSERT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(status.reforms(), IsEmpty());
  EXPECT_EQ(status.members_lost(), 0);
  EXPECT_EQ(status.members_joined(), 0);
  EXPECT_EQ(coordinator_->ReformSeconds("job").count, 0u);

  Agent d = Connect("n3");
  Join(d, "job", 1, 3, 2);
  AdmitJoins(a, "job", 2);
  status = Status("job");
  ASSERT_THAT(status.reforms(), SizeIs(1));
  EXPECT_EQ(status.reforms(0).aborted_generation(), 2);
  EXPECT_EQ(status.reforms(0).new_generation(), 3);
  EXPECT_EQ(status.reforms(0).nodes_before(), 2);
  EXPECT_EQ(status.reforms(0).nodes_after(), 3);
  EXPECT_EQ(status.members_joined(), 1);
}

TEST_F(CoordinatorTest, UnknownJobHasNoReformHistogram) {
  const ReformHistogram seconds = coordinator_->ReformSeconds("nope");
  EXPECT_EQ(seconds.count, 0u);
  EXPECT_EQ(seconds.cumulative[0], 0u);
}

}  // namespace
}  // namespace baton::coordinator
