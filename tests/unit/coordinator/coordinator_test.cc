// The coordinator's managers working together, driven message by message on
// a FakeClock: membership, generations, liveness, re-forming, recovery,
// leaving and the store, as agents see them on their channels.
#include "coordinator/coordinator.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/coordinator_harness.h"

namespace baton::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

TEST_F(CoordinatorTest, HelloIsAcceptedWithTheLivenessContract) {
  Agent a = Connect("n0");
  auto accepted = a.Received(v1::CoordinatorMessage::kSessionAccepted);
  ASSERT_THAT(accepted, SizeIs(1));
  EXPECT_EQ(accepted[0].reply_to(), 1u);
  EXPECT_EQ(accepted[0].session_accepted().heartbeat_interval_ms(), 2000);
  EXPECT_EQ(accepted[0].session_accepted().liveness_timeout_ms(), 6000);
  EXPECT_FALSE(accepted[0].session_accepted().coordinator_instance().empty());
}

TEST_F(CoordinatorTest, FirstMessageMustBeHello) {
  Agent a;
  a.id = SessionId(99);
  a.channel = std::make_shared<RecordingChannel>();
  coordinator_->OnSessionOpened(a.id, a.channel);
  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat();
  Send(a, heartbeat);
  ASSERT_TRUE(a.channel->closed);
  EXPECT_EQ(a.channel->close_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.channel->close_status.message(), HasSubstr("must be hello"));
}

TEST_F(CoordinatorTest, BadHelloClosesTheSessionNamingTheField) {
  Agent a = Connect("bad node!");
  ASSERT_TRUE(a.channel->closed);
  EXPECT_EQ(a.LastError().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(a.LastError().message(), HasSubstr("Hello.node_name"));
}

// With mutual TLS the certificate says who the agent is: a hello naming
// another node is refused (PERMISSION_DENIED naming both) and its session
// closed; the node the certificate names is accepted, and a refused
// session disturbs nobody else.
TEST_F(CoordinatorTest, HelloMustNameANodeOfTheCertificate) {
  const PeerIdentity n1{/*verified=*/true, {"n1"}};
  Agent genuine = Connect("n1", "", n1);
  EXPECT_FALSE(genuine.channel->closed);
  EXPECT_THAT(genuine.Received(v1::CoordinatorMessage::kSessionAccepted),
              SizeIs(1));
  Join(genuine, "job", 1, 2);

  Agent impostor = Connect("n2", "", n1);
  ASSERT_TRUE(impostor.channel->closed);
  EXPECT_EQ(impostor.LastError().code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(impostor.LastError().message(),
              HasSubstr("this session's certificate names n1, not \"n2\""));
  EXPECT_THAT(impostor.Received(v1::CoordinatorMessage::kSessionAccepted),
              IsEmpty());

  Agent nameless = Connect("n2", "", PeerIdentity{true, {}});
  ASSERT_TRUE(nameless.channel->closed);
  EXPECT_THAT(nameless.LastError().message(), HasSubstr("no node"));

  // The genuine n2 joins, and the job forms with both.
  Agent n2 = Connect("n2", "", PeerIdentity{true, {"n2", "n2.example"}});
  EXPECT_FALSE(n2.channel->closed);
  Join(n2, "job", 1, 2);
  EXPECT_THAT(genuine.Received(v1::CoordinatorMessage::kMembership), SizeIs(1));
  EXPECT_FALSE(genuine.channel->closed);
}

// With mutual TLS the rendezvous store of a generation (which holds its
// data-plane addresses) answers only its members: a caller whose
// certificate names a node outside the job is refused (PERMISSION_DENIED
// naming its names) on set, get and add, and the members go on using it.
TEST_F(CoordinatorTest, StoreAnswersOnlyTheGenerationsMembersWithTls) {
  const PeerIdentity n0{/*verified=*/true, {"n0"}};
  const PeerIdentity n1{/*verified=*/true, {"n1.example", "n1"}};
  const PeerIdentity outsider{/*verified=*/true, {"n9"}};
  Agent a = Connect("n0", "", n0), b = Connect("n1", "", n1);
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);

  v1::StoreSetRequest set;
  set.mutable_scope()->set_job("job");
  set.mutable_scope()->set_generation(1);
  set.set_key("rank0");
  set.set_value("addr");
  absl::Status set_status = absl::UnknownError("not called");
  coordinator_->StoreSet(set, outsider,
                         [&](absl::Status s) { set_status = s; });
  EXPECT_EQ(set_status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(set_status.message(), HasSubstr("its DNS names: n9"));
  coordinator_->StoreSet(set, n0, [&](absl::Status s) { set_status = s; });
  EXPECT_TRUE(set_status.ok()) << set_status;

  v1::StoreGetRequest get;
  *get.mutable_scope() = set.scope();
  get.add_keys("rank0");
  absl::StatusOr<std::vector<std::string>> got = absl::UnknownError("no");
  coordinator_->StoreGet(get, outsider, [&](auto values) { got = values; });
  EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied);
  coordinator_->StoreGet(get, n1, [&](auto values) { got = values; });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::vector<std::string>{"addr"});

  v1::StoreAddRequest add;
  *add.mutable_scope() = set.scope();
  add.set_key("count");
  add.set_delta(1);
  absl::StatusOr<int64_t> sum = absl::UnknownError("no");
  coordinator_->StoreAdd(add, outsider, [&](auto value) { sum = value; });
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kPermissionDenied);
  coordinator_->StoreAdd(add, n1, [&](auto value) { sum = value; });
  EXPECT_EQ(sum.value_or(-1), 1);
  // Without TLS nothing is verified and nothing more is checked.
  coordinator_->StoreAdd(add, PeerIdentity{}, [&](auto value) { sum = value; });
  EXPECT_EQ(sum.value_or(-1), 2);
}

