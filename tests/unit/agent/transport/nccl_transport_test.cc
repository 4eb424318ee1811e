// The NCCL transport against a fake CUDA runtime and NCCL (see
// fake_nccl_cluster.h): collectives over node and device counts and sizes,
// the Communicator interface, and connecting. The fake really reduces and
// copies the ranks' buffers, so results are checked value by value.
#include "agent/transport/nccl/nccl_transport.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/fake_nccl_cluster.h"
#include "tests/unit/agent/transport/typed_values.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using SteadyClock = std::chrono::steady_clock;

// Tests that wait for a missing peer in real time.
constexpr milliseconds kShortTimeout{300};
// Bound on how long an abort or a timeout may take to surface.
constexpr milliseconds kFailFast{3000};

// --- Collectives over node and device counts and sizes ---------------------

// Element counts: one, odd, and 64 Ki + 3 (a count no rank count divides).
constexpr size_t kOneElement = 1;
constexpr size_t kOdd = 1001;
constexpr size_t kLarge = (size_t{1} << 16) + 3;

class NcclCollectivesTest
    : public ::testing::TestWithParam<std::tuple<int, int, size_t>> {
 protected:
  int nodes() const { return std::get<0>(GetParam()); }
  int devices() const { return std::get<1>(GetParam()); }
  int world() const { return nodes() * devices(); }
  size_t count() const { return std::get<2>(GetParam()); }

  void SetUp() override {
    cluster_ =
        std::make_unique<FakeCluster>(std::vector<int>(nodes(), devices()));
    ASSERT_TRUE(cluster_->Connect());
  }
  void TearDown() override { cluster_.reset(); }

  void ExpectAllreduce(
      DeviceReduceOp op,
      const std::function<int64_t(int, size_t, v1::DataType)>& input,
      const std::function<int64_t(size_t, v1::DataType)>& expected_value);

  std::unique_ptr<FakeCluster> cluster_;
};

