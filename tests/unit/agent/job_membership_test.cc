// JobMembership on fakes: the coordinator session records what the node
// says (FakeCoordinator), a transport that has no peers makes every data
// plane fail to connect, time is a FakeClock, and the test plays the job
// thread, running what connector threads post. Real JobTrainers with two
// local ranks over streams; the operations' side is the callbacks, recorded.
#include "agent/job_membership.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/gpu_support.h"
#include "agent/job_trainers.h"
#include "agent/transport/memory_key_value_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/recording_sink.h"

namespace baton::agent {
namespace {

using ::testing::HasSubstr;
using State = JobMembership::State;

class FakeCoordinator : public CoordinatorLink {
 public:
  uint64_t Send(v1::AgentMessage message) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back(std::move(message));
    return ++seq_;
  }
  std::chrono::milliseconds liveness_timeout() const override {
    return std::chrono::milliseconds(3000);
  }
  std::chrono::milliseconds report_interval() const override {
    return std::chrono::milliseconds(1000);
  }
  // The messages since the last call, and the seq of the last one sent.
  std::vector<v1::AgentMessage> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(sent_, {});
  }
  uint64_t last_seq() {
    absl::MutexLock lock(&mu_);
    return seq_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::AgentMessage> sent_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
};

// No peer ever answers: every data plane fails to connect, as a node whose
// peers are unreachable does.
class UnreachableTransport : public Transport {
 public:
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> Connect(
      const ConnectRequest&) override {
    return absl::UnavailableError("no peer answered");
  }
  absl::StatusOr<std::unique_ptr<NegotiationWire>> ConnectNegotiation(
      const ConnectRequest&) override {
    return absl::UnavailableError("no peer answered");
  }
};

class JobMembershipTest : public ::testing::Test {
 protected:
  JobMembershipTest() {
    config_.node_name = "n0";
    env_.config = &config_;
    env_.coordinator = &coordinator_;
    env_.transport = &transport_;
    env_.gpus = &gpus_;
    env_.metrics = metrics_.ForJob("job");
    env_.clock = &clock_;
    env_.store_factory = [this](const std::string&, int64_t) { return store_; };
    trainers_ = std::make_unique<JobTrainers>("job", config_, gpus_,
                                              "/baton-job-membership-test.",
                                              /*doorbell=*/nullptr);
    for (int32_t rank = 0; rank < 2; ++rank) {
      v1::AttachRequest attach;
      attach.set_job("job");
      attach.set_local_rank(rank);
      attach.set_local_size(2);
      attach.set_expected_nodes(2);
      EXPECT_TRUE(trainers_->Attach(sinks_[rank], attach, true).ok());
    }
    JobMembership::Callbacks callbacks;
    callbacks.post = [this](std::function<void()> task) {
      absl::MutexLock lock(&mu_);
      posted_.push_back(std::move(task));
    };
    callbacks.end = [this](const absl::Status& status) {
      ended_.push_back(status);
    };
    callbacks.op_done = [](uint64_t, absl::Status) {};
    callbacks.submit_waiting = [] {};
    callbacks.fail_generation = [this](int64_t generation,
                                       const absl::Status& status,
                                       bool only_waiting) {
      failed_.push_back({generation, status, only_waiting});
    };
    callbacks.release_held = [this] { ++released_; };
    callbacks.mismatch = [](int32_t, const absl::Status&) {};
    membership_ = std::make_unique<JobMembership>("job", env_, trainers_.get(),
                                                  std::move(callbacks));
  }
  ~JobMembershipTest() override { membership_->StopDataPlanes(); }

  // Joins and has generation `generation` sealed with this node as node
  // rank 0 of 2.
  void Seal(int64_t generation) {
    membership_->Join();
    const uint64_t join = coordinator_.last_seq();
    v1::CoordinatorMessage accepted;
    accepted.set_reply_to(join);
    accepted.mutable_join_accepted()->set_nodes_joined(2);
    membership_->HandleCoordinatorMessage(accepted);
    v1::CoordinatorMessage sealed;
    v1::Membership* m = sealed.mutable_membership();
    m->set_job("job");
    m->set_generation(generation);
    m->set_num_nodes(2);
    m->set_world_size(4);
    m->set_store_prefix("job/1");
    v1::LocalSizeRun* run = m->add_local_sizes();
    run->set_nodes(2);
    run->set_local_size(2);
    m->mutable_self()->set_node_name("n0");
    m->mutable_self()->set_node_rank(0);
    m->mutable_self()->set_local_size(2);
    membership_->HandleCoordinatorMessage(sealed);
  }

