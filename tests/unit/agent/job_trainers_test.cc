// JobTrainers against what a trainer can write into its shared-memory
// channel (common/shm_channel.h): the request ring's head and tail are in
// memory the trainer maps read-write.
#include "agent/job_trainers.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/agent_config.h"
#include "agent/gpu_support.h"
#include "common/shm.h"
#include "common/shm_channel.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/recording_sink.h"

namespace baton::agent {
namespace {

class JobTrainersTest : public ::testing::Test {
 protected:
  JobTrainersTest()
      : prefix_(absl::StrCat("/baton-job-trainers-test.", getpid(), ".")) {
    auto doorbell =
        SharedMemory::Create(prefix_ + "db", sizeof(Doorbell), std::nullopt);
    EXPECT_TRUE(doorbell.ok()) << doorbell.status();
    doorbell_ = std::move(*doorbell);
    new (doorbell_.data()) Doorbell();
    config_.node_name = "n0";
    trainers_ = std::make_unique<JobTrainers>("job", config_, gpus_, prefix_,
                                              &doorbell_);
  }
  ~JobTrainersTest() override {
    trainers_.reset();
    SharedMemory::Unlink(doorbell_.name()).IgnoreError();
  }

  // Attaches local rank `rank` of 2 through `sink`.
  void Attach(int32_t rank, const std::shared_ptr<RecordingSink>& sink) {
    v1::AttachRequest attach;
    attach.set_job("job");
    attach.set_local_rank(rank);
    attach.set_local_size(2);
    attach.set_expected_nodes(1);
    ASSERT_TRUE(trainers_->Attach(sink, attach, true).ok());
    ASSERT_NE(trainers_->trainer(rank).mapping, nullptr);
  }

  ChannelRing& Requests(int32_t rank) {
    return trainers_->trainer(rank).mapping->channel->requests;
  }

  const std::string prefix_;
  AgentConfig config_;
  GpuSupport gpus_;
  SharedMemory doorbell_;
  std::unique_ptr<JobTrainers> trainers_;
};

// Regression (found by tests/fuzz/trainer_protocol_fuzz): a trainer that
// wrote its request ring's tail far past its head had the job drain
// unpublished slots, kCapacity per drain, for as long as the job ran. Now
// its stream is closed once, with a reason, and the other trainers' rings
// drain as before.
TEST_F(JobTrainersTest, CorruptRequestRingClosesThatTrainerOnly) {
  auto bad = std::make_shared<RecordingSink>();
  auto good = std::make_shared<RecordingSink>();
  Attach(0, bad);
  Attach(1, good);
  ASSERT_TRUE(Requests(1).Push(ChannelEntry{0, 0, 3, 0, 0}));
  // Tail: the ring's second cache line (the layout is the protocol).
  const uint64_t tail = uint64_t{1} << 40;
  std::memcpy(reinterpret_cast<unsigned char*>(&Requests(0)) + 64, &tail,
              sizeof tail);

  std::vector<std::pair<int32_t, int64_t>> drained;
  const auto record = [&](int32_t rank, const TensorEnqueue& e) {
    drained.emplace_back(rank, e.step);
  };
  EXPECT_TRUE(trainers_->DrainChannels(record));
  EXPECT_EQ(drained, (std::vector<std::pair<int32_t, int64_t>>{{1, 3}}));
  ASSERT_EQ(bad->closes().size(), 1u);
  EXPECT_EQ(bad->closes()[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad->closes()[0].message().find(absl::StrCat(
                "local rank 0 of job \"job\": its request ring holds ", tail,
                " entries")),
            std::string::npos)
      << bad->closes()[0];
  EXPECT_TRUE(good->closes().empty());

  drained.clear();
  EXPECT_FALSE(trainers_->DrainChannels(record));
  EXPECT_TRUE(drained.empty());
  EXPECT_EQ(bad->closes().size(), 1u) << "closed again";
}

// GROUP_RANK reaches the coordinator as the node's JoinJob.node_rank: every
// local rank must give the same, inside the job's nodes.
TEST_F(JobTrainersTest, ANodeRankOutOfRangeOrDisagreeingIsRefused) {
  v1::AttachRequest attach;
  attach.set_job("job");
  attach.set_local_size(2);
  attach.set_expected_nodes(2);
  attach.set_node_rank(2);
  absl::Status status =
      trainers_->Attach(std::make_shared<RecordingSink>(), attach, true);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AttachRequest.node_rank is 2; it must be "
                                  "in 0..1 (expected_nodes - 1), or unset"),
            std::string::npos)
      << status;

  attach.set_node_rank(1);
  ASSERT_TRUE(
      trainers_->Attach(std::make_shared<RecordingSink>(), attach, true).ok());
  attach.set_local_rank(1);
  attach.clear_node_rank();
  status = trainers_->Attach(std::make_shared<RecordingSink>(), attach, true);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AttachRequest.node_rank is unset but the "
                                  "trainers already attached to job \"job\" "
                                  "on this node gave 1"),
            std::string::npos)
      << status;
  attach.set_node_rank(1);
  EXPECT_TRUE(
      trainers_->Attach(std::make_shared<RecordingSink>(), attach, true).ok());
  EXPECT_EQ(trainers_->params().node_rank(), 1);
}

}  // namespace
}  // namespace baton::agent