TEST_F(CoordinatorTest, SealsWithHeterogeneousTrainerCounts) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  Join(a, "job", 2, 3);
  Join(b, "job", 1, 3);
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kMembership), SizeIs(0));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_FORMING);
  auto accepted = b.Received(v1::CoordinatorMessage::kJoinAccepted);
  ASSERT_THAT(accepted, SizeIs(1));
  EXPECT_EQ(accepted[0].join_accepted().nodes_joined(), 2);
  EXPECT_EQ(accepted[0].reply_to(), 2u);

  Join(c, "job", 3, 3);
  std::vector<v1::Membership> seen;
  for (Agent* agent : {&a, &b, &c}) {
    auto memberships = agent->Received(v1::CoordinatorMessage::kMembership);
    ASSERT_THAT(memberships, SizeIs(1)) << agent->node;
    seen.push_back(memberships[0].membership());
  }
  const v1::Membership& m = seen[0];
  EXPECT_EQ(m.generation(), 1);
  EXPECT_EQ(m.world_size(), 6);
  EXPECT_EQ(m.num_nodes(), 3);
  EXPECT_EQ(m.store_prefix(), "baton/job/1/");
  ASSERT_EQ(m.nodes_size(), 3);
  EXPECT_EQ(m.nodes(0).node_name(), "n0");
  EXPECT_EQ(m.nodes(0).rank_offset(), 0);
  EXPECT_EQ(m.nodes(1).node_name(), "n1");
  EXPECT_EQ(m.nodes(1).rank_offset(), 2);
  EXPECT_EQ(m.nodes(2).node_name(), "n2");
  EXPECT_EQ(m.nodes(2).rank_offset(), 3);
  EXPECT_EQ(m.nodes(2).data_address(), "n2.example:7000");
  // Local sizes 2, 1, 3: three runs of one node each.
  ASSERT_EQ(m.local_sizes_size(), 3);
  EXPECT_EQ(m.local_sizes(2).local_size(), 3);
  // Each node's view: its own entry; the table only at node ranks 0 and 1.
  for (size_t i = 0; i < seen.size(); ++i) {
    const v1::Membership& view = seen[i];
    EXPECT_EQ(view.self().SerializeAsString(),
              m.nodes(static_cast<int>(i)).SerializeAsString());
    EXPECT_EQ(view.nodes_size(), i < 2 ? 3 : 0);
    v1::Membership shared = view;
    shared.clear_self();
    shared.clear_nodes();
    v1::Membership expected = m;
    expected.clear_self();
    expected.clear_nodes();
    EXPECT_EQ(shared.SerializeAsString(), expected.SerializeAsString());
  }
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.world_size(), 6);
}

// batonrun and torchrun start every node at once with RANK fixed up front
// (GROUP_RANK): the first seal places the nodes by the launcher's node rank,
// whatever order they join in.
TEST_F(CoordinatorTest,
       TheLaunchersNodeRanksPlaceTheNodesWhateverTheJoinOrder) {
  Agent a = Connect("a"), b = Connect("b"), c = Connect("c"), d = Connect("d");
  Join(c, "job", 2, 4, 0, /*node_rank=*/2);
  Join(d, "job", 1, 4, 0, /*node_rank=*/3);
  Join(a, "job", 2, 4, 0, /*node_rank=*/0);
  Join(b, "job", 1, 4, 0, /*node_rank=*/1);
  auto memberships = c.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(1));
  const v1::Membership& m = memberships[0].membership();
  EXPECT_EQ(m.self().node_rank(), 2);
  EXPECT_EQ(m.self().rank_offset(), 3);
  memberships = a.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(1));
  EXPECT_THAT(NodeNames(memberships[0].membership()),
              ElementsAre("a", "b", "c", "d"));
  EXPECT_EQ(memberships[0].membership().nodes(3).rank_offset(), 5);
}

TEST_F(CoordinatorTest, ANodeRankOutOfRangeOrTakenIsRefused) {
  Agent a = Connect("a"), b = Connect("b"), c = Connect("c");
  Join(a, "job", 1, 2, 0, /*node_rank=*/2);
  EXPECT_EQ(a.LastError().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(a.LastError().message(),
              HasSubstr("JoinJob.node_rank is 2 but must be in 0..1"));
  EXPECT_EQ(coordinator_->ListJobs().jobs_size(), 0);
  Join(a, "job", 1, 2, 0, /*node_rank=*/1);
  Join(b, "job", 1, 2, 0, /*node_rank=*/1);
  EXPECT_EQ(b.LastError().code(),
            static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(b.LastError().message(),
              HasSubstr("JoinJob.node_rank 1 from node \"b\" is already "
                        "taken by node \"a\" in job \"job\""));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_FORMING);
  // A node without a rank takes what is left.
  Join(c, "job", 1, 2);
  auto memberships = a.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(1));
  EXPECT_THAT(NodeNames(memberships[0].membership()), ElementsAre("c", "a"));
}

// A node rank is for the run's first seal: a node that joins the running job
// later (a restart, a frozen node back) comes last, and the survivors keep
// their order.
TEST_F(CoordinatorTest, AJoinerOfARunningJobComesLastWhateverRankItGives) {
  Agent a = Connect("a"), b = Connect("b"), c = Connect("c");
  Join(a, "job", 1, 3, 2, /*node_rank=*/0);
  Join(b, "job", 1, 3, 2, /*node_rank=*/1);
  Join(c, "job", 1, 3, 2, /*node_rank=*/2);
  coordinator_->OnSessionClosed(b.id, "crashed");
  Agent back = Connect("b", "i-b-again");
  Join(back, "job", 1, 3, 2, /*node_rank=*/1);
  AdmitJoins(a, "job", 2);
  auto memberships = a.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(3));
  EXPECT_EQ(memberships[2].membership().generation(), 3);
  EXPECT_THAT(NodeNames(memberships[2].membership()),
              ElementsAre("a", "c", "b"));
}