  void Abort(int64_t generation, const std::string& lost) {
    v1::CoordinatorMessage message;
    v1::GenerationAborted* aborted = message.mutable_generation_aborted();
    aborted->set_job("job");
    aborted->set_aborted_generation(generation);
    aborted->set_lost_node(lost);
    membership_->HandleCoordinatorMessage(message);
  }

  // Waits (bounded) for a connector thread to post, and runs it: the job
  // thread's turn.
  void RunPostedTask() {
    std::vector<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      const auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !posted_.empty();
      };
      ASSERT_TRUE(
          mu_.AwaitWithTimeout(absl::Condition(&any), absl::Seconds(60)))
          << "nothing was posted";
      tasks.swap(posted_);
    }
    for (auto& task : tasks) task();
  }

  static bool Has(const std::vector<v1::AgentMessage>& sent,
                  v1::AgentMessage::BodyCase body) {
    for (const v1::AgentMessage& m : sent) {
      if (m.body_case() == body) return true;
    }
    return false;
  }

  struct Failed {
    int64_t generation;
    absl::Status status;
    bool only_waiting;
  };

  AgentConfig config_;
  GpuSupport gpus_;
  AgentMetrics metrics_{absl::Seconds(60)};
  FakeCoordinator coordinator_;
  UnreachableTransport transport_;
  FakeClock clock_;
  std::shared_ptr<KeyValueStore> store_ =
      std::make_shared<MemoryKeyValueStore>();
  JobEnvironment env_;
  std::unique_ptr<JobTrainers> trainers_;
  std::vector<std::shared_ptr<RecordingSink>> sinks_{
      std::make_shared<RecordingSink>(), std::make_shared<RecordingSink>()};
  absl::Mutex mu_;
  std::vector<std::function<void()>> posted_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> ended_;
  std::vector<Failed> failed_;
  int released_ = 0;
  std::unique_ptr<JobMembership> membership_;
};

TEST_F(JobMembershipTest, ASealedGenerationIsAnnouncedToEveryLocalRank) {
  membership_->Join();
  EXPECT_EQ(membership_->state(), State::kJoining);
  auto sent = coordinator_.Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].join().local_size(), 2);
  EXPECT_EQ(sent[0].join().expected_nodes(), 2);
  Seal(1);
  EXPECT_EQ(membership_->state(), State::kRunning);
  EXPECT_EQ(membership_->generation(), 1);
  for (int32_t rank = 0; rank < 2; ++rank) {
    const auto events = sinks_[rank]->Take();
    ASSERT_EQ(events.size(), 1u);
    ASSERT_TRUE(events[0].has_attached());
    EXPECT_EQ(events[0].attached().rank(), rank);
    EXPECT_EQ(events[0].attached().size(), 4);
    EXPECT_EQ(events[0].attached().generation(), 1);
  }
}

TEST_F(JobMembershipTest, AMembershipAddressedToAnotherNodeEndsTheJob) {
  membership_->Join();
  v1::CoordinatorMessage accepted;
  accepted.set_reply_to(coordinator_.last_seq());
  accepted.mutable_join_accepted();
  membership_->HandleCoordinatorMessage(accepted);
  v1::CoordinatorMessage sealed;
  v1::Membership* m = sealed.mutable_membership();
  m->set_generation(1);
  m->set_num_nodes(1);
  m->set_world_size(2);
  m->add_local_sizes()->set_nodes(1);
  m->mutable_local_sizes(0)->set_local_size(2);
  m->mutable_self()->set_node_name("n7");
  m->mutable_self()->set_local_size(2);
  membership_->HandleCoordinatorMessage(sealed);
  ASSERT_EQ(ended_.size(), 1u);
  EXPECT_THAT(ended_[0].message(), HasSubstr("addressed to node \"n7\""));
  EXPECT_NE(membership_->state(), State::kRunning);
}

