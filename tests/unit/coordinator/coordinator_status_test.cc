// The status API's aggregating calls on a FakeClock: GetTensors (the plan
// with the members' latencies) and GetTimeline (asked of every member,
// merged, finished by the answers or by the deadline).
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/coordinator_harness.h"

namespace baton::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

v1::TensorSpec Spec(const std::string& name, int64_t elements) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(v1::DATA_TYPE_FLOAT32);
  spec.set_op(v1::COLLECTIVE_OP_PUSH_PULL);
  spec.add_shape(elements);
  return spec;
}

v1::PartitionTrace Trace(const std::string& tensor, int64_t step,
                         uint64_t seq) {
  v1::PartitionTrace trace;
  trace.set_tensor(tensor);
  trace.set_step(step);
  trace.set_launch_seq(seq);
  trace.set_generation(1);
  return trace;
}

class CoordinatorStatusTest : public CoordinatorTest {
 protected:
  // Two nodes, one trainer each, running job "job".
  void SetUp() override {
    a_ = Connect("n0");
    b_ = Connect("n1");
    Join(a_, "job", 1, 2);
    Join(b_, "job", 1, 2);
    ASSERT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
  }

  void Declare(Agent& agent, const std::vector<v1::TensorSpec>& specs) {
    v1::AgentMessage message;
    message.mutable_manifest()->set_job("job");
    message.mutable_manifest()->set_generation(1);
    for (const v1::TensorSpec& spec : specs) {
      *message.mutable_manifest()->add_tensors() = spec;
    }
    Send(agent, message);
  }

  void Reply(Agent& agent, uint64_t request_id,
             const std::vector<v1::PartitionTrace>& traces,
             bool truncated = false) {
    v1::AgentMessage message;
    v1::TimelineReply* reply = message.mutable_timeline_reply();
    reply->set_request_id(request_id);
    reply->set_job("job");
    reply->set_truncated(truncated);
    for (const v1::PartitionTrace& t : traces) *reply->add_partitions() = t;
    Send(agent, message);
  }

  // Starts GetTimeline; the result lands in `result_` when it finishes.
  void AskTimeline(int64_t first, int64_t last) {
    v1::GetTimelineRequest request;
    request.set_job("job");
    request.set_first_step(first);
    request.set_last_step(last);
    finished_ = false;
    coordinator_->GetTimeline(request,
                              [this](absl::StatusOr<v1::Timeline> timeline) {
                                EXPECT_FALSE(finished_) << "finished twice";
                                finished_ = true;
                                result_ = std::move(timeline);
                              });
  }

  uint64_t RequestIdSentTo(const Agent& agent) {
    auto asked = agent.Received(v1::CoordinatorMessage::kTimelineRequest);
    EXPECT_THAT(asked, SizeIs(1)) << agent.node;
    return asked.empty() ? 0 : asked.back().timeline_request().request_id();
  }

  Agent a_, b_;
  bool finished_ = false;
  absl::StatusOr<v1::Timeline> result_ = absl::UnknownError("not run");
};

