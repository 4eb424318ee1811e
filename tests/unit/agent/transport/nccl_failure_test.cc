// The NCCL transport's failures against a fake CUDA runtime and NCCL (see
// fake_nccl_cluster.h): timeouts, NCCL errors and Abort() end operations
// promptly and poison the communicator; and what the agent logs at start.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/transport/nccl/local_gpus.h"
#include "agent/transport/nccl/nccl_transport.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/fake_nccl_cluster.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using SteadyClock = std::chrono::steady_clock;

// Bound on how long an abort or a timeout may take to surface.
constexpr milliseconds kFailFast{3000};

// --- Failures: timeouts, NCCL errors, Abort ----------------------------------

// A peer that never joins the collective: the operation times out at its
// deadline (a fake clock moved past it), names the devices that did not
// finish, aborts the NCCL communicators and poisons the communicator.
TEST(NcclFailureTest, MissingPeerTimesOutAbortsAndPoisons) {
  FakeClock clock;
  FakeCluster cluster({2, 2}, &clock);
  ASSERT_TRUE(cluster.Connect());
  DeviceCommunicator& communicator = cluster.communicator(0);
  DeviceBuffers buffers(*cluster.apis[0], 2, 64);
  absl::Status status;
  std::thread operation([&] {
    status = communicator.DeviceAllreduce(
        buffers.pointers(), 16, v1::DATA_TYPE_FLOAT32, DeviceReduceOp::kSum,
        CollectiveOptions{milliseconds(5000), 0});
  });
  cluster.apis[0]->AwaitWaitingCollectives(2);
  EXPECT_FALSE(communicator.poisoned()) << "still within its timeout";
  clock.Advance(absl::Milliseconds(5001));
  operation.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("allreduce (sum) of 16 float32 on NCCL communicator c0 "
                        "of 2 nodes x 2 devices (node rank 0) timed out after "
                        "5000 ms: CUDA device(s) 0, 1 had not finished"));
  EXPECT_TRUE(communicator.poisoned());
  EXPECT_EQ(cluster.apis[0]->aborted_comms(), 2);
  const absl::Status later = communicator.DeviceBroadcast(
      buffers.pointers(), 8, 0, CollectiveOptions{kTimeout, 0});
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(later.message()),
              StartsWith("communicator poisoned by DEADLINE_EXCEEDED: "
                         "allreduce (sum) of 16 float32"));
}

// Every node calls, but one node's GPU work hangs: both time out and abort.
TEST(NcclFailureTest, HungOperationTimesOutOnEveryNode) {
  FakeClock clock;
  FakeCluster cluster({1, 1}, &clock);
  ASSERT_TRUE(cluster.Connect());
  cluster.apis[1]->HangCollectives(true);
  std::vector<absl::Status> statuses(2);
  std::thread advance([&] {
    cluster.apis[0]->AwaitWaitingCollectives(1);
    cluster.apis[1]->AwaitWaitingCollectives(1);
    clock.Advance(absl::Seconds(2));
  });
  OnEveryNode(2, [&](int node) {
    DeviceBuffers buffers(*cluster.apis[node], 1, 64);
    statuses[node] = cluster.communicator(node).DeviceBroadcast(
        buffers.pointers(), 64, 1, CollectiveOptions{milliseconds(1000), 0});
  });
  advance.join();
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(statuses[node].code(), absl::StatusCode::kDeadlineExceeded)
        << statuses[node];
    EXPECT_THAT(statuses[node].message(),
                HasSubstr("broadcast of 64 bytes from rank 1"));
    EXPECT_TRUE(cluster.communicator(node).poisoned());
    EXPECT_EQ(cluster.apis[node]->aborted_comms(), 1);
  }
}

// The generation changes while an operation waits for a peer: Abort() from
// another thread ends it at once with ABORTED carrying the reason.
TEST(NcclFailureTest, AbortFromAnotherThreadEndsTheOperationPromptly) {
  FakeCluster cluster({2, 2});
  ASSERT_TRUE(cluster.Connect());
  DeviceCommunicator& communicator = cluster.communicator(1);
  DeviceBuffers buffers(*cluster.apis[1], 2, 64);
  absl::Status status;
  SteadyClock::time_point aborted_at;
  std::thread operation([&] {
    status = communicator.DeviceAllreduce(
        buffers.pointers(), 4, v1::DATA_TYPE_INT64, DeviceReduceOp::kSum,
        CollectiveOptions{milliseconds(60000), 0});
  });
  cluster.apis[1]->AwaitWaitingCollectives(2);
  aborted_at = SteadyClock::now();
  communicator.Abort(absl::AbortedError(
      "generation 4 replaced generation 3: node \"n0\" was lost"));
  operation.join();
  EXPECT_LT(Since(aborted_at), kFailFast);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("allreduce (sum) of 4 int64 on NCCL communicator c0 "
                        "of 2 nodes x 2 devices (node rank 1) aborted: "
                        "generation 4 replaced generation 3: node \"n0\" was "
                        "lost"));
  EXPECT_TRUE(communicator.poisoned());
  EXPECT_EQ(cluster.apis[1]->aborted_comms(), 2);
  const absl::Status later = communicator.DeviceAllreduce(
      buffers.pointers(), 4, v1::DATA_TYPE_INT64, DeviceReduceOp::kSum,
      CollectiveOptions{kTimeout, 0});
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(later.message()),
              StartsWith("communicator poisoned by ABORTED"));
  EXPECT_THAT(later.message(), HasSubstr("node \"n0\" was lost"));
}