// The coordinator names the lost node: the operations fail with it, held
// failures are released to name it, and the trainers hear of the abort.
TEST_F(JobMembershipTest, AnAbortNamesTheLostNodeEverywhere) {
  Seal(1);
  sinks_[0]->Take();
  const int released = released_;
  Abort(1, "n1");
  EXPECT_EQ(membership_->state(), State::kReforming);
  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_EQ(failed_[0].generation, 1);
  EXPECT_FALSE(failed_[0].only_waiting);
  EXPECT_THAT(failed_[0].status.message(), HasSubstr("node n1 was lost"));
  EXPECT_GT(released_, released);
  ASSERT_NE(membership_->aborted(1), nullptr);
  EXPECT_THAT(membership_->aborted(1)->message(), HasSubstr("node n1"));
  const auto events = sinks_[0]->Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].generation_aborted().lost_node(), "n1");
  // An abort of another generation changes nothing.
  Abort(7, "n1");
  EXPECT_EQ(failed_.size(), 1u);
}

// A node frozen past the liveness bound wakes up: its rejoin is refused,
// and everything of its old generation fails at once before it joins anew.
TEST_F(JobMembershipTest, ARefusedRejoinAbortsTheOldGenerationAndJoinsAgain) {
  Seal(1);
  coordinator_.Take();
  membership_->HandleSession(/*restarted=*/false);
  auto sent = coordinator_.Take();
  ASSERT_TRUE(Has(sent, v1::AgentMessage::kRejoin));
  v1::CoordinatorMessage refused;
  refused.set_reply_to(coordinator_.last_seq());
  refused.mutable_error()->set_code(
      static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  refused.mutable_error()->set_message("node n0 was declared lost");
  membership_->HandleCoordinatorMessage(refused);
  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_EQ(failed_[0].generation, 1);
  EXPECT_THAT(failed_[0].status.message(),
              HasSubstr("moved on without it (node n0 was declared lost)"));
  EXPECT_EQ(membership_->state(), State::kJoining);
  EXPECT_TRUE(Has(coordinator_.Take(), v1::AgentMessage::kJoin));
}

// The data plane fails on its own (here: it cannot connect) and no lost
// node is named within the grace period: the held failures are reported as
// they are, the generation's operations fail, and the node leaves and joins
// again, which forces a new generation.
TEST_F(JobMembershipTest, AnUnexplainedDataPlaneFailureEndsInANewJoin) {
  Seal(1);
  coordinator_.Take();
  RunPostedTask();  // the connect's failure
  EXPECT_TRUE(membership_->holds_failures());
  ASSERT_TRUE(membership_->failure_deadline().has_value());
  EXPECT_EQ(*membership_->failure_deadline(), clock_.Now() + absl::Seconds(3));
  const int released = released_;
  membership_->OnTimer(clock_.Now() + absl::Seconds(2));
  EXPECT_TRUE(membership_->holds_failures());
  EXPECT_TRUE(failed_.empty());

  clock_.Advance(absl::Seconds(3));
  membership_->OnTimer(clock_.Now());
  EXPECT_FALSE(membership_->holds_failures());
  EXPECT_EQ(released_, released + 1);
  ASSERT_EQ(failed_.size(), 1u);
  EXPECT_THAT(failed_[0].status.message(), HasSubstr("no peer answered"));
  EXPECT_EQ(membership_->state(), State::kJoining);
  const auto sent = coordinator_.Take();
  EXPECT_TRUE(Has(sent, v1::AgentMessage::kLeave));
  EXPECT_TRUE(Has(sent, v1::AgentMessage::kJoin));
}

// A lost node named within the grace period explains the held failures.
TEST_F(JobMembershipTest, ALostNodeNamedInTheGracePeriodExplainsTheFailure) {
  Seal(1);
  RunPostedTask();
  ASSERT_TRUE(membership_->holds_failures());
  const int released = released_;
  Abort(1, "n1");
  EXPECT_FALSE(membership_->holds_failures());
  EXPECT_FALSE(membership_->failure_deadline().has_value());
  EXPECT_EQ(released_, released + 1);
  // The grace period's end changes nothing now.
  clock_.Advance(absl::Seconds(10));
  coordinator_.Take();
  membership_->OnTimer(clock_.Now());
  EXPECT_FALSE(Has(coordinator_.Take(), v1::AgentMessage::kLeave));
  EXPECT_EQ(membership_->state(), State::kReforming);
}

}  // namespace
}  // namespace baton::agent