// Node ranks are not used after the first seal, so a re-forming job's
// joiners may give the same one (pods replaced with their old GROUP_RANK).
TEST_F(CoordinatorTest, JoinersOfAReformingJobMayGiveTheSameNodeRank) {
  Agent a = Connect("a"), b = Connect("b"), c = Connect("c");
  Join(a, "job", 1, 3, 0, /*node_rank=*/0);
  Join(b, "job", 1, 3, 0, /*node_rank=*/1);
  Join(c, "job", 1, 3, 0, /*node_rank=*/2);
  coordinator_->OnSessionClosed(b.id, "crashed");
  coordinator_->OnSessionClosed(c.id, "crashed");
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_REFORMING);
  Agent d = Connect("d"), e = Connect("e");
  Join(d, "job", 1, 3, 0, /*node_rank=*/1);
  Join(e, "job", 1, 3, 0, /*node_rank=*/1);
  EXPECT_EQ(e.LastError().code(), 0) << e.LastError().message();
  auto memberships = a.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(2));
  EXPECT_THAT(NodeNames(memberships[1].membership()),
              ElementsAre("a", "d", "e"));
}

TEST_F(CoordinatorTest, DuplicateNodeNameIsRejected) {
  Agent a = Connect("n0", "first"), dup = Connect("n0", "second");
  Join(a, "job", 1, 2);
  Join(dup, "job", 1, 2);
  EXPECT_EQ(dup.LastError().code(),
            static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(dup.LastError().message(),
              HasSubstr("node name \"n0\" is already a member of job \"job\""));
  EXPECT_EQ(Status("job").members_size(), 1);
}

TEST_F(CoordinatorTest, JoinToSealedFullJobIsRefused) {
  Agent a = Connect("n0"), b = Connect("n1"), late = Connect("n2");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  Join(late, "job", 1, 2);
  EXPECT_EQ(late.LastError().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(late.LastError().message(), HasSubstr("sealed and full"));
  EXPECT_EQ(Status("job").generation(), 1);
}

TEST_F(CoordinatorTest, JoinsMustAgreeOnTheJobsSize) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 3);
  EXPECT_EQ(b.LastError().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(b.LastError().message(),
              HasSubstr("JoinJob.expected_nodes is 3 from node \"n1\" but job "
                        "\"job\" has expected_nodes=2 (set by node \"n0\")"));
}

TEST_F(CoordinatorTest, BadJoinFieldsAreNamed) {
  Agent a = Connect("n0");
  struct Case {
    std::function<void(v1::JoinJob*)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](v1::JoinJob* j) { j->set_job(""); }, "JoinJob.job is empty"},
      {[](v1::JoinJob* j) { j->set_job(std::string(200, 'x')); },
       "JoinJob.job is 200 characters long"},
      {[](v1::JoinJob* j) { j->set_data_address("nohost"); },
       "JoinJob.data_address"},
      {[](v1::JoinJob* j) { j->set_local_size(0); }, "JoinJob.local_size is 0"},
      {[](v1::JoinJob* j) { j->set_expected_nodes(-3); },
       "JoinJob.expected_nodes is -3"},
      {[](v1::JoinJob* j) { j->set_min_nodes(5); }, "JoinJob.min_nodes is 5"},
      {[](v1::JoinJob* j) { j->set_partition_bytes(1001); },
       "JoinJob.partition_bytes is 1001"},
  };
  for (const Case& c : cases) {
    v1::AgentMessage message;
    auto* join = message.mutable_join();
    join->set_job("job");
    join->set_data_address("10.0.0.1:7000");
    join->set_local_size(1);
    join->set_expected_nodes(2);
    c.edit(join);
    Send(a, message);
    EXPECT_EQ(a.LastError().code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(a.LastError().message(), HasSubstr(c.field));
  }
  EXPECT_EQ(coordinator_->ListJobs().jobs_size(), 0);
}

TEST_F(CoordinatorTest, SilentNodeIsLostWithinTheBoundAndSurvivorsAreTold) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3);
  const absl::Duration took = RunUntil(
      {&a, &b},
      [&] {
        return !a.Received(v1::CoordinatorMessage::kGenerationAborted).empty();
      },
      absl::Seconds(30));
  EXPECT_LE(took, options_.liveness_timeout + options_.tick_interval);
  EXPECT_GT(took, options_.liveness_timeout - absl::Seconds(1));
  for (Agent* survivor : {&a, &b}) {
    auto notices =
        survivor->Received(v1::CoordinatorMessage::kGenerationAborted);
    ASSERT_THAT(notices, SizeIs(1));
    const v1::GenerationAborted& notice = notices[0].generation_aborted();
    EXPECT_EQ(notice.lost_node(), "n2");
    EXPECT_EQ(notice.aborted_generation(), 1);
    EXPECT_EQ(notice.new_generation(), 2);
    EXPECT_THAT(notice.reason(),
                HasSubstr("node n2 missed its liveness deadline"));
  }
  EXPECT_TRUE(c.channel->closed);
  EXPECT_EQ(c.channel->close_status.code(),
            absl::StatusCode::kDeadlineExceeded);
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_REFORMING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_THAT(status.state_reason(), HasSubstr("node n2 missed"));
  EXPECT_EQ(status.events().rbegin()[1].kind(), "lost");
}

