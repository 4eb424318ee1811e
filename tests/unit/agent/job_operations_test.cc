// JobOperations on fakes: a generation the test controls (FakeGeneration),
// a data plane that only records what it is given (FakeDataPlane), and the
// job thread played by the test, which runs what the operations post. Real
// JobTrainers with two local ranks over streams (no channels).
#include "agent/job_operations.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/gpu_support.h"
#include "agent/job_trainers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/recording_sink.h"

namespace baton::agent {
namespace {

using ::testing::HasSubstr;

class FakeDataPlane : public DataPlane {
 public:
  void Submit(std::shared_ptr<const Operation> op) override {
    absl::MutexLock lock(&mu_);
    submitted_.push_back(std::move(op));
  }
  bool has_devices() const override { return false; }
  std::vector<std::shared_ptr<const Operation>> Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(submitted_, {});
  }

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<const Operation>> submitted_ ABSL_GUARDED_BY(mu_);
};

class FakeGeneration : public JobGeneration {
 public:
  FakeGeneration() {
    v1::Membership m;
    m.set_generation(1);
    m.set_world_size(2);
    m.set_num_nodes(1);
    m.mutable_self()->set_node_name("n0");
    m.mutable_self()->set_local_size(2);
    membership_ = m;
  }
  State state() const override { return state_; }
  const std::optional<v1::Membership>& membership() const override {
    return membership_;
  }
  int64_t partition_bytes() const override { return 0; }
  DataPlane* data_plane() const override { return plane_; }
  const absl::Status* aborted(int64_t generation) const override {
    auto it = aborted_.find(generation);
    return it == aborted_.end() ? nullptr : &it->second;
  }
  const std::optional<absl::Status>& data_plane_stopped() const override {
    return stopped_;
  }
  const absl::Status* devices_failed() const override { return nullptr; }
  bool holds_failures() const override { return holds_; }

  State state_ = State::kRunning;
  std::optional<v1::Membership> membership_;
  DataPlane* plane_ = nullptr;
  absl::flat_hash_map<int64_t, absl::Status> aborted_;
  std::optional<absl::Status> stopped_;
  bool holds_ = false;
};

class JobOperationsTest : public ::testing::Test {
 protected:
  JobOperationsTest() {
    config_.node_name = "n0";
    env_.config = &config_;
    env_.gpus = &gpus_;
    env_.metrics = metrics_.ForJob("job");
    env_.clock = Clock::Real();
    generation_.plane_ = &plane_;
    trainers_ = std::make_unique<JobTrainers>("job", config_, gpus_,
                                              "/baton-job-operations-test.",
                                              /*doorbell=*/nullptr);
    operations_ = std::make_unique<JobOperations>(
        "job", env_, trainers_.get(), &generation_,
        [this](std::function<void()> task) {
          absl::MutexLock lock(&posted_mu_);
          posted_.push_back(std::move(task));
        });
    for (int32_t rank = 0; rank < 2; ++rank) {
      v1::AttachRequest attach;
      attach.set_job("job");
      attach.set_local_rank(rank);
      attach.set_local_size(2);
      attach.set_expected_nodes(1);
      EXPECT_TRUE(trainers_->Attach(sinks_[rank], attach, true).ok());
    }
    for (int32_t rank = 0; rank < 2; ++rank) {
      v1::DeclareRequest declare;
      for (const char* name : {"Gradient.a", "Gradient.b"}) {
        v1::TensorSpec* spec = declare.add_tensors();
        spec->set_name(name);
        spec->set_dtype(v1::DATA_TYPE_FLOAT32);
        spec->add_shape(4);
        spec->set_op(v1::COLLECTIVE_OP_PUSH_PULL);
      }
      EXPECT_TRUE(trainers_->Declare(rank, 1, declare, [this](int32_t i) {
        return operations_->NextStep(i);
      }));
      sinks_[rank]->Take();  // `declared`
    }
    operations_->TensorsDeclared();
    // As the plan would.
    trainers_->tensor(0).tensor_id = 0;
    trainers_->tensor(1).tensor_id = 1;
  }