// Every node allreduces every type with `op`, rank r's element i being
// input(r, i, dtype); afterwards every device holds expected(i, dtype).
void NcclCollectivesTest::ExpectAllreduce(
    DeviceReduceOp op,
    const std::function<int64_t(int, size_t, v1::DataType)>& input,
    const std::function<int64_t(size_t, v1::DataType)>& expected_value) {
  for (v1::DataType dtype : kNcclTypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    std::vector<uint8_t> expected(count() * ElementSize(dtype));
    for (size_t i = 0; i < count(); ++i) {
      WriteElement(dtype, expected.data(), i, expected_value(i, dtype));
    }
    OnEveryNode(nodes(), [&](int node) {
      DeviceCommunicator& communicator = cluster_->communicator(node);
      DeviceBuffers buffers(*cluster_->apis[node], devices(), expected.size());
      for (int d = 0; d < devices(); ++d) {
        for (size_t i = 0; i < count(); ++i) {
          WriteElement(dtype, buffers.bytes(d), i,
                       input(communicator.device_rank(d), i, dtype));
        }
      }
      const absl::Status status =
          communicator.DeviceAllreduce(buffers.pointers(), count(), dtype, op,
                                       CollectiveOptions{kTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << node << ": " << status;
      for (int d = 0; d < devices(); ++d) {
        EXPECT_EQ(
            FirstDifference(Copy(buffers.bytes(d), expected.size()), expected),
            -1)
            << "node " << node << " device " << d;
      }
    });
  }
}

TEST_P(NcclCollectivesTest, AllreduceIsExactForEveryType) {
  ExpectAllreduce(DeviceReduceOp::kSum, Value,
                  [&](size_t i, v1::DataType dtype) {
                    int64_t sum = 0;
                    for (int rank = 0; rank < world(); ++rank) {
                      sum += Value(rank, i, dtype);
                    }
                    return sum;
                  });
}

TEST_P(NcclCollectivesTest, AllreduceAverageIsExactForEveryType) {
  ExpectAllreduce(
      DeviceReduceOp::kAverage,
      [&](int rank, size_t i, v1::DataType dtype) {
        return AverageValue(rank, world(), i, dtype);
      },
      AverageBase);
}

// The sum lands on the root only; every other buffer keeps its input.
TEST_P(NcclCollectivesTest, ReduceToEveryRoot) {
  constexpr v1::DataType kType = v1::DATA_TYPE_BFLOAT16;
  const size_t bytes = count() * ElementSize(kType);
  std::vector<uint8_t> expected(bytes);
  for (size_t i = 0; i < count(); ++i) {
    int64_t sum = 0;
    for (int rank = 0; rank < world(); ++rank) sum += Value(rank, i, kType);
    WriteElement(kType, expected.data(), i, sum);
  }
  for (int root = 0; root < world(); ++root) {
    SCOPED_TRACE(absl::StrCat("root ", root));
    OnEveryNode(nodes(), [&](int node) {
      DeviceCommunicator& communicator = cluster_->communicator(node);
      DeviceBuffers buffers(*cluster_->apis[node], devices(), bytes);
      std::vector<std::vector<uint8_t>> inputs(devices());
      for (int d = 0; d < devices(); ++d) {
        for (size_t i = 0; i < count(); ++i) {
          WriteElement(kType, buffers.bytes(d), i,
                       Value(communicator.device_rank(d), i, kType));
        }
        inputs[d] = Copy(buffers.bytes(d), bytes);
      }
      const absl::Status status = communicator.DeviceReduce(
          buffers.pointers(), count(), kType, DeviceReduceOp::kSum, root,
          CollectiveOptions{kTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << node << ": " << status;
      for (int d = 0; d < devices(); ++d) {
        const bool is_root = communicator.device_rank(d) == root;
        EXPECT_EQ(FirstDifference(Copy(buffers.bytes(d), bytes),
                                  is_root ? expected : inputs[d]),
                  -1)
            << "node " << node << " device " << d;
      }
    });
  }
}

TEST_P(NcclCollectivesTest, BroadcastFromEveryRoot) {
  const size_t bytes = count();
  for (int root = 0; root < world(); ++root) {
    SCOPED_TRACE(absl::StrCat("root ", root));
    std::vector<uint8_t> expected(bytes);
    for (size_t i = 0; i < bytes; ++i) expected[i] = BytePattern(root, i);
    OnEveryNode(nodes(), [&](int node) {
      DeviceCommunicator& communicator = cluster_->communicator(node);
      DeviceBuffers buffers(*cluster_->apis[node], devices(), bytes);
      for (int d = 0; d < devices(); ++d) {
        for (size_t i = 0; i < bytes; ++i) {
          buffers.bytes(d)[i] = BytePattern(communicator.device_rank(d), i);
        }
      }
      const absl::Status status = communicator.DeviceBroadcast(
          buffers.pointers(), bytes, root, CollectiveOptions{kTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << node << ": " << status;
      for (int d = 0; d < devices(); ++d) {
        EXPECT_EQ(FirstDifference(Copy(buffers.bytes(d), bytes), expected), -1)
            << "node " << node << " device " << d;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(
    NodesDevicesAndSizes, NcclCollectivesTest,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2),
                       ::testing::Values(kOneElement, kOdd, kLarge)),
    [](const ::testing::TestParamInfo<std::tuple<int, int, size_t>>& info) {
      return absl::StrCat(std::get<0>(info.param), "Nodes_",
                          std::get<1>(info.param), "Devices_",
                          std::get<2>(info.param), "Elements");
    });

// --- The Communicator interface ----------------------------------------------

TEST(NcclCommunicatorTest, RanksFollowNodesAndDevices) {
  FakeCluster cluster({2, 2, 2});
  ASSERT_TRUE(cluster.Connect());
  for (int node = 0; node < 3; ++node) {
    DeviceCommunicator& communicator = cluster.communicator(node);
    EXPECT_EQ(communicator.rank(), node);
    EXPECT_EQ(communicator.size(), 3);
    EXPECT_EQ(communicator.local_devices(), 2);
    EXPECT_EQ(communicator.world_size(), 6);
    EXPECT_EQ(communicator.device_rank(1), 2 * node + 1);
  }
}

// With one device per node the one-buffer collectives of Communicator work,
// the buffer being on that device and roots being node ranks.
TEST(NcclCommunicatorTest, OneDevicePerNodeServesTheCommunicatorInterface) {
  FakeCluster cluster({1, 1});
  ASSERT_TRUE(cluster.Connect());
  OnEveryNode(2, [&](int node) {
    Communicator& communicator = cluster.communicator(node);
    DeviceBuffers buffers(*cluster.apis[node], 1, 3 * sizeof(int32_t));
    auto* data = reinterpret_cast<int32_t*>(buffers.bytes(0));
    for (int i = 0; i < 3; ++i) data[i] = (node + 1) * (i + 1);
    absl::Status status = communicator.Allreduce(
        data, 3, v1::DATA_TYPE_INT32, CollectiveOptions{kTimeout, 0});
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(std::vector<int32_t>(data, data + 3),
              (std::vector<int32_t>{3, 6, 9}));
    data[0] = 100 + node;
    status = communicator.Broadcast(data, sizeof(int32_t), 1,
                                    CollectiveOptions{kTimeout, 0});
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(data[0], 101);
  });
}

TEST(NcclCommunicatorTest, OneBufferOnANodeOfTwoDevicesIsRefused) {
  FakeCluster cluster({2});
  ASSERT_TRUE(cluster.Connect());
  DeviceBuffers buffers(*cluster.apis[0], 2, 16);
  Communicator& communicator = cluster.communicator(0);
  const absl::Status allreduce =
      communicator.Allreduce(buffers.pointers()[0], 4, v1::DATA_TYPE_FLOAT32,
                             CollectiveOptions{kTimeout, 0});
  EXPECT_EQ(allreduce.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(allreduce.message(),
              HasSubstr("this node drives 2 devices; use DeviceAllreduce"));
  EXPECT_EQ(communicator
                .Broadcast(buffers.pointers()[0], 16, 0,
                           CollectiveOptions{kTimeout, 0})
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(communicator.poisoned());
}

// Bad arguments are answered without touching NCCL: the communicator stays
// usable.
TEST(NcclCommunicatorTest, InvalidArgumentsDoNotPoison) {
  FakeCluster cluster({2});
  ASSERT_TRUE(cluster.Connect());
  DeviceCommunicator& communicator = cluster.communicator(0);
  DeviceBuffers buffers(*cluster.apis[0], 2, 64);
  const CollectiveOptions options{kTimeout, 0};
  const std::vector<void*> one = {buffers.pointers()[0]};
  const std::vector<void*> with_null = {buffers.pointers()[0], nullptr};
  const auto code = [](const absl::Status& status) { return status.code(); };

  const absl::Status count = communicator.DeviceAllreduce(
      one, 4, v1::DATA_TYPE_FLOAT32, DeviceReduceOp::kSum, options);
  EXPECT_EQ(count.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(count.message(), HasSubstr("give one per local device (2)"));
  const absl::Status null = communicator.DeviceAllreduce(
      with_null, 4, v1::DATA_TYPE_FLOAT32, DeviceReduceOp::kSum, options);
  EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(null.message(), HasSubstr("local device 1 (CUDA device 1)"));
  EXPECT_TRUE(communicator
                  .DeviceAllreduce(with_null, 0, v1::DATA_TYPE_FLOAT32,
                                   DeviceReduceOp::kSum, options)
                  .ok());
  const absl::Status type = communicator.DeviceAllreduce(
      buffers.pointers(), 4, v1::DATA_TYPE_UNSPECIFIED, DeviceReduceOp::kSum,
      options);
  EXPECT_EQ(type.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(type.message(), HasSubstr("unsupported data type unspecified"));
  EXPECT_EQ(code(communicator.DeviceAllreduce(buffers.pointers(), 4,
                                              static_cast<v1::DataType>(99),
                                              DeviceReduceOp::kSum, options)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(communicator.DeviceAllreduce(
                buffers.pointers(), 4, v1::DATA_TYPE_FLOAT32,
                DeviceReduceOp::kSum, CollectiveOptions{milliseconds(0), 0})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(communicator.DeviceAllreduce(buffers.pointers(), SIZE_MAX / 2,
                                              v1::DATA_TYPE_FLOAT32,
                                              DeviceReduceOp::kSum, options)),
            absl::StatusCode::kInvalidArgument);
  const absl::Status root =
      communicator.DeviceBroadcast(buffers.pointers(), 8, 2, options);
  EXPECT_EQ(root.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(root.message(), HasSubstr("root 2 is not a rank (0..1)"));
  EXPECT_EQ(code(communicator.DeviceReduce(buffers.pointers(), 4,
                                           v1::DATA_TYPE_FLOAT32,
                                           DeviceReduceOp::kSum, -1, options)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(communicator.poisoned());

  auto* first = reinterpret_cast<float*>(buffers.bytes(0));
  auto* second = reinterpret_cast<float*>(buffers.bytes(1));
  first[0] = 1.5f;
  second[0] = 2.0f;
  ASSERT_TRUE(communicator
                  .DeviceAllreduce(buffers.pointers(), 1, v1::DATA_TYPE_FLOAT32,
                                   DeviceReduceOp::kSum, options)
                  .ok());
  EXPECT_EQ(first[0], 3.5f);
  EXPECT_EQ(second[0], 3.5f);
}

// Several groups per connection are independent NCCL communicators: one
// thread per group on every node, all at once, each with its own data.
TEST(NcclCommunicatorTest, GroupsRunInParallel) {
  constexpr int kGroups = 3;
  constexpr int kRounds = 4;
  FakeCluster cluster({1, 1});
  ASSERT_TRUE(cluster.Connect(kGroups));
  std::vector<std::thread> threads;
  for (int node = 0; node < 2; ++node) {
    for (int group = 0; group < kGroups; ++group) {
      threads.emplace_back([&, node, group] {
        DeviceBuffers buffers(*cluster.apis[node], 1, sizeof(int64_t));
        auto* data = reinterpret_cast<int64_t*>(buffers.bytes(0));
        for (int round = 0; round < kRounds; ++round) {
          *data = 100 * group + 10 * round + node;
          const absl::Status status =
              cluster.communicator(node, group)
                  .DeviceAllreduce(buffers.pointers(), 1, v1::DATA_TYPE_INT64,
                                   DeviceReduceOp::kSum,
                                   CollectiveOptions{kTimeout, 0});
          ASSERT_TRUE(status.ok()) << status;
          EXPECT_EQ(*data, 200 * group + 20 * round + 1)
              << "node " << node << " group " << group << " round " << round;
        }
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
}

// --- Connecting ------------------------------------------------------------

TEST(NcclConnectTest, UniqueIdTravelsThroughTheStore) {
  FakeCluster cluster({1, 1});
  ASSERT_TRUE(cluster.Connect(2));
  for (const char* key :
       {"baton/job/1/g3/nccl/devices/0", "baton/job/1/g3/nccl/devices/1",
        "baton/job/1/g3/nccl/c0/unique_id", "baton/job/1/g3/nccl/c1/unique_id",
        "baton/job/1/g3/nccl/c1/started/1"}) {
    const auto value = cluster.store->Get({key}, milliseconds(0));
    ASSERT_TRUE(value.ok()) << key << ": " << value.status();
    if (absl::EndsWith(key, "unique_id")) {
      EXPECT_EQ(value->front().size(), gpu::kNcclUniqueIdBytes) << key;
    }
  }
  const auto ids = cluster.store->Get(
      {"baton/job/1/g3/nccl/c0/unique_id", "baton/job/1/g3/nccl/c1/unique_id"},
      milliseconds(0));
  ASSERT_TRUE(ids.ok());
  EXPECT_NE((*ids)[0], (*ids)[1]) << "each group has its own id";
}

TEST(NcclConnectTest, NodesWithDifferentDeviceCountsFailClearly) {
  FakeCluster cluster({1, 2});
  std::vector<absl::Status> statuses(2);
  OnEveryNode(2, [&](int node) {
    statuses[node] = cluster.transports[node]
                         ->Connect(cluster.Request(node, 1, kTimeout))
                         .status();
  });
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kFailedPrecondition)
      << statuses[0];
  EXPECT_THAT(statuses[0].message(),
              HasSubstr("node rank 1 drives 2 CUDA device(s) and this node 1"));
  EXPECT_THAT(statuses[0].message(),
              HasSubstr("every node must drive the same number of devices"));
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kFailedPrecondition)
      << statuses[1];
  EXPECT_THAT(statuses[1].message(),
              HasSubstr("node rank 0 drives 1 CUDA device(s) and this node 2"));
}

TEST(NcclConnectTest, MissingNodeGivesDeadlineExceededNamingIt) {
  FakeCluster cluster({1, 1, 1});
  std::vector<absl::Status> statuses(2);
  OnEveryNode(2, [&](int node) {
    const auto start = SteadyClock::now();
    statuses[node] = cluster.transports[node]
                         ->Connect(cluster.Request(node, 1, kShortTimeout))
                         .status();
    EXPECT_LT(Since(start), kShortTimeout + kFailFast) << statuses[node];
  });
  for (const absl::Status& status : statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(status.message(),
                HasSubstr("node rank(s) 2 did not publish their device count"));
    EXPECT_THAT(status.message(), HasSubstr("baton/job/1/g3/nccl/devices/2"));
  }
}

// A node that agreed on the devices but never reaches NCCL's
// initialization: the others time out, name it, and leave nothing
// initialized behind.
TEST(NcclConnectTest, NodeThatNeverInitializesIsNamed) {
  FakeCluster cluster({1, 1});
  ASSERT_TRUE(cluster.store->Set("baton/job/1/g3/nccl/devices/1", "1").ok());
  const auto start = SteadyClock::now();
  const absl::Status status =
      cluster.transports[0]
          ->Connect(cluster.Request(0, 1, kShortTimeout))
          .status();
  EXPECT_LT(Since(start), kShortTimeout + kFailFast);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("node rank(s) 1 did not start NCCL's initialization"));
  EXPECT_THAT(status.message(), HasSubstr("NCCL group c0 of 2 nodes"));
  EXPECT_EQ(cluster.apis[0]->aborted_comms(), 1);
}

// Every node starts initializing and NCCL never finishes (a node whose
// bootstrap cannot be reached): all time out and abort their ranks.
TEST(NcclConnectTest, InitializationThatNeverFinishesTimesOutEverywhere) {
  FakeCluster cluster({2, 2});
  cluster.apis[1]->StallInitialization(true);
  std::vector<absl::Status> statuses(2);
  OnEveryNode(2, [&](int node) {
    statuses[node] = cluster.transports[node]
                         ->Connect(cluster.Request(node, 1, kShortTimeout))
                         .status();
  });
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(statuses[node].code(), absl::StatusCode::kDeadlineExceeded)
        << statuses[node];
    EXPECT_THAT(statuses[node].message(),
                HasSubstr("every node started NCCL's initialization and it "
                          "did not finish"));
    EXPECT_EQ(cluster.apis[node]->aborted_comms(), 2) << "node " << node;
  }
}

TEST(NcclConnectTest, UniqueIdOfTheWrongSizeIsRejected) {
  FakeCluster cluster({1, 1});
  ASSERT_TRUE(cluster.store->Set("baton/job/1/g3/nccl/devices/0", "1").ok());
  ASSERT_TRUE(
      cluster.store->Set("baton/job/1/g3/nccl/c0/unique_id", "short").ok());
  const absl::Status status =
      cluster.transports[1]->Connect(cluster.Request(1, 1, kTimeout)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("node rank 0 published 5 bytes, NCCL's id has 128"));
}

TEST(NcclConnectTest, AbortedStoreGivesAborted) {
  FakeCluster cluster({1, 1});
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    cluster.store->Abort(absl::AbortedError(
        "job \"job\" generation 3 was aborted while this Get waited"));
  });
  const absl::Status status =
      cluster.transports[0]->Connect(cluster.Request(0, 1, kTimeout)).status();
  aborter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(), HasSubstr("was aborted while this Get waited"));
}

// The request checks are gloo's (ValidateConnectRequest): one case shows
// they run.
TEST(NcclConnectTest, InvalidRequestsAreRejected) {
  FakeCluster cluster({1});
  NcclTransport& transport = *cluster.transports[0];
  ConnectRequest request = cluster.Request(0, 1, kTimeout);
  request.node_rank = 1;
  const absl::Status status = transport.Connect(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("ConnectRequest.node_rank is 1"));
  EXPECT_EQ(transport.ConnectLocal(milliseconds(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclConnectTest, DevicesAreCheckedAgainstTheMachine) {
  auto fabric = std::make_shared<FakeNcclFabric>();
  FakeGpuApi api(fabric, FakeGpuApi::Options{2, gpu::kCudaSuccess});
  const auto create = [&](std::vector<int> devices) {
    NcclTransport::Options options;
    options.devices = std::move(devices);
    return NcclTransport::Create(&api, options).status();
  };
  EXPECT_EQ(create({}).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status twice = create({1, 1});
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(),
              HasSubstr("CUDA device 1 is listed twice: NCCL allows one rank "
                        "per GPU"));
  const absl::Status absent = create({0, 2});
  EXPECT_EQ(absent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(absent.message(),
              HasSubstr("CUDA device 2 does not exist: this machine has 2"));
  EXPECT_TRUE(create({1, 0}).ok());

  FakeGpuApi no_driver(
      fabric, FakeGpuApi::Options{0, gpu::kCudaErrorInsufficientDriver});
  NcclTransport::Options options;
  options.devices = {0};
  const absl::Status none = NcclTransport::Create(&no_driver, options).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(none.message()),
              StartsWith("no CUDA device (cudaGetDeviceCount: CUDA driver "
                         "version is insufficient"));
}

// The local group (the hierarchical path's reduce and broadcast) needs no
// store and no peer.
TEST(NcclConnectTest, LocalGroupSpansTheNodesDevices) {
  auto fabric = std::make_shared<FakeNcclFabric>();
  FakeGpuApi api(fabric, FakeGpuApi::Options{3, gpu::kCudaSuccess});
  NcclTransport::Options options;
  options.devices = {2, 0, 1};
  auto transport = NcclTransport::Create(&api, options);
  ASSERT_TRUE(transport.ok()) << transport.status();
  auto local = (*transport)->ConnectLocal(kTimeout);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ((*local)->world_size(), 3);
  EXPECT_EQ((*local)->size(), 1);
  {
    std::vector<void*> pointers;
    for (int device : options.devices) {
      ASSERT_EQ(api.SetDevice(device), gpu::kCudaSuccess);
      void* pointer = nullptr;
      ASSERT_EQ(api.Malloc(&pointer, sizeof(double)), gpu::kCudaSuccess);
      *static_cast<double*>(pointer) = device + 0.25;
      pointers.push_back(pointer);
    }
    // Local rank 0 is CUDA device 2.
    ASSERT_TRUE((*local)
                    ->DeviceReduce(pointers, 1, v1::DATA_TYPE_FLOAT64,
                                   DeviceReduceOp::kSum, 0,
                                   CollectiveOptions{kTimeout, 0})
                    .ok());
    EXPECT_EQ(*static_cast<double*>(pointers[0]), 3.75);
    EXPECT_EQ(*static_cast<double*>(pointers[1]), 0.25);
    for (void* pointer : pointers) api.Free(pointer);
  }
  local->reset();
  EXPECT_EQ(api.live_comms(), 0);
  EXPECT_THAT(api.misuses(), IsEmpty());
}

}  // namespace
}  // namespace baton::agent