TEST_F(CoordinatorTest, ClosedSessionIsLostAtOnceAndReplacementReseals) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 2, 2);
  Join(b, "job", 2, 2);
  coordinator_->OnSessionClosed(b.id, "the agent closed its stream");
  auto notices = a.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(1));
  EXPECT_THAT(notices[0].generation_aborted().reason(),
              HasSubstr("node n1 lost its session to the coordinator (the "
                        "agent closed its stream)"));

  Agent replacement = Connect("n9");
  Join(replacement, "job", 2, 2);
  auto memberships = a.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(2));
  const v1::Membership& m = memberships[1].membership();
  EXPECT_EQ(m.generation(), 2);
  EXPECT_THAT(NodeNames(m), ElementsAre("n0", "n9"));
  EXPECT_EQ(m.store_prefix(), "baton/job/2/");
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, MinNodesResealsWithTheSurvivorsAndGrowsBack) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, /*min_nodes=*/2);
  coordinator_->OnSessionClosed(a.id, "crashed");
  auto memberships = b.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(2));
  EXPECT_EQ(memberships[1].membership().generation(), 2);
  EXPECT_EQ(memberships[1].membership().world_size(), 2);
  EXPECT_EQ(memberships[1].membership().nodes(0).node_name(), "n1");

  // A node joining the running generation waits for the members' next
  // commit: they hear of it, and nothing is aborted yet.
  Agent d = Connect("n3");
  Join(d, "job", 1, 3, 2);
  auto pending = b.Received(v1::CoordinatorMessage::kJoinPending);
  ASSERT_THAT(pending, SizeIs(1));
  EXPECT_EQ(pending[0].join_pending().generation(), 2);
  EXPECT_THAT(pending[0].join_pending().nodes(), ElementsAre("n3"));
  EXPECT_THAT(b.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(1));
  EXPECT_THAT(d.Received(v1::CoordinatorMessage::kMembership), IsEmpty());
  // A stale generation's commit admits no one; the running one's does.
  AdmitJoins(c, "job", 1);
  EXPECT_THAT(b.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(1));
  AdmitJoins(c, "job", 2);
  auto notices = b.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(2));
  EXPECT_THAT(notices[1].generation_aborted().reason(),
              AllOf(HasSubstr("node n3 joins the running job"),
                    HasSubstr("node n2's trainers reached a commit")));
  // A second commit of the same generation changes nothing.
  AdmitJoins(b, "job", 2);
  EXPECT_THAT(b.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(2));
  memberships = d.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(1));
  EXPECT_EQ(memberships[0].membership().generation(), 3);
  EXPECT_EQ(memberships[0].membership().world_size(), 3);
  EXPECT_EQ(memberships[0].membership().self().node_name(), "n3");
  EXPECT_EQ(memberships[0].membership().self().node_rank(), 2);
}

TEST_F(CoordinatorTest, ANodeBackFromARunThatEndedHearsHowItEnded) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  coordinator_->OnSessionClosed(b.id, "crashed");
  // n0's own session drops while the job re-forms: every node is lost.
  coordinator_->OnSessionClosed(a.id, "network blip");
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_FAILED);
  // Its agent reconnects and joins again from generation 1: the run it was
  // in has failed, and it hears so instead of starting a new run alone.
  Agent back = Connect("n0");
  v1::AgentMessage message;
  auto* join = message.mutable_join();
  join->set_job("job");
  join->set_data_address("n0.example:7000");
  join->set_local_size(1);
  join->set_expected_nodes(2);
  join->set_last_generation(1);
  Send(back, message);
  auto ended = back.Received(v1::CoordinatorMessage::kJobEnded);
  ASSERT_THAT(ended, SizeIs(1));
  EXPECT_EQ(ended[0].job_ended().state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(ended[0].job_ended().reason(), HasSubstr("every node was lost"));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_FAILED);
  // A join of a new run (no last generation) starts it, as before.
  Join(back, "job", 1, 2);
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_FORMING);
}

TEST_F(CoordinatorTest, AJoinNoCommitAdmitsIsAdmittedAfterTheJoinWait) {
  auto [a, b, d] = StartWaitingJoin();
  ASSERT_THAT(a.Received(v1::CoordinatorMessage::kJoinPending), SizeIs(1));
  // Trainers that never commit (not elastic): the coordinator admits the
  // node itself once --join_wait_ms passed.
  const absl::Duration took = RunUntil(
      {&a, &b, &d},
      [&] { return !d.Received(v1::CoordinatorMessage::kMembership).empty(); },
      absl::Minutes(2));
  EXPECT_GE(took, options_.join_wait);
  EXPECT_LE(took, options_.join_wait + 2 * options_.tick_interval);
  auto notices = a.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(2));
  EXPECT_THAT(notices[1].generation_aborted().reason(),
              HasSubstr("no member reached a commit within 30.0 s"));
  EXPECT_EQ(Status("job").members_size(), 3);
}

TEST_F(CoordinatorTest, AWaitingJoinThatGivesUpIsForgotten) {
  auto [a, b, d] = StartWaitingJoin();
  coordinator_->OnSessionClosed(d.id, "crashed");
  // The commit that asked still ends the generation (its trainer stopped
  // there and waits for the next), with the members it had.
  AdmitJoins(a, "job", 2);
  auto notices = a.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(2));
  EXPECT_THAT(notices[1].generation_aborted().reason(),
              HasSubstr("the nodes that waited to join are gone"));
  auto memberships = a.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(3));
  EXPECT_EQ(memberships[2].membership().world_size(), 2);
}

