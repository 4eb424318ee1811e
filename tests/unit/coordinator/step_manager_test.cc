#include "coordinator/step_manager.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);
constexpr absl::Duration kThreshold = absl::Seconds(5);

struct NodeSpec {
  std::string name;
  int32_t local_size;
};

// Nodes get consecutive rank ranges in the order given.
v1::Membership MakeMembership(const std::string& job, int64_t generation,
                              const std::vector<NodeSpec>& nodes) {
  v1::Membership membership;
  membership.set_job(job);
  membership.set_generation(generation);
  int32_t offset = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    v1::NodeInfo* info = membership.add_nodes();
    info->set_node_name(nodes[i].name);
    info->set_node_rank(static_cast<int32_t>(i));
    info->set_local_size(nodes[i].local_size);
    info->set_rank_offset(offset);
    offset += nodes[i].local_size;
  }
  membership.set_world_size(offset);
  return membership;
}

// A report of (rank, completed_step) pairs.
v1::StepReport Report(int64_t generation,
                      const std::vector<std::pair<int32_t, int64_t>>& ranks,
                      const std::string& job = "job") {
  v1::StepReport report;
  report.set_job(job);
  report.set_generation(generation);
  for (const auto& [rank, step] : ranks) {
    v1::RankProgress* progress = report.add_ranks();
    progress->set_rank(rank);
    progress->set_completed_step(step);
  }
  return report;
}

void AddPending(v1::StepReport* report, uint32_t tensor_id, int64_t step,
                const std::vector<int32_t>& submitted, int64_t waiting_ms) {
  v1::PendingTensor* pending = report->add_pending();
  pending->set_tensor_id(tensor_id);
  pending->set_step(step);
  for (int32_t rank : submitted) pending->add_submitted_ranks(rank);
  pending->set_waiting_ms(waiting_ms);
}

// The node completed step `step` of `tensor_id` since its previous report.
void AddCompleted(v1::StepReport* report, uint32_t tensor_id, int64_t step) {
  v1::TensorLatency* latency = report->mutable_stats()->add_tensor_latencies();
  latency->set_tensor_id(tensor_id);
  latency->set_count(1);
  latency->set_last_step(step);
}

// Sets each listed rank's submitted step.
void SetSubmitted(v1::StepReport* report, int64_t step) {
  for (v1::RankProgress& progress : *report->mutable_ranks()) {
    progress.set_submitted_step(step);
  }
}

std::string TensorName(uint32_t tensor_id) {
  return absl::StrCat("Gradient.layer", tensor_id);
}

std::vector<int32_t> Ints(
    const google::protobuf::RepeatedField<int32_t>& field) {
  return {field.begin(), field.end()};
}

// Heterogeneous job: n0 has ranks 0..1, n1 ranks 2..4, n2 rank 5.
class StepManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    steps_.OnGenerationSealed(
        MakeMembership("job", 1, {{"n0", 2}, {"n1", 3}, {"n2", 1}}));
  }

  void MustReport(const std::string& node, const v1::StepReport& report,
                  absl::Time now = kT0) {
    absl::Status status = steps_.OnReport(node, report, now);
    ASSERT_TRUE(status.ok()) << status;
  }

  // The three nodes as members of a JobStatus, plus one not yet sealed.
  v1::JobStatus StatusWithMembers(absl::Time now = kT0) {
    v1::JobStatus status;
    for (const char* name : {"n0", "n1", "n2", "joining"}) {
      status.add_members()->set_node_name(name);
    }
    steps_.FillStatus("job", now, TensorName, &status);
    return status;
  }

  StepManager steps_{kThreshold};
};