  // The job thread's turn: what the data-plane threads posted.
  void RunPosted() {
    std::vector<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&posted_mu_);
      tasks.swap(posted_);
    }
    for (auto& task : tasks) task();
  }

  void Enqueue(int32_t rank, int32_t index, int64_t step) {
    TensorEnqueue e;
    e.index = index;
    e.step = step;
    operations_->Enqueue(rank, e);
  }
  void EnqueueBoth(int32_t index, int64_t step) {
    Enqueue(0, index, step);
    Enqueue(1, index, step);
  }
  // The only operation the data plane was given since the last call.
  std::shared_ptr<const Operation> Submitted() {
    std::vector<std::shared_ptr<const Operation>> ops = plane_.Take();
    EXPECT_EQ(ops.size(), 1u);
    return ops.empty() ? nullptr : ops[0];
  }
  // OpDone as the data plane calls it: on a thread of its own.
  void DataPlaneDone(uint64_t id, const absl::Status& status) {
    std::thread([&] { operations_->OpDone(id, status); }).join();
  }

  AgentConfig config_;
  GpuSupport gpus_;
  AgentMetrics metrics_{absl::Seconds(60)};
  JobEnvironment env_;
  FakeGeneration generation_;
  FakeDataPlane plane_;
  std::unique_ptr<JobTrainers> trainers_;
  std::unique_ptr<JobOperations> operations_;
  std::vector<std::shared_ptr<RecordingSink>> sinks_{
      std::make_shared<RecordingSink>(), std::make_shared<RecordingSink>()};
  absl::Mutex posted_mu_;
  std::vector<std::function<void()>> posted_ ABSL_GUARDED_BY(posted_mu_);
};

// A success reaches the trainers from the data plane's thread, before the
// job thread hears of it; the trainer's next enqueue of the tensor, which
// may come first, finds it free.
TEST_F(JobOperationsTest, ASuccessIsToldOnceAndTheNextStepMayComeFirst) {
  EnqueueBoth(0, 0);
  const auto op = Submitted();
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->tensor_name, "Gradient.a");
  DataPlaneDone(op->id, absl::OkStatus());
  for (auto& sink : sinks_) {
    const auto events = sink->Take();
    ASSERT_EQ(events.size(), 1u);
    ASSERT_TRUE(events[0].has_completion()) << events[0].DebugString();
    EXPECT_EQ(events[0].completion().step(), 0);
  }
  // Before the job thread ran OnOpDone.
  EnqueueBoth(0, 1);
  for (auto& sink : sinks_) EXPECT_TRUE(sink->Take().empty()) << "refused";
  const auto next = Submitted();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->step, 1);
  RunPosted();
  for (auto& sink : sinks_) EXPECT_TRUE(sink->Take().empty());
  EXPECT_EQ(operations_->ops().size(), 1u);
  EXPECT_EQ(trainers_->trainer(0).completed_step, 0);
}

// A generation abort fails what the data plane still runs and what waits
// for a local rank, naming the lost node; the tensors stay leased until the
// old data plane lets go, and its late success tells nobody.
TEST_F(JobOperationsTest, AnAbortFailsOperationsInFlightAndKeepsTheirLease) {
  EnqueueBoth(0, 0);
  const auto in_flight = Submitted();
  ASSERT_NE(in_flight, nullptr);
  Enqueue(0, 1, 0);  // rank 1 has not enqueued Gradient.b yet
  const absl::Status lost = absl::AbortedError(
      "generation 1 of job \"job\" was aborted: node n1 was lost");
  generation_.aborted_[1] = lost;
  operations_->FailGeneration(1, lost);
  auto events0 = sinks_[0]->Take();
  ASSERT_EQ(events0.size(), 2u);
  for (const auto& event : events0) {
    ASSERT_TRUE(event.has_failed());
    EXPECT_THAT(event.failed().message(), HasSubstr("node n1 was lost"));
  }
  auto events1 = sinks_[1]->Take();
  ASSERT_EQ(events1.size(), 1u);
  EXPECT_EQ(events1[0].failed().tensor(), "Gradient.a");

  // The retry in the next generation waits for the old data plane.
  generation_.membership_->set_generation(2);
  EnqueueBoth(0, 0);
  EXPECT_TRUE(plane_.Take().empty()) << "submitted while the old data plane "
                                        "still held the buffers";
  DataPlaneDone(in_flight->id, absl::OkStatus());
  RunPosted();
  for (auto& sink : sinks_) EXPECT_TRUE(sink->Take().empty());
  const auto retry = Submitted();
  ASSERT_NE(retry, nullptr);
  EXPECT_EQ(retry->step, 0);
  EXPECT_NE(retry->id, in_flight->id);
}