TEST_F(CoordinatorTest, NodesLostTogetherCostOneAbortAndOneReseal) {
  std::vector<Agent> agents;
  for (int i = 0; i < 10; ++i) agents.push_back(Connect(absl::StrCat("n", i)));
  for (Agent& agent : agents) Join(agent, "job", 1, 10, /*min_nodes=*/2);
  std::vector<Agent*> alive;
  for (int i = 0; i < 5; ++i) alive.push_back(&agents[i]);
  RunUntil(
      alive,
      [&] {
        return agents[0].Received(v1::CoordinatorMessage::kMembership).size() >
               1;
      },
      absl::Seconds(30));
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(agents[i].Received(v1::CoordinatorMessage::kGenerationAborted),
                SizeIs(1));
    auto memberships = agents[i].Received(v1::CoordinatorMessage::kMembership);
    ASSERT_THAT(memberships, SizeIs(2));
    EXPECT_EQ(memberships[1].membership().generation(), 2);
    EXPECT_EQ(memberships[1].membership().world_size(), 5);
  }
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.generation(), 2);
  int lost = 0;
  for (const v1::JobEvent& event : status.events())
    lost += event.kind() == "lost";
  EXPECT_EQ(lost, 5);
}

TEST_F(CoordinatorTest, StalledCoordinatorRestartsDeadlinesInsteadOfLosingAll) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  coordinator_->Tick();
  // The coordinator did not run for 20 s (say it was stopped): the agents'
  // heartbeats wait unread, so nobody is lost for it.
  clock_.Advance(absl::Seconds(20));
  coordinator_->Tick();
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(0));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
  // Deadlines restarted: a node that stays silent is still lost in time.
  RunUntil(
      {&a},
      [&] {
        return !a.Received(v1::CoordinatorMessage::kGenerationAborted).empty();
      },
      options_.liveness_timeout + options_.tick_interval);
  auto notices = a.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(1));
  EXPECT_EQ(notices[0].generation_aborted().lost_node(), "n1");
}

TEST_F(CoordinatorTest, JobFailsWhenNotWholeAgainInTime) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  coordinator_->OnSessionClosed(b.id, "crashed");
  RunUntil(
      {&a},
      [&] { return !a.Received(v1::CoordinatorMessage::kJobEnded).empty(); },
      options_.reform_timeout + absl::Seconds(1));
  auto ended = a.Received(v1::CoordinatorMessage::kJobEnded);
  ASSERT_THAT(ended, SizeIs(1));
  EXPECT_EQ(ended[0].job_ended().state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(ended[0].job_ended().reason(),
              HasSubstr("not whole again within 60.0 s (have 1 of the 2 nodes "
                        "needed) after: node n1 lost its session"));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_FAILED);

  // Retention: the failed job stays visible, then is forgotten.
  clock_.Advance(options_.job_retention);
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->GetJob("job").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, MessagesForAnOldGenerationAreAborted) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, 2);
  coordinator_->OnSessionClosed(c.id, "crashed");  // Re-sealed as generation 2.
  v1::AgentMessage report;
  report.mutable_step_report()->set_job("job");
  report.mutable_step_report()->set_generation(1);
  Send(a, report);
  EXPECT_EQ(a.LastError().code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(a.LastError().message(),
              HasSubstr("job \"job\" is at generation 2; this message is for "
                        "generation 1"));
  EXPECT_EQ(a.LastError().generation(), 1);

  report.mutable_step_report()->set_generation(7);
  Send(a, report);
  EXPECT_EQ(a.LastError().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  report.mutable_step_report()->set_job("nope");
  Send(a, report);
  EXPECT_EQ(a.LastError().code(),
            static_cast<int>(absl::StatusCode::kNotFound));
}

TEST_F(CoordinatorTest, ReconnectOfTheSameAgentKeepsItsMembership) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  Agent b2 = Connect("n1");  // Same instance: the agent reconnected.
  EXPECT_TRUE(b.channel->closed);
  EXPECT_EQ(b.channel->close_status.code(), absl::StatusCode::kAborted);
  coordinator_->OnSessionClosed(b.id, "replaced");
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(0));
  // Liveness now follows the new session.
  RunUntil(
      {&a, &b2}, [] { return false; }, absl::Seconds(10));
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(0));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
}

// The agent's re-report of the job it runs: its own view of `job`.
v1::AgentMessage RejoinWith(const v1::Membership& view, int32_t expected_nodes,
                            int64_t completed_step = 0) {
  v1::AgentMessage message;
  auto* rejoin = message.mutable_rejoin();
  *rejoin->mutable_membership() = view;
  rejoin->set_completed_step(completed_step);
  rejoin->set_expected_nodes(expected_nodes);
  return message;
}

TEST_F(CoordinatorTest, RestartRebuildsTheJobFromRejoiningAgents) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  Join(a, "job", 2, 3);
  Join(b, "job", 1, 3);
  Join(c, "job", 1, 3);
  std::vector<v1::Membership> views;
  for (Agent* agent : {&a, &b, &c}) {
    views.push_back(
        agent->Received(v1::CoordinatorMessage::kMembership)[0].membership());
  }

  Restart();
  a = Connect("n0");
  b = Connect("n1");
  c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) {
    Send(*agent, RejoinWith(views[agent == &a   ? 0
                                  : agent == &b ? 1
                                                : 2],
                            3, 41));
    auto accepted = agent->Received(v1::CoordinatorMessage::kJoinAccepted);
    ASSERT_THAT(accepted, SizeIs(1)) << agent->LastError().message();
    EXPECT_EQ(accepted[0].join_accepted().state(), v1::JOB_STATE_RUNNING);
  }
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 1);
  EXPECT_EQ(status.world_size(), 4);
  EXPECT_EQ(status.global_step(), 41);
  for (const v1::MemberStatus& member : status.members()) {
    EXPECT_TRUE(member.connected()) << member.node_name();
  }
  EXPECT_EQ(status.events(0).kind(), "recovered");
  // No generation change, no abort: the job did not notice.
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(0));

  // The store works again for the recovered generation.
  v1::StoreSetRequest set;
  set.mutable_scope()->set_job("job");
  set.mutable_scope()->set_generation(1);
  set.set_key("k");
  absl::Status set_status = absl::UnknownError("not called");
  coordinator_->StoreSet(set, {}, [&](absl::Status s) { set_status = s; });
  EXPECT_TRUE(set_status.ok()) << set_status;
}