TEST_F(CoordinatorStatusTest, TensorsListThePlanWithTheMembersLatencies) {
  Declare(a_, {Spec("w", 1024), Spec("b", 4)});
  Declare(b_, {Spec("w", 1024), Spec("b", 4)});
  for (Agent* agent : {&a_, &b_}) {
    v1::AgentMessage message;
    v1::StepReport* report = message.mutable_step_report();
    report->set_job("job");
    report->set_generation(1);
    v1::TensorLatency* l = report->mutable_stats()->add_tensor_latencies();
    l->set_tensor_id(0);
    l->set_count(agent == &a_ ? 3 : 1);
    l->set_mean_us(agent == &a_ ? 100 : 500);
    l->set_max_us(agent == &a_ ? 150 : 500);
    Send(*agent, message);
  }

  absl::StatusOr<v1::TensorsStatus> tensors = coordinator_->GetTensors("job");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->plan_version(), 1);
  ASSERT_THAT(tensors->tensors(), SizeIs(2));
  const v1::TensorStatus& w = tensors->tensors(0);
  EXPECT_EQ(w.id(), 0u);
  EXPECT_EQ(w.spec().name(), "w");
  EXPECT_EQ(w.size_bytes(), 4096);
  EXPECT_EQ(w.priority(), 0);
  EXPECT_EQ(w.num_partitions(), 1);
  // Count-weighted: (3 x 100 + 1 x 500) / 4.
  EXPECT_EQ(w.latency_count(), 4);
  EXPECT_EQ(w.latency_mean_us(), 200);
  EXPECT_EQ(w.latency_max_us(), 500);
  EXPECT_EQ(tensors->tensors(1).spec().name(), "b");
  EXPECT_EQ(tensors->tensors(1).latency_count(), 0);

  EXPECT_EQ(coordinator_->GetTensors("nope").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorStatusTest, TimelineMergesEveryMembersAnswer) {
  AskTimeline(3, 4);
  const uint64_t id = RequestIdSentTo(a_);
  EXPECT_EQ(RequestIdSentTo(b_), id);
  const v1::TimelineRequest asked =
      a_.Received(v1::CoordinatorMessage::kTimelineRequest)[0]
          .timeline_request();
  EXPECT_EQ(asked.job(), "job");
  EXPECT_EQ(asked.first_step(), 3);
  EXPECT_EQ(asked.last_step(), 4);

  // Out of order, plus a record outside the range that must not appear.
  Reply(a_, id, {Trace("w", 4, 7), Trace("w", 3, 2), Trace("w", 9, 11)});
  EXPECT_FALSE(finished_);
  Reply(b_, id, {Trace("b", 3, 1)}, /*truncated=*/true);
  ASSERT_TRUE(finished_);
  ASSERT_TRUE(result_.ok()) << result_.status();
  EXPECT_THAT(result_->missing_nodes(), SizeIs(0));
  ASSERT_THAT(result_->nodes(), SizeIs(2));
  const v1::NodeTimeline& n0 = result_->nodes(0);
  EXPECT_EQ(n0.node_name(), "n0");
  EXPECT_EQ(n0.node_rank(), 0);
  ASSERT_THAT(n0.partitions(), SizeIs(2));
  EXPECT_EQ(n0.partitions(0).launch_seq(), 2u);  // launch order
  EXPECT_EQ(n0.partitions(1).launch_seq(), 7u);
  EXPECT_FALSE(n0.truncated());
  EXPECT_EQ(result_->nodes(1).node_name(), "n1");
  EXPECT_TRUE(result_->nodes(1).truncated());
}

TEST_F(CoordinatorStatusTest,
       TimelineFinishesAtTheDeadlineNamingWhoDidNotAnswer) {
  AskTimeline(0, 0);
  Reply(a_, RequestIdSentTo(a_), {Trace("w", 0, 0)});
  RunUntil(
      {&a_, &b_}, [&] { return finished_; }, absl::Seconds(10));
  ASSERT_TRUE(finished_);
  ASSERT_TRUE(result_.ok()) << result_.status();
  EXPECT_THAT(result_->missing_nodes(), ElementsAre("n1"));
  ASSERT_THAT(result_->nodes(), SizeIs(1));
  EXPECT_EQ(result_->nodes(0).node_name(), "n0");
  // A late answer changes nothing.
  Reply(b_, RequestIdSentTo(b_), {Trace("b", 0, 1)});
  EXPECT_THAT(result_->nodes(), SizeIs(1));
}

TEST_F(CoordinatorStatusTest, TimelineRefusesBadRangesAndUnknownJobs) {
  AskTimeline(5, 4);
  ASSERT_TRUE(finished_);
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result_.status().message(), HasSubstr("first_step <= last_step"));
  AskTimeline(0, Coordinator::kMaxTimelineSteps);
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kInvalidArgument);

  v1::GetTimelineRequest request;
  request.set_job("nope");
  coordinator_->GetTimeline(
      request, [&](absl::StatusOr<v1::Timeline> t) { result_ = std::move(t); });
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorStatusTest, ShutdownFinishesPendingTimelines) {
  AskTimeline(0, 1);
  coordinator_->Shutdown("test");
  ASSERT_TRUE(finished_);
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace baton::coordinator