// The data plane failed on its own: its failures are held until the
// coordinator names the lost node, and then name it.
TEST_F(JobOperationsTest, ADataPlaneFailureIsHeldUntilTheLostNodeIsNamed) {
  EnqueueBoth(0, 0);
  const auto op = Submitted();
  ASSERT_NE(op, nullptr);
  generation_.holds_ = true;
  DataPlaneDone(op->id, absl::UnavailableError("connection reset by n1"));
  RunPosted();
  for (auto& sink : sinks_) EXPECT_TRUE(sink->Take().empty()) << "not held";

  generation_.holds_ = false;
  generation_.aborted_[1] = absl::AbortedError("node n1 was lost");
  operations_->ReleaseHeld();
  for (auto& sink : sinks_) {
    const auto events = sink->Take();
    ASSERT_EQ(events.size(), 1u);
    ASSERT_TRUE(events[0].has_failed());
    EXPECT_EQ(events[0].failed().code(),
              static_cast<int32_t>(absl::StatusCode::kAborted));
    EXPECT_THAT(events[0].failed().message(),
                HasSubstr("node n1 was lost (the data plane saw: connection "
                          "reset by n1)"));
  }
  EXPECT_TRUE(operations_->ops().empty());
  // The tensor is free: a retry is submitted at once.
  EnqueueBoth(0, 0);
  EXPECT_NE(Submitted(), nullptr);
}

// With no node named before the grace period ends, the failure is
// reported as the data plane saw it.
TEST_F(JobOperationsTest, AHeldFailureIsReportedAsItIsWhenNoNodeIsNamed) {
  EnqueueBoth(0, 0);
  const auto op = Submitted();
  ASSERT_NE(op, nullptr);
  generation_.holds_ = true;
  DataPlaneDone(op->id, absl::UnavailableError("connection reset"));
  RunPosted();
  generation_.holds_ = false;
  operations_->ReleaseHeld();
  const auto events = sinks_[0]->Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].failed().message(),
            "tensor \"Gradient.a\" step 0: connection reset");
}

// The job thread stops everything (the job ended) while data-plane threads
// finish the same operations: each rank hears of each operation exactly
// once, whichever wins, and every tensor is free afterwards.
TEST_F(JobOperationsTest, AStopRacingSuccessesTellsEachRankOnce) {
  for (int64_t step = 0; step < 100; ++step) {
    EnqueueBoth(0, step);
    EnqueueBoth(1, step);
    std::vector<std::shared_ptr<const Operation>> ops = plane_.Take();
    ASSERT_EQ(ops.size(), 2u) << "step " << step;
    std::thread data_plane([&] {
      for (const auto& op : ops) operations_->OpDone(op->id, absl::OkStatus());
    });
    operations_->FailAll(absl::CancelledError("the job ended"));
    data_plane.join();
    RunPosted();
    for (auto& sink : sinks_) {
      const auto events = sink->Take();
      ASSERT_EQ(events.size(), 2u) << "step " << step;
      EXPECT_NE(events[0].has_completion() ? events[0].completion().index()
                                           : events[0].failed().index(),
                events[1].has_completion() ? events[1].completion().index()
                                           : events[1].failed().index());
    }
    ASSERT_TRUE(operations_->ops().empty()) << "step " << step;
  }
}

// Local ranks that disagree on the operation both hear why; the tensor is
// free for the next try.
TEST_F(JobOperationsTest, LocalRanksThatDisagreeBothHearWhy) {
  Enqueue(0, 0, 0);
  TensorEnqueue averaged;
  averaged.index = 0;
  averaged.step = 0;
  averaged.average = true;
  operations_->Enqueue(1, averaged);
  for (auto& sink : sinks_) {
    const auto events = sink->Take();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_THAT(events[0].failed().message(),
                HasSubstr("every rank must enqueue the same operation"));
  }
  EXPECT_TRUE(plane_.Take().empty());
  EnqueueBoth(0, 0);
  EXPECT_NE(Submitted(), nullptr);
}

}  // namespace
}  // namespace baton::agent