// A coordinator stopped (SIGSTOP, a stalled VM) for longer than the agents'
// keepalive: every agent gave up on its session and reconnects, and the
// sessions' ends come in as the coordinator wakes. Before, each counted as a
// lost node: the job re-formed three times and failed with "every node was
// lost" while training went on. Now they cost no generation: each node
// re-reports its generation on its new session; one that does not is lost at
// the liveness timeout.
TEST_F(CoordinatorTest,
       SessionsThatEndedWhileTheCoordinatorStalledCostNoGeneration) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, /*min_nodes=*/2);
  std::vector<v1::Membership> views;
  for (Agent* agent : {&a, &b, &c}) {
    views.push_back(
        agent->Received(v1::CoordinatorMessage::kMembership)[0].membership());
  }
  coordinator_->Tick();
  clock_.Advance(absl::Seconds(15));
  // One end before the first tick after the stall, two after it.
  coordinator_->OnSessionClosed(a.id, "the stream was cancelled");
  coordinator_->Tick();
  coordinator_->OnSessionClosed(b.id, "the stream was cancelled");
  coordinator_->OnSessionClosed(c.id, "the stream was cancelled");
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status("job").generation(), 1);

  Agent a2 = Connect("n0"), b2 = Connect("n1"), c2 = Connect("n2");
  Send(a2, RejoinWith(views[0], 3, 7));
  Send(b2, RejoinWith(views[1], 3, 7));
  for (Agent* agent : {&a2, &b2}) {
    ASSERT_THAT(agent->Received(v1::CoordinatorMessage::kJoinAccepted),
                SizeIs(1))
        << agent->LastError().message();
  }
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.generation(), 1);
  EXPECT_TRUE(status.members(0).connected());
  EXPECT_FALSE(status.members(2).connected());
  EXPECT_THAT(a2.Received(v1::CoordinatorMessage::kGenerationAborted),
              IsEmpty());

  // n2's agent never re-reports: lost at the deadline, naming why.
  RunUntil(
      {&a2, &b2},
      [&] {
        return !a2.Received(v1::CoordinatorMessage::kGenerationAborted).empty();
      },
      options_.liveness_timeout + 2 * options_.tick_interval);
  auto notices = a2.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(1));
  EXPECT_EQ(notices[0].generation_aborted().lost_node(), "n2");
  EXPECT_THAT(notices[0].generation_aborted().reason(),
              HasSubstr("did not reconnect within 6.0 s after its session "
                        "ended while the coordinator was stalled"));
}

// Without a stall a closed session is a lost node at once, as before.
TEST_F(CoordinatorTest, ASessionThatEndsWhileTheCoordinatorRunsIsALostNode) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  coordinator_->Tick();
  clock_.Advance(options_.tick_interval);
  coordinator_->Tick();
  coordinator_->OnSessionClosed(b.id, "the stream was cancelled");
  EXPECT_EQ(Status("job").generation(), 2);
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(1));
}

// Node rank 2 holds only its own entry: its re-report waits until node rank
// 0 or 1 rebuilt the job from the table, then it is accepted like theirs.
TEST_F(CoordinatorTest, ARejoinWithoutTheTableWaitsForNodeRankZeroOrOne) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3);
  const v1::Membership keeper =
      b.Received(v1::CoordinatorMessage::kMembership)[0].membership();
  const v1::Membership view =
      c.Received(v1::CoordinatorMessage::kMembership)[0].membership();
  ASSERT_EQ(view.nodes_size(), 0);

  Restart();
  b = Connect("n1");
  c = Connect("n2");
  Send(c, RejoinWith(view, 3, 7));
  EXPECT_THAT(c.Received(v1::CoordinatorMessage::kJoinAccepted), IsEmpty());
  EXPECT_THAT(c.Received(v1::CoordinatorMessage::kError), IsEmpty());
  EXPECT_FALSE(coordinator_->GetJob("job").ok());

  Send(b, RejoinWith(keeper, 3, 7));
  for (Agent* agent : {&b, &c}) {
    auto accepted = agent->Received(v1::CoordinatorMessage::kJoinAccepted);
    ASSERT_THAT(accepted, SizeIs(1)) << agent->LastError().message();
    EXPECT_EQ(accepted[0].join_accepted().state(), v1::JOB_STATE_RUNNING);
  }
  const v1::JobStatus status = Status("job");
  EXPECT_EQ(status.generation(), 1);
  ASSERT_EQ(status.members_size(), 3);
  EXPECT_TRUE(status.members(2).connected());
  // n0 never reported: it is lost after the liveness timeout, as before.
  RunUntil(
      {&b, &c},
      [&] {
        return !b.Received(v1::CoordinatorMessage::kGenerationAborted).empty();
      },
      absl::Seconds(30));
  EXPECT_EQ(b.Received(v1::CoordinatorMessage::kGenerationAborted)[0]
                .generation_aborted()
                .lost_node(),
            "n0");
}