// Abort() with nothing in flight tears the NCCL communicators down at once;
// the first reason is the one kept.
TEST(NcclFailureTest, AbortWhenIdleAbortsAtOnceAndKeepsTheFirstReason) {
  FakeCluster cluster({2});
  ASSERT_TRUE(cluster.Connect());
  DeviceCommunicator& communicator = cluster.communicator(0);
  communicator.Abort(absl::AbortedError("generation 2 ended"));
  EXPECT_EQ(cluster.apis[0]->aborted_comms(), 2);
  communicator.Abort(absl::AbortedError("a second reason"));
  EXPECT_EQ(cluster.apis[0]->aborted_comms(), 2);
  DeviceBuffers buffers(*cluster.apis[0], 2, 8);
  const absl::Status status = communicator.DeviceBroadcast(
      buffers.pointers(), 8, 0, CollectiveOptions{kTimeout, 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("aborted: generation 2 ended"));
  EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("second reason")));
}

// NCCL reports an asynchronous error (a peer's process died): the operation
// fails with UNAVAILABLE carrying NCCL's texts, and the communicator is
// poisoned.
TEST(NcclFailureTest, NcclErrorIsUnavailableAndPoisons) {
  FakeCluster cluster({1});
  ASSERT_TRUE(cluster.Connect());
  cluster.apis[0]->FailCollectives(gpu::NcclResult::kRemoteError);
  DeviceCommunicator& communicator = cluster.communicator(0);
  DeviceBuffers buffers(*cluster.apis[0], 1, 64);
  const absl::Status status = communicator.DeviceAllreduce(
      buffers.pointers(), 8, v1::DATA_TYPE_FLOAT16, DeviceReduceOp::kSum,
      CollectiveOptions{kTimeout, 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("allreduce (sum) of 8 float16 on NCCL communicator c0 "
                        "of 1 node x 1 device (node rank 0) on CUDA device 0 "
                        "failed: remote process exited or there was a network "
                        "error: fake NCCL: injected failure"));
  EXPECT_TRUE(communicator.poisoned());
  EXPECT_EQ(cluster.apis[0]->aborted_comms(), 1);
}

// A buffer NCCL refuses at enqueue time (here: memory of another device):
// UNAVAILABLE, poisoned, nothing left running.
TEST(NcclFailureTest, BufferOfAnotherDeviceIsAnNcclError) {
  FakeCluster cluster({2});
  ASSERT_TRUE(cluster.Connect());
  DeviceCommunicator& communicator = cluster.communicator(0);
  DeviceBuffers buffers(*cluster.apis[0], 2, 64);
  const std::vector<void*> swapped = {buffers.pointers()[1],
                                      buffers.pointers()[0]};
  const absl::Status status = communicator.DeviceAllreduce(
      swapped, 4, v1::DATA_TYPE_FLOAT32, DeviceReduceOp::kSum,
      CollectiveOptions{kTimeout, 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("enqueueing on CUDA device 0 failed: invalid argument: "
                        "fake NCCL: ncclAllReduce of 16 bytes: a buffer is not "
                        "memory of CUDA device 0"));
  EXPECT_TRUE(communicator.poisoned());
}

// --- What the agent logs at start
// ----------------------------------------------

TEST(LocalGpusTest, DescribesEveryDevice) {
  auto fabric = std::make_shared<FakeNcclFabric>();
  FakeGpuApi api(fabric, FakeGpuApi::Options{2, gpu::kCudaSuccess});
  const absl::StatusOr<std::string> description = DescribeLocalGpus(api);
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_EQ(*description,
            "2 CUDA devices (0: Fake GPU 0, 16.0 GiB, sm_90, PCI "
            "0000:01:00.0; 1: Fake GPU 1, 16.0 GiB, sm_90, PCI 0000:02:00.0), "
            "CUDA runtime 13.0, driver 13.0, NCCL 2.28.9");
}

TEST(LocalGpusTest, SaysWhyThereIsNoDevice) {
  auto fabric = std::make_shared<FakeNcclFabric>();
  FakeGpuApi no_driver(
      fabric, FakeGpuApi::Options{0, gpu::kCudaErrorInsufficientDriver});
  EXPECT_EQ(DescribeLocalGpus(no_driver).status(),
            absl::UnavailableError(
                "no CUDA device (cudaGetDeviceCount: CUDA driver version is "
                "insufficient for CUDA runtime version "
                "(cudaErrorInsufficientDriver))"));
  FakeGpuApi none(fabric, FakeGpuApi::Options{0, gpu::kCudaSuccess});
  EXPECT_EQ(
      DescribeLocalGpus(none).status(),
      absl::UnavailableError("no CUDA device (cudaGetDeviceCount found none)"));
}

}  // namespace
}  // namespace baton::agent