TEST_F(StepManagerTest, GlobalStepIsMinOverRanksAndUnreportedRanksCount) {
  EXPECT_EQ(steps_.GlobalStep("job"), -1);
  MustReport("n0", Report(1, {{0, 5}, {1, 4}}));
  MustReport("n1", Report(1, {{2, 6}, {3, 6}, {4, 7}}));
  // n2's rank 5 has not reported: it counts as -1.
  EXPECT_EQ(steps_.GlobalStep("job"), -1);
  MustReport("n2", Report(1, {{5, 3}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 3);
  MustReport("n2", Report(1, {{5, 10}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 4);
  MustReport("n0", Report(1, {{0, 6}, {1, 6}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 6);
  MustReport("n1", Report(1, {{2, 9}, {3, 8}, {4, 9}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 6);
}

TEST_F(StepManagerTest, PartialReportKeepsOtherRanksOfTheNode) {
  MustReport("n1", Report(1, {{2, 4}, {3, 4}, {4, 4}}));
  MustReport("n1", Report(1, {{3, 9}}));
  v1::JobStatus status = StatusWithMembers();
  const v1::MemberStatus& n1 = status.members(1);
  ASSERT_EQ(n1.ranks_size(), 3);
  EXPECT_EQ(n1.ranks(0).completed_step(), 4);
  EXPECT_EQ(n1.ranks(1).completed_step(), 9);
  EXPECT_EQ(n1.ranks(2).completed_step(), 4);
}

TEST_F(StepManagerTest, RankStepsAndGlobalStepNeverGoBackwards) {
  MustReport("n0", Report(1, {{0, 5}, {1, 5}}));
  MustReport("n1", Report(1, {{2, 5}, {3, 5}, {4, 5}}));
  MustReport("n2", Report(1, {{5, 5}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 5);
  // A late or confused report does not move anything back.
  MustReport("n2", Report(1, {{5, 2}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 5);
  v1::JobStatus status = StatusWithMembers();
  ASSERT_EQ(status.members(2).ranks_size(), 1);
  EXPECT_EQ(status.members(2).ranks(0).completed_step(), 5);
}

TEST_F(StepManagerTest, UnknownJobHasGlobalStepMinusOne) {
  EXPECT_EQ(steps_.GlobalStep("other"), -1);
  v1::JobStatus status;
  status.add_members()->set_node_name("n0");
  steps_.FillStatus("other", kT0, TensorName, &status);
  EXPECT_EQ(status.global_step(), -1);
  EXPECT_THAT(status.members(0).ranks(), IsEmpty());
  EXPECT_THAT(status.stalls(), IsEmpty());
}

TEST_F(StepManagerTest, FillStatusReportsRanksLagAndStats) {
  v1::StepReport n0 = Report(1, {{0, 10}, {1, 8}});
  n0.mutable_stats()->set_queue_depth(3);
  n0.mutable_stats()->set_bytes_in_flight(1 << 20);
  n0.mutable_stats()->set_throughput_bytes_per_second(2.5e9);
  MustReport("n0", n0);
  MustReport("n1", Report(1, {{2, 12}, {3, 12}, {4, 11}}));
  // n2 never reported: its rank is at -1, 13 behind the fastest rank (12).

  v1::JobStatus status = StatusWithMembers();
  EXPECT_EQ(status.global_step(), -1);
  ASSERT_EQ(status.members_size(), 4);

  const v1::MemberStatus& m0 = status.members(0);
  ASSERT_EQ(m0.ranks_size(), 2);
  EXPECT_EQ(m0.ranks(0).rank(), 0);
  EXPECT_EQ(m0.ranks(0).completed_step(), 10);
  EXPECT_EQ(m0.ranks(0).lag(), 2);
  EXPECT_EQ(m0.ranks(1).rank(), 1);
  EXPECT_EQ(m0.ranks(1).completed_step(), 8);
  EXPECT_EQ(m0.ranks(1).lag(), 4);
  EXPECT_EQ(m0.queue_depth(), 3);
  EXPECT_EQ(m0.bytes_in_flight(), 1 << 20);
  EXPECT_DOUBLE_EQ(m0.throughput_bytes_per_second(), 2.5e9);

  const v1::MemberStatus& m1 = status.members(1);
  ASSERT_EQ(m1.ranks_size(), 3);
  EXPECT_EQ(m1.ranks(0).rank(), 2);
  EXPECT_EQ(m1.ranks(0).lag(), 0);
  EXPECT_EQ(m1.ranks(2).rank(), 4);
  EXPECT_EQ(m1.ranks(2).lag(), 1);
  EXPECT_EQ(m1.queue_depth(), 0);

  const v1::MemberStatus& m2 = status.members(2);
  ASSERT_EQ(m2.ranks_size(), 1);
  EXPECT_EQ(m2.ranks(0).rank(), 5);
  EXPECT_EQ(m2.ranks(0).completed_step(), -1);
  EXPECT_EQ(m2.ranks(0).lag(), 13);

  // A member the manager does not know is left as the caller filled it.
  EXPECT_THAT(status.members(3).ranks(), IsEmpty());

  // The second report of a node replaces its stats.
  v1::StepReport again = Report(1, {});
  again.mutable_stats()->set_queue_depth(7);
  MustReport("n0", again);
  EXPECT_EQ(StatusWithMembers().members(0).queue_depth(), 7);
  EXPECT_EQ(StatusWithMembers().members(0).bytes_in_flight(), 0);
}

TEST_F(StepManagerTest, FillStatusReplacesRanksAlreadyInTheMember) {
  MustReport("n2", Report(1, {{5, 4}}));
  v1::JobStatus status;
  v1::MemberStatus* member = status.add_members();
  member->set_node_name("n2");
  member->add_ranks()->set_rank(99);
  steps_.FillStatus("job", kT0, TensorName, &status);
  ASSERT_EQ(status.members(0).ranks_size(), 1);
  EXPECT_EQ(status.members(0).ranks(0).rank(), 5);
  EXPECT_EQ(status.members(0).ranks(0).completed_step(), 4);
}

// Everyone completed step 3; tensor 7 of step 4 was submitted by n0 (ranks
// 0, 1) and by rank 3 of n1, not by ranks 2, 4 and 5.
class StallTest : public StepManagerTest {
 protected:
  void SetUp() override {
    StepManagerTest::SetUp();
    v1::StepReport n0 = Report(1, {{0, 3}, {1, 3}});
    AddPending(&n0, 7, 4, {1, 0}, 2000);
    MustReport("n0", n0, kT0);
    v1::StepReport n1 = Report(1, {{2, 3}, {3, 3}, {4, 3}});
    AddPending(&n1, 7, 4, {3}, 3500);
    MustReport("n1", n1, kT0 + absl::Milliseconds(500));
    MustReport("n2", Report(1, {{5, 3}}), kT0);
  }
};

TEST_F(StallTest, StallNamesMissingAndSubmittedRanksAndLongestWait) {
  // At kT0 + 2 s: n0 waited 2000 + 2000 ms, n1 3500 + 1500 ms = 5000 ms.
  EXPECT_THAT(
      steps_.TakeNewStalls("job", kT0 + absl::Milliseconds(1499), TensorName),
      IsEmpty());
  std::vector<v1::Stall> stalls =
      steps_.TakeNewStalls("job", kT0 + absl::Milliseconds(2000), TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].tensor_id(), 7u);
  EXPECT_EQ(stalls[0].tensor(), "Gradient.layer7");
  EXPECT_EQ(stalls[0].step(), 4);
  EXPECT_THAT(Ints(stalls[0].missing_ranks()), ElementsAre(2, 4, 5));
  EXPECT_THAT(Ints(stalls[0].submitted_ranks()), ElementsAre(0, 1, 3));
  EXPECT_THAT(stalls[0].missing_nodes(), ElementsAre("n1", "n2"));
  EXPECT_EQ(stalls[0].waiting_ms(), 5000);
}

TEST_F(StallTest, ThresholdBoundaryIsInclusive) {
  // The longest wait (n1's) is 3500 + (now - kT0 - 500 ms).
  const absl::Time just_below = kT0 + absl::Milliseconds(1999);
  EXPECT_THAT(steps_.TakeNewStalls("job", just_below, TensorName), IsEmpty());
  v1::JobStatus below;
  steps_.FillStatus("job", just_below, TensorName, &below);
  EXPECT_THAT(below.stalls(), IsEmpty());

  const absl::Time at = kT0 + absl::Milliseconds(2000);
  std::vector<v1::Stall> stalls = steps_.TakeNewStalls("job", at, TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].waiting_ms(), 5000);
}

TEST_F(StallTest, EachStallIsTakenOnceButStaysInStatus) {
  const absl::Time later = kT0 + absl::Seconds(10);
  EXPECT_EQ(steps_.TakeNewStalls("job", later, TensorName).size(), 1u);
  EXPECT_THAT(steps_.TakeNewStalls("job", later + absl::Seconds(1), TensorName),
              IsEmpty());

  v1::JobStatus status = StatusWithMembers(later);
  ASSERT_EQ(status.stalls_size(), 1);
  EXPECT_EQ(status.stalls(0).tensor_id(), 7u);
  EXPECT_EQ(status.stalls(0).waiting_ms(), 13000);

  // A second tensor stalls later: only it is new.
  v1::StepReport n0 = Report(1, {{0, 3}, {1, 3}});
  AddPending(&n0, 7, 4, {0, 1}, 2000);
  AddPending(&n0, 9, 4, {0}, 6000);
  MustReport("n0", n0, later);
  std::vector<v1::Stall> fresh = steps_.TakeNewStalls("job", later, TensorName);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].tensor_id(), 9u);
  EXPECT_THAT(Ints(fresh[0].missing_ranks()), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(Ints(fresh[0].submitted_ranks()), ElementsAre(0));
}

TEST_F(StallTest, StatusStallsAreSortedByWaitThenTensorId) {
  v1::StepReport n2 = Report(1, {{5, 3}});
  AddPending(&n2, 12, 4, {5}, 9000);
  AddPending(&n2, 3, 4, {5}, 9000);
  AddPending(&n2, 1, 4, {5}, 6000);
  MustReport("n2", n2, kT0 + absl::Seconds(1));
  // At kT0 + 3 s n2's entries have waited 2 s more, tensor 7 (n1's) 6000 ms.
  v1::JobStatus status = StatusWithMembers(kT0 + absl::Seconds(3));
  std::vector<std::pair<uint32_t, int64_t>> order;
  for (const v1::Stall& stall : status.stalls()) {
    order.emplace_back(stall.tensor_id(), stall.waiting_ms());
  }
  EXPECT_THAT(order, ElementsAre(std::make_pair(3u, int64_t{11000}),
                                 std::make_pair(12u, int64_t{11000}),
                                 std::make_pair(1u, int64_t{8000}),
                                 std::make_pair(7u, int64_t{6000})));
}

TEST_F(StallTest, CompletedStepIsNoLongerAStall) {
  const absl::Time later = kT0 + absl::Seconds(10);
  // Everyone completes step 4, but n0's latest report still lists tensor 7.
  v1::StepReport n1 = Report(1, {{2, 4}, {3, 4}, {4, 4}});
  AddCompleted(&n1, 7, 4);
  MustReport("n1", n1, later);
  v1::StepReport n2 = Report(1, {{5, 4}});
  AddCompleted(&n2, 7, 4);
  MustReport("n2", n2, later);
  EXPECT_EQ(steps_.GlobalStep("job"), 3);
  // n1 and n2 completed tensor 7's step 4, so none of their ranks is
  // missing any more.
  EXPECT_THAT(steps_.TakeNewStalls("job", later, TensorName), IsEmpty());
  MustReport("n0", Report(1, {{0, 4}, {1, 4}}), later);
  EXPECT_EQ(steps_.GlobalStep("job"), 4);
  EXPECT_THAT(StatusWithMembers(later).stalls(), IsEmpty());
}

TEST_F(StallTest, RanksWhoseNodeCompletedTheTensorAreNotMissing) {
  // n2 completed tensor 7's step 4 in one report; the next one says nothing
  // of it, and n2 stays past that step.
  v1::StepReport n2 = Report(1, {{5, 4}});
  AddCompleted(&n2, 7, 4);
  MustReport("n2", n2, kT0);
  MustReport("n2", Report(1, {{5, 4}}), kT0);
  std::vector<v1::Stall> stalls =
      steps_.TakeNewStalls("job", kT0 + absl::Seconds(5), TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_THAT(Ints(stalls[0].missing_ranks()), ElementsAre(2, 4));
  EXPECT_THAT(stalls[0].missing_nodes(), ElementsAre("n1"));
}

TEST_F(StallTest, RanksOfANodeAtALaterStepOfTheTensorAreNotMissing) {
  v1::StepReport n2 = Report(1, {{5, 4}});
  AddPending(&n2, 7, 5, {5}, 100);
  MustReport("n2", n2, kT0);
  // At kT0 + 2 s step 4 has waited 5 s (n1's), step 5 only 2.1 s.
  std::vector<v1::Stall> stalls =
      steps_.TakeNewStalls("job", kT0 + absl::Seconds(2), TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].step(), 4);
  EXPECT_THAT(Ints(stalls[0].missing_ranks()), ElementsAre(2, 4));
}

TEST_F(StallTest, ACompletedStepOfTheRankIsNoProofItSubmittedTheTensor) {
  // n2's rank completed step 4 of another tensor and has nothing pending:
  // it has still not submitted tensor 7 of step 4.
  v1::StepReport n2 = Report(1, {{5, 4}});
  AddCompleted(&n2, 7, 3);
  AddCompleted(&n2, 8, 4);
  MustReport("n2", n2, kT0);
  std::vector<v1::Stall> stalls =
      steps_.TakeNewStalls("job", kT0 + absl::Seconds(5), TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_THAT(Ints(stalls[0].missing_ranks()), ElementsAre(2, 4, 5));
}

TEST_F(StallTest, PendingAtOrBelowGlobalStepIsIgnored) {
  MustReport("n0", Report(1, {{0, 5}, {1, 5}}));
  MustReport("n1", Report(1, {{2, 5}, {3, 5}, {4, 5}}));
  v1::StepReport n2 = Report(1, {{5, 5}});
  AddPending(&n2, 8, 5, {5}, 60000);
  AddPending(&n2, 8, 6, {5}, 60000);
  MustReport("n2", n2);
  EXPECT_EQ(steps_.GlobalStep("job"), 5);
  std::vector<v1::Stall> stalls =
      steps_.TakeNewStalls("job", kT0 + absl::Seconds(1), TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].step(), 6);
}

TEST_F(StallTest, NewReportReplacesThePendingList) {
  // n1's new report no longer lists tensor 7: only n0's wait remains.
  MustReport("n1", Report(1, {{2, 3}, {3, 3}, {4, 3}}), kT0);
  std::vector<v1::Stall> stalls =
      steps_.TakeNewStalls("job", kT0 + absl::Seconds(3), TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].waiting_ms(), 5000);
  EXPECT_THAT(Ints(stalls[0].submitted_ranks()), ElementsAre(0, 1));
  EXPECT_THAT(Ints(stalls[0].missing_ranks()), ElementsAre(2, 3, 4, 5));
}

TEST_F(StallTest, EverySubmittedRankIsNotAStall) {
  v1::StepReport n1 = Report(1, {{2, 3}, {3, 3}, {4, 3}});
  AddPending(&n1, 7, 4, {2, 3, 4}, 9000);
  MustReport("n1", n1);
  v1::StepReport n2 = Report(1, {{5, 3}});
  AddPending(&n2, 7, 4, {5}, 9000);
  MustReport("n2", n2);
  // Submitted everywhere: the collective is slow, not stuck on a rank.
  EXPECT_THAT(steps_.TakeNewStalls("job", kT0 + absl::Seconds(30), TensorName),
              IsEmpty());
}

TEST_F(StallTest, NewGenerationDropsReportsAndAnnouncesAgain) {
  const absl::Time later = kT0 + absl::Seconds(10);
  ASSERT_EQ(steps_.TakeNewStalls("job", later, TensorName).size(), 1u);
  steps_.OnGenerationSealed(
      MakeMembership("job", 2, {{"n0", 2}, {"n1", 3}, {"n2", 1}}));
  EXPECT_THAT(steps_.TakeNewStalls("job", later, TensorName), IsEmpty());
  EXPECT_EQ(StatusWithMembers(later).members(0).queue_depth(), 0);

  // The same (tensor, step) stalling in the new generation is news again.
  v1::StepReport n0 = Report(2, {{0, 3}, {1, 3}});
  AddPending(&n0, 7, 4, {0, 1}, 8000);
  MustReport("n0", n0, later);
  EXPECT_EQ(steps_.TakeNewStalls("job", later, TensorName).size(), 1u);
}

// Issue 17: 2 nodes x 2 ranks; every rank submitted tensor 1 of step 2
// (completed), then one rank held tensor 2 of step 2 back while the others
// submitted it.
class HeldBackTensorTest : public ::testing::Test {
 protected:
  void Seal(int32_t local_size) {
    steps_.OnGenerationSealed(
        MakeMembership("job", 1, {{"a", local_size}, {"b", local_size}}));
  }

  void MustReport(const std::string& node, const v1::StepReport& report,
                  absl::Time now) {
    absl::Status status = steps_.OnReport(node, report, now);
    ASSERT_TRUE(status.ok()) << status;
  }

  v1::JobStatus Status(absl::Time now) {
    v1::JobStatus status;
    status.add_members()->set_node_name("a");
    status.add_members()->set_node_name("b");
    steps_.FillStatus("job", now, TensorName, &status);
    return status;
  }

  StepManager steps_{kThreshold};
};

TEST_F(HeldBackTensorTest,
       TheRankThatHoldsItBackIsMissingAndLagsNotItsNodeMate) {
  Seal(2);
  // What the agents report: a step pending on a node is completed by none of
  // its ranks (each at 1), and every rank submitted something of step 2.
  v1::StepReport a = Report(1, {{0, 1}, {1, 1}});
  SetSubmitted(&a, 2);
  AddCompleted(&a, 1, 2);
  AddPending(&a, 2, 2, {0}, 0);
  MustReport("a", a, kT0);
  v1::StepReport b = Report(1, {{2, 1}, {3, 1}});
  SetSubmitted(&b, 2);
  AddCompleted(&b, 1, 2);
  AddPending(&b, 2, 2, {2, 3}, 0);
  MustReport("b", b, kT0);

  // Below the threshold: no stall, and nobody lags.
  v1::JobStatus early = Status(kT0 + kThreshold - absl::Milliseconds(1));
  EXPECT_THAT(early.stalls(), IsEmpty());
  for (const v1::MemberStatus& member : early.members()) {
    for (const v1::RankStatus& rank : member.ranks()) {
      EXPECT_EQ(rank.lag(), 0) << "rank " << rank.rank();
    }
  }

  const absl::Time later = kT0 + kThreshold;
  std::vector<v1::Stall> stalls =
      steps_.TakeNewStalls("job", later, TensorName);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].tensor(), "Gradient.layer2");
  EXPECT_EQ(stalls[0].step(), 2);
  EXPECT_THAT(Ints(stalls[0].missing_ranks()), ElementsAre(1));
  EXPECT_THAT(stalls[0].missing_nodes(), ElementsAre("a"));
  EXPECT_THAT(Ints(stalls[0].submitted_ranks()), ElementsAre(0, 2, 3));

  v1::JobStatus status = Status(later);
  ASSERT_EQ(status.stalls_size(), 1);
  std::vector<std::pair<int64_t, int64_t>> ranks;  // (completed, lag)
  for (const v1::MemberStatus& member : status.members()) {
    for (const v1::RankStatus& rank : member.ranks()) {
      ranks.emplace_back(rank.completed_step(), rank.lag());
    }
  }
  EXPECT_THAT(ranks, ElementsAre(std::make_pair(1, 0), std::make_pair(1, 1),
                                 std::make_pair(1, 0), std::make_pair(1, 0)));

  // Released: the step completes everywhere, and the stall and lag clear.
  v1::StepReport a_done = Report(1, {{0, 2}, {1, 2}});
  SetSubmitted(&a_done, 2);
  AddCompleted(&a_done, 2, 2);
  MustReport("a", a_done, later);
  v1::StepReport b_done = Report(1, {{2, 2}, {3, 2}});
  SetSubmitted(&b_done, 2);
  AddCompleted(&b_done, 2, 2);
  MustReport("b", b_done, later);
  v1::JobStatus after = Status(later + absl::Seconds(30));
  EXPECT_EQ(after.global_step(), 2);
  EXPECT_THAT(after.stalls(), IsEmpty());
  EXPECT_EQ(after.members(0).ranks(1).lag(), 0);
}

TEST_F(HeldBackTensorTest, ARankAloneOnItsNodeThatHoldsItBackIsMissing) {
  Seal(1);
  // Rank 0's node has nothing pending: its last completed step is that of
  // tensor 1, further than rank 1, which waits for tensor 2.
  v1::StepReport a0 = Report(1, {{0, 1}});
  AddCompleted(&a0, 2, 1);
  MustReport("a", a0, kT0);
  v1::StepReport a = Report(1, {{0, 2}});
  SetSubmitted(&a, 2);
  AddCompleted(&a, 1, 2);
  MustReport("a", a, kT0);
  v1::StepReport b = Report(1, {{1, 1}});
  SetSubmitted(&b, 2);
  AddCompleted(&b, 1, 2);
  AddPending(&b, 2, 2, {1}, 0);
  MustReport("b", b, kT0);

  v1::JobStatus status = Status(kT0 + kThreshold);
  ASSERT_EQ(status.stalls_size(), 1);
  EXPECT_EQ(status.stalls(0).step(), 2);
  EXPECT_THAT(Ints(status.stalls(0).missing_ranks()), ElementsAre(0));
  EXPECT_THAT(status.stalls(0).missing_nodes(), ElementsAre("a"));
  // Rank 0 has not completed step 2 and is the one behind.
  EXPECT_EQ(status.members(0).ranks(0).completed_step(), 1);
  EXPECT_EQ(status.members(0).ranks(0).lag(), 1);
  EXPECT_EQ(status.members(1).ranks(0).completed_step(), 1);
  EXPECT_EQ(status.members(1).ranks(0).lag(), 0);
}

TEST_F(StepManagerTest, NewGenerationKeepsGlobalStepAndRenumbersRanks) {
  MustReport("n0", Report(1, {{0, 7}, {1, 7}}));
  MustReport("n1", Report(1, {{2, 7}, {3, 7}, {4, 7}}));
  MustReport("n2", Report(1, {{5, 9}}));
  ASSERT_EQ(steps_.GlobalStep("job"), 7);

  // n1 is lost; n2 now holds ranks 2.
  steps_.OnGenerationSealed(MakeMembership("job", 2, {{"n0", 2}, {"n2", 1}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 7);
  v1::JobStatus status = StatusWithMembers();
  EXPECT_THAT(status.members(1).ranks(), IsEmpty());
  ASSERT_EQ(status.members(2).ranks_size(), 1);
  EXPECT_EQ(status.members(2).ranks(0).rank(), 2);
  EXPECT_EQ(status.members(2).ranks(0).completed_step(), -1);

  // Reports of the old generation, or from a node no longer a member, are
  // refused.
  absl::Status old = steps_.OnReport("n0", Report(1, {{0, 8}}), kT0);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old.message(),
            "StepReport for job \"job\" generation 1 does not match the "
            "current generation 2");
  absl::Status lost = steps_.OnReport("n1", Report(2, {{2, 8}}), kT0);
  EXPECT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lost.message(),
            "node \"n1\" is not a member of job \"job\" generation 2");

  // The global step stays at 7 until every rank of generation 2 passes it.
  MustReport("n0", Report(2, {{0, 5}, {1, 8}}));
  MustReport("n2", Report(2, {{2, 8}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 7);
  MustReport("n0", Report(2, {{0, 8}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 8);
}

TEST_F(StepManagerTest, StaleOrRepeatedSealIsIgnored) {
  steps_.OnGenerationSealed(MakeMembership("job", 3, {{"a", 1}, {"b", 1}}));
  steps_.Recover("job", "a", 20);
  steps_.Recover("job", "b", 21);
  EXPECT_EQ(steps_.GlobalStep("job"), 20);
  // Another rejoin re-seals generation 3: what Recover seeded stays.
  steps_.OnGenerationSealed(MakeMembership("job", 3, {{"a", 1}, {"b", 1}}));
  steps_.OnGenerationSealed(MakeMembership("job", 2, {{"c", 4}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 20);
  EXPECT_EQ(steps_.OnReport("c", Report(2, {{0, 30}}), kT0).code(),
            absl::StatusCode::kFailedPrecondition);
  MustReport("a", Report(3, {{0, 22}}));
  EXPECT_EQ(steps_.GlobalStep("job"), 21);
}

TEST_F(StepManagerTest, RecoverSeedsEveryRankOfTheNode) {
  steps_.Recover("job", "n1", 40);
  steps_.Recover("job", "n0", 41);
  EXPECT_EQ(steps_.GlobalStep("job"), -1);  // n2 not recovered yet.
  steps_.Recover("job", "n2", 39);
  EXPECT_EQ(steps_.GlobalStep("job"), 39);
  v1::JobStatus status = StatusWithMembers();
  ASSERT_EQ(status.members(1).ranks_size(), 3);
  EXPECT_EQ(status.members(1).ranks(2).completed_step(), 40);
  EXPECT_EQ(status.members(1).ranks(2).lag(), 1);
  EXPECT_EQ(status.members(2).ranks(0).lag(), 2);

  // Unknown job or node: nothing to seed.
  steps_.Recover("other", "n0", 5);
  steps_.Recover("job", "stranger", 100);
  EXPECT_EQ(steps_.GlobalStep("other"), -1);
  EXPECT_EQ(steps_.GlobalStep("job"), 39);
}

TEST_F(StepManagerTest, RemoveJobForgetsIt) {
  MustReport("n0", Report(1, {{0, 1}, {1, 1}}));
  steps_.RemoveJob("job");
  EXPECT_EQ(steps_.GlobalStep("job"), -1);
  EXPECT_EQ(steps_.OnReport("n0", Report(1, {{0, 2}}), kT0).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StepManagerTest, ReportValidationErrors) {
  struct Case {
    std::string node;
    v1::StepReport report;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"n0", Report(1, {{0, 1}}, "nope"),
                   absl::StatusCode::kFailedPrecondition,
                   "StepReport for job \"nope\": the job has no sealed "
                   "generation yet"});
  cases.push_back({"n1", Report(1, {{2, 1}, {5, 1}}),
                   absl::StatusCode::kInvalidArgument,
                   "StepReport.ranks[1].rank 5 is not one of node \"n1\"'s "
                   "ranks 2..4"});
  cases.push_back({"n1", Report(1, {{1, 1}}),
                   absl::StatusCode::kInvalidArgument,
                   "StepReport.ranks[0].rank 1 is not one of node \"n1\"'s "
                   "ranks 2..4"});
  cases.push_back({"n1", Report(1, {{3, -2}}),
                   absl::StatusCode::kInvalidArgument,
                   "StepReport.ranks[0].completed_step is -2 for rank 3; it "
                   "must be -1 (no step completed) or more"});
  cases.push_back({"n1", Report(1, {{3, 1}, {2, 1}, {3, 2}}),
                   absl::StatusCode::kInvalidArgument,
                   "StepReport.ranks names rank 3 twice"});

  v1::StepReport negative_submitted = Report(1, {{3, 1}});
  SetSubmitted(&negative_submitted, -2);
  cases.push_back({"n1", negative_submitted, absl::StatusCode::kInvalidArgument,
                   "StepReport.ranks[0].submitted_step is -2 for rank 3; it "
                   "must be -1 (nothing submitted) or more"});
  v1::StepReport negative_done = Report(1, {});
  AddCompleted(&negative_done, 4, 0);
  AddCompleted(&negative_done, 6, -1);
  cases.push_back({"n1", negative_done, absl::StatusCode::kInvalidArgument,
                   "StepReport.stats.tensor_latencies[1] (tensor 6) has "
                   "last_step -1; a completed step is 0 or more"});

  v1::StepReport negative_step = Report(1, {});
  AddPending(&negative_step, 4, -1, {2}, 0);
  cases.push_back({"n1", negative_step, absl::StatusCode::kInvalidArgument,
                   "StepReport.pending[0] (tensor 4) has step -1; steps start "
                   "at 0"});
  v1::StepReport negative_wait = Report(1, {});
  AddPending(&negative_wait, 4, 0, {2}, 10);
  AddPending(&negative_wait, 5, 0, {2}, -10);
  cases.push_back({"n1", negative_wait, absl::StatusCode::kInvalidArgument,
                   "StepReport.pending[1] (tensor 5) has waiting_ms -10; it "
                   "must be >= 0"});
  v1::StepReport foreign = Report(1, {});
  AddPending(&foreign, 4, 0, {2, 0}, 10);
  cases.push_back({"n1", foreign, absl::StatusCode::kInvalidArgument,
                   "StepReport.pending[0] (tensor 4) names submitted rank 0, "
                   "which is not one of node \"n1\"'s ranks 2..4"});
  v1::StepReport repeated = Report(1, {});
  // The same rank in two different entries is fine; twice in one is not.
  AddPending(&repeated, 4, 0, {2, 3}, 10);
  AddPending(&repeated, 5, 0, {3, 4, 3}, 10);
  cases.push_back({"n1", repeated, absl::StatusCode::kInvalidArgument,
                   "StepReport.pending[1] (tensor 5) names submitted rank 3 "
                   "twice"});

  for (const Case& c : cases) {
    absl::Status status = steps_.OnReport(c.node, c.report, kT0);
    EXPECT_EQ(status.code(), c.code) << c.message;
    EXPECT_EQ(status.message(), c.message);
  }
}

TEST_F(StepManagerTest, RejectedReportChangesNothing) {
  v1::StepReport good = Report(1, {{2, 1}, {3, 1}, {4, 1}});
  good.mutable_stats()->set_queue_depth(1);
  MustReport("n1", good);
  // Valid ranks first, then a bad pending entry: none of it is applied.
  v1::StepReport bad = Report(1, {{2, 50}, {3, 50}, {4, 50}});
  bad.mutable_stats()->set_queue_depth(99);
  AddPending(&bad, 4, 60, {2, 2}, 60000);
  EXPECT_EQ(steps_.OnReport("n1", bad, kT0).code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobStatus status = StatusWithMembers(kT0 + absl::Minutes(5));
  EXPECT_EQ(status.members(1).ranks(0).completed_step(), 1);
  EXPECT_EQ(status.members(1).queue_depth(), 1);
  EXPECT_THAT(status.stalls(), IsEmpty());
}

TEST(StepManagerScaleTest, FiveThousandNodesConvergeOnTheSlowestRank) {
  constexpr int kNodes = 5000;
  constexpr int kLocal = 8;
  std::vector<NodeSpec> nodes;
  for (int i = 0; i < kNodes; ++i)
    nodes.push_back({absl::StrCat("n", i), kLocal});
  StepManager steps(kThreshold);
  steps.OnGenerationSealed(MakeMembership("big", 1, nodes));
  // Three rounds of reports; node i is i % 3 steps behind in each round.
  for (int64_t round = 1; round <= 3; ++round) {
    for (int i = 0; i < kNodes; ++i) {
      std::vector<std::pair<int32_t, int64_t>> ranks;
      for (int r = 0; r < kLocal; ++r) {
        ranks.emplace_back(i * kLocal + r, round * 10 - i % 3);
      }
      ASSERT_TRUE(steps
                      .OnReport(absl::StrCat("n", i), Report(1, ranks, "big"),
                                kT0 + absl::Seconds(round))
                      .ok());
    }
    EXPECT_EQ(steps.GlobalStep("big"), round * 10 - 2);
  }
  v1::JobStatus status;
  status.add_members()->set_node_name("n2");
  steps.FillStatus("big", kT0 + absl::Seconds(3), TensorName, &status);
  ASSERT_EQ(status.members(0).ranks_size(), kLocal);
  EXPECT_EQ(status.members(0).ranks(0).rank(), 16);
  EXPECT_EQ(status.members(0).ranks(0).lag(), 2);
}

}  // namespace
}  // namespace baton::coordinator