// With neither node rank 0 nor 1 back, nothing can rebuild the generation:
// the waiting node is told to join again, within the liveness timeout.
TEST_F(CoordinatorTest, AParkedRejoinIsToldToJoinAgainWithoutATableHolder) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3);
  const v1::Membership view =
      c.Received(v1::CoordinatorMessage::kMembership)[0].membership();
  Restart();
  c = Connect("n2");
  Send(c, RejoinWith(view, 3));
  const absl::Duration took = RunUntil(
      {&c}, [&] { return !c.Received(v1::CoordinatorMessage::kError).empty(); },
      absl::Seconds(30));
  EXPECT_LE(took, options_.liveness_timeout + options_.tick_interval);
  const v1::Error error = c.LastError();
  EXPECT_EQ(error.code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(error.message(),
              HasSubstr("neither node rank 0 nor 1 of job \"job\" generation "
                        "1 re-reported"));
  EXPECT_THAT(error.message(), HasSubstr("join again"));
  // Joining again forms the name's next run.
  Join(c, "job", 1, 1);
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
}

// A re-report is checked against the agent's own entry: one naming another
// node is refused at once.
TEST_F(CoordinatorTest, ARejoinMustBeAddressedToTheReportingNode) {
  Agent a = Connect("n0"), b = Connect("n1");
  for (Agent* agent : {&a, &b}) Join(*agent, "job", 1, 2);
  const v1::Membership view =
      a.Received(v1::CoordinatorMessage::kMembership)[0].membership();
  Restart();
  b = Connect("n1");
  Send(b, RejoinWith(view, 2));
  EXPECT_THAT(b.LastError().message(),
              HasSubstr("RejoinJob.membership.self names node \"n0\", not "
                        "this agent's node \"n1\""));
}

// Found by coordinator_fuzz: a restarted coordinator forgets a job name's
// last generation, so a new run of the name counts from 1 again. Node n0
// ran "job" generation 1 and missed its end across a restart; n1 ran a
// later "job", generation 1 too. After the next restart the later seal is
// the live run, whichever node reports first: n0 hears that its run ended,
// and n1 keeps training.
TEST_F(CoordinatorTest, RecoveryKeepsTheLaterRunOfAJobName) {
  for (const bool stale_first : {true, false}) {
    SCOPED_TRACE(stale_first ? "the stale run reports first"
                             : "the live run reports first");
    Restart();
    Agent old_a = Connect("n0");
    Join(old_a, "job", 1, 1);
    const v1::Membership stale =
        old_a.Received(v1::CoordinatorMessage::kMembership)[0].membership();
    Restart();  // n0 never reports again to this coordinator.
    clock_.Advance(absl::Seconds(5));
    Agent new_b = Connect("n1");
    Join(new_b, "job", 1, 1);
    const v1::Membership live =
        new_b.Received(v1::CoordinatorMessage::kMembership)[0].membership();
    ASSERT_EQ(live.generation(), stale.generation());
    ASSERT_GT(live.sealed_unix_ms(), stale.sealed_unix_ms());
    Restart();

    Agent a = Connect("n0"), b = Connect("n1");
    const auto rejoin = [&](Agent& agent, const v1::Membership& membership) {
      v1::AgentMessage message;
      *message.mutable_rejoin()->mutable_membership() = membership;
      message.mutable_rejoin()->set_expected_nodes(1);
      Send(agent, message);
    };
    if (stale_first) {
      rejoin(a, stale);
      rejoin(b, live);
      const auto ended = a.Received(v1::CoordinatorMessage::kJobEnded);
      ASSERT_THAT(ended, SizeIs(1));
      EXPECT_THAT(ended[0].job_ended().reason(),
                  HasSubstr("ended before the coordinator restarted"));
    } else {
      rejoin(b, live);
      rejoin(a, stale);
      EXPECT_THAT(a.LastError().message(),
                  HasSubstr("another data-plane secret"));
    }
    EXPECT_THAT(b.Received(v1::CoordinatorMessage::kJobEnded), IsEmpty());
    const v1::JobStatus status = Status("job");
    EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(status.generation(), 1);
    ASSERT_EQ(status.members_size(), 1);
    EXPECT_EQ(status.members(0).node_name(), "n1");
    EXPECT_TRUE(status.members(0).connected());
  }
}

TEST_F(CoordinatorTest, MemberThatNeverRejoinsAfterRestartIsLost) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  const v1::Membership sealed =
      a.Received(v1::CoordinatorMessage::kMembership)[0].membership();
  Restart();
  a = Connect("n0");
  v1::AgentMessage message;
  *message.mutable_rejoin()->mutable_membership() = sealed;
  message.mutable_rejoin()->set_expected_nodes(2);
  Send(a, message);
  const absl::Duration took = RunUntil(
      {&a},
      [&] {
        return !a.Received(v1::CoordinatorMessage::kGenerationAborted).empty();
      },
      absl::Seconds(30));
  EXPECT_LE(took, options_.liveness_timeout + options_.tick_interval);
  auto notices = a.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(1));
  EXPECT_EQ(notices[0].generation_aborted().lost_node(), "n1");
  EXPECT_THAT(notices[0].generation_aborted().reason(),
              HasSubstr("did not reconnect within 6.0 s"));
}

TEST_F(CoordinatorTest, RejoinWithAStaleGenerationIsAborted) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, 2);
  const v1::Membership first =
      a.Received(v1::CoordinatorMessage::kMembership)[0].membership();
  coordinator_->OnSessionClosed(c.id, "crashed");
  v1::AgentMessage message;
  *message.mutable_rejoin()->mutable_membership() = first;
  message.mutable_rejoin()->set_expected_nodes(3);
  message.mutable_rejoin()->set_min_nodes(2);
  Send(a, message);
  EXPECT_EQ(a.LastError().code(), static_cast<int>(absl::StatusCode::kAborted));
}

TEST_F(CoordinatorTest, JobFinishesWhenEveryNodeLeavesFinished) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  Leave(a, "job", 1);
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
  // The other node's agent exits without leaving: still a clean finish.
  coordinator_->OnSessionClosed(b.id, "the agent closed its stream");
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_FINISHED);
  EXPECT_THAT(status.state_reason(), HasSubstr("training finished"));
}

// shutdown() then init() on every trainer, the nodes at different times:
// the node that finished first joins again while the other still runs the
// run. Its join waits for the run's end instead of joining the run that
// is finishing (which answered it with the old membership).
TEST_F(CoordinatorTest, AFinishedNodeJoinsTheNamesNextRunOnceTheRunEnded) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 2, 2);
  Join(b, "job", 2, 2);
  Leave(a, "job", 1);
  Join(a, "job", 2, 2);
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kJoinAccepted), SizeIs(1));
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kMembership), SizeIs(1));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);

  Leave(b, "job", 1);
  // The run finished; n0's held join started the next one.
  v1::JobStatus status = Status("job");
  EXPECT_EQ(status.state(), v1::JOB_STATE_FORMING);
  ASSERT_THAT(a.Received(v1::CoordinatorMessage::kJoinAccepted), SizeIs(2));
  Join(b, "job", 2, 2);
  auto memberships = b.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(2));
  const v1::Membership& next = memberships[1].membership();
  EXPECT_EQ(next.generation(), 2);
  // Each node keeps its rank although n1 joined the next run last.
  EXPECT_THAT(NodeNames(next), ElementsAre("n0", "n1"));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
}

// A node whose trainer was restarted leaves the generation and joins again:
// it gets its rank back instead of the last one.
TEST_F(CoordinatorTest, ANodeThatLeftAndJoinsAgainKeepsItsRank) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 2, 2);
  Join(b, "job", 2, 2);
  Leave(a, "job", 1, "trainer local rank 1 disconnected");
  auto notices = b.Received(v1::CoordinatorMessage::kGenerationAborted);
  ASSERT_THAT(notices, SizeIs(1));
  EXPECT_THAT(notices[0].generation_aborted().reason(),
              HasSubstr("trainer local rank 1 disconnected"));
  Join(a, "job", 2, 2);
  auto memberships = b.Received(v1::CoordinatorMessage::kMembership);
  ASSERT_THAT(memberships, SizeIs(2));
  const v1::Membership& m = memberships[1].membership();
  EXPECT_EQ(m.generation(), 2);
  ASSERT_THAT(NodeNames(m), ElementsAre("n0", "n1"));
  EXPECT_EQ(m.nodes(0).rank_offset(), 0);
  EXPECT_EQ(m.nodes(1).rank_offset(), 2);
}

TEST_F(CoordinatorTest, TwoJobsAreIsolated) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n0-other");
  Join(a, "alpha", 1, 2);
  Join(b, "alpha", 1, 2);
  Join(c, "beta", 4, 1);
  coordinator_->OnSessionClosed(b.id, "crashed");
  EXPECT_EQ(Status("alpha").state(), v1::JOB_STATE_REFORMING);
  EXPECT_EQ(Status("beta").state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status("beta").generation(), 1);
  EXPECT_THAT(c.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(0));
  EXPECT_EQ(coordinator_->ListJobs().jobs_size(), 2);
}

TEST_F(CoordinatorTest, StoreWaitIsWokenBySetAndAbortedByGenerationChange) {
  Agent a = Connect("n0"), b = Connect("n1"), c = Connect("n2");
  for (Agent* agent : {&a, &b, &c}) Join(*agent, "job", 1, 3, 2);
  v1::StoreGetRequest get;
  get.mutable_scope()->set_job("job");
  get.mutable_scope()->set_generation(1);
  get.add_keys("rank0");
  get.set_wait_timeout_ms(5000);
  absl::StatusOr<std::vector<std::string>> got = absl::UnknownError("waiting");
  coordinator_->StoreGet(get, {},
                         [&](auto values) { got = std::move(values); });
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnknown);
  v1::StoreSetRequest set;
  *set.mutable_scope() = get.scope();
  set.set_key("rank0");
  set.set_value("addr");
  coordinator_->StoreSet(set, {}, [](absl::Status) {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::vector<std::string>{"addr"});

  get.set_keys(0, "rank1");
  got = absl::UnknownError("waiting");
  coordinator_->StoreGet(get, {},
                         [&](auto values) { got = std::move(values); });
  coordinator_->OnSessionClosed(c.id, "crashed");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(got.status().message(), HasSubstr("node n2"));
}

TEST_F(CoordinatorTest, ShutdownTellsEveryAgentWithoutLosingNodes) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  coordinator_->Shutdown("going away");
  for (Agent* agent : {&a, &b}) {
    auto shutdown = agent->Received(v1::CoordinatorMessage::kShutdown);
    ASSERT_THAT(shutdown, SizeIs(1));
    EXPECT_EQ(shutdown[0].shutdown().reason(), "going away");
    EXPECT_TRUE(agent->channel->closed);
    EXPECT_EQ(agent->channel->close_status.code(),
              absl::StatusCode::kUnavailable);
  }
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kGenerationAborted),
              SizeIs(0));
  EXPECT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
}

}  // namespace
}  // namespace baton::coordinator
