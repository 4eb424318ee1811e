// The NCCL transport on real GPUs, through the real CUDA runtime and NCCL.
// Without a CUDA device it prints "skipped: no CUDA device (<why>)" and
// exits with 77, which ctest reports as Skipped (SKIP_RETURN_CODE).
//
// One node drives every local device (one NCCL rank each); the tests that
// need more than one rank per group use two nodes in two threads of this
// process, one device each, and skip on a machine with one GPU.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "agent/reduce.h"
#include "agent/transport/memory_key_value_store.h"
#include "agent/transport/nccl/cuda_nccl_api.h"
#include "agent/transport/nccl/local_gpus.h"
#include "agent/transport/nccl/nccl_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_main.h"
#include "tests/unit/agent/transport/node_threads.h"
#include "tests/unit/agent/transport/typed_values.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

// NCCL's first initialization also creates the CUDA contexts: seconds.
constexpr milliseconds kConnectTimeout{60000};
constexpr milliseconds kOpTimeout{60000};

// Set by main before the tests run.
gpu::GpuApi* g_api = nullptr;
int g_devices = 0;

// One device buffer per listed device, copied from and to the host.
class DeviceBuffers {
 public:
  DeviceBuffers(const std::vector<int>& devices, size_t bytes)
      : devices_(devices), bytes_(bytes) {
    for (int device : devices) {
      void* pointer = nullptr;
      EXPECT_EQ(g_api->SetDevice(device), gpu::kCudaSuccess);
      const gpu::CudaError error = g_api->Malloc(&pointer, bytes);
      EXPECT_EQ(error, gpu::kCudaSuccess) << g_api->CudaErrorText(error);
      pointers_.push_back(pointer);
    }
  }
  ~DeviceBuffers() {
    for (size_t i = 0; i < pointers_.size(); ++i) {
      g_api->SetDevice(devices_[i]);
      g_api->Free(pointers_[i]);
    }
  }
  const std::vector<void*>& pointers() const { return pointers_; }
  void Upload(int local, const std::vector<uint8_t>& host) {
    ASSERT_EQ(g_api->Memcpy(pointers_[local], host.data(), bytes_),
              gpu::kCudaSuccess);
  }
  std::vector<uint8_t> Download(int local) {
    std::vector<uint8_t> host(bytes_);
    EXPECT_EQ(g_api->Memcpy(host.data(), pointers_[local], bytes_),
              gpu::kCudaSuccess);
    return host;
  }

 private:
  const std::vector<int> devices_;
  const size_t bytes_;
  std::vector<void*> pointers_;
};

std::vector<int> AllDevices() {
  std::vector<int> devices;
  for (int d = 0; d < g_devices; ++d) devices.push_back(d);
  return devices;
}

std::unique_ptr<NcclTransport> MakeTransport(std::vector<int> devices) {
  NcclTransport::Options options;
  options.devices = std::move(devices);
  auto transport = NcclTransport::Create(g_api, options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? std::move(transport).value() : nullptr;
}

// `count` elements of `dtype` holding value(rank, i).
std::vector<uint8_t> Fill(v1::DataType dtype, size_t count,
                          const std::function<int64_t(size_t)>& value) {
  std::vector<uint8_t> host(count * ElementSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    WriteElement(dtype, host.data(), i, value(i));
  }
  return host;
}

constexpr v1::DataType kFloatTypes[] = {
    v1::DATA_TYPE_FLOAT32, v1::DATA_TYPE_FLOAT64, v1::DATA_TYPE_FLOAT16,
    v1::DATA_TYPE_BFLOAT16};
// One element; odd; 1 Mi + 3 (several NCCL chunks, an uneven last one).
constexpr size_t kCounts[] = {1, 1001, (size_t{1} << 20) + 3};

// --- One node, one rank per local device
// --------------------------------------

class LocalGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = MakeTransport(AllDevices());
    ASSERT_NE(transport_, nullptr);
    auto local = transport_->ConnectLocal(kConnectTimeout);
    ASSERT_TRUE(local.ok()) << local.status();
    communicator_ = std::move(local).value();
  }

  int world() const { return g_devices; }
  void ExpectAllreduce(
      absl::Span<const v1::DataType> types, DeviceReduceOp op,
      const std::function<int64_t(int, size_t, v1::DataType)>& input,
      const std::function<int64_t(size_t, v1::DataType)>& expected_value);

  std::unique_ptr<NcclTransport> transport_;
  std::unique_ptr<DeviceCommunicator> communicator_;
};

// Allreduces every type of `types` and size of kCounts with `op`, device
// d's element i being input(d, i, dtype); afterwards every device holds
// expected(i, dtype).
void LocalGroupTest::ExpectAllreduce(
    absl::Span<const v1::DataType> types, DeviceReduceOp op,
    const std::function<int64_t(int, size_t, v1::DataType)>& input,
    const std::function<int64_t(size_t, v1::DataType)>& expected_value) {
  for (v1::DataType dtype : types) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(absl::StrCat(v1::DataType_Name(dtype), " x ", count));
      const std::vector<uint8_t> expected = Fill(
          dtype, count, [&](size_t i) { return expected_value(i, dtype); });
      DeviceBuffers buffers(AllDevices(), expected.size());
      for (int d = 0; d < world(); ++d) {
        buffers.Upload(d, Fill(dtype, count,
                               [&](size_t i) { return input(d, i, dtype); }));
      }
      const absl::Status status =
          communicator_->DeviceAllreduce(buffers.pointers(), count, dtype, op,
                                         CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok()) << status;
      for (int d = 0; d < world(); ++d) {
        EXPECT_EQ(FirstDifference(buffers.Download(d), expected), -1)
            << "device " << d;
      }
    }
  }
}

TEST_F(LocalGroupTest, AllreduceIsExactForEveryType) {
  ExpectAllreduce(kAllTypes, DeviceReduceOp::kSum, Value,
                  [&](size_t i, v1::DataType dtype) {
                    int64_t sum = 0;
                    for (int rank = 0; rank < world(); ++rank) {
                      sum += Value(rank, i, dtype);
                    }
                    return sum;
                  });
}

// ncclAvg multiplies each value by 1/ranks in its own type: exact for these
// data when the rank count is a power of two.
TEST_F(LocalGroupTest, AllreduceAverageIsExactForFloatTypes) {
  if ((world() & (world() - 1)) != 0) {
    GTEST_SKIP() << world() << " ranks: 1/" << world()
                 << " is not exact in floating point";
  }
  ExpectAllreduce(
      kFloatTypes, DeviceReduceOp::kAverage,
      [&](int rank, size_t i, v1::DataType dtype) {
        return AverageValue(rank, world(), i, dtype);
      },
      AverageBase);
}

TEST_F(LocalGroupTest, BroadcastFromEveryRoot) {
  const size_t bytes = 3 * 1000 * 1000 + 7;
  for (int root = 0; root < world(); ++root) {
    SCOPED_TRACE(absl::StrCat("root ", root));
    std::vector<uint8_t> expected(bytes);
    for (size_t i = 0; i < bytes; ++i) expected[i] = BytePattern(root, i);
    DeviceBuffers buffers(AllDevices(), bytes);
    for (int d = 0; d < world(); ++d) {
      std::vector<uint8_t> host(bytes);
      for (size_t i = 0; i < bytes; ++i) host[i] = BytePattern(d, i);
      buffers.Upload(d, host);
    }
    const absl::Status status = communicator_->DeviceBroadcast(
        buffers.pointers(), bytes, root, CollectiveOptions{kOpTimeout, 0});
    ASSERT_TRUE(status.ok()) << status;
    for (int d = 0; d < world(); ++d) {
      EXPECT_EQ(FirstDifference(buffers.Download(d), expected), -1)
          << "device " << d;
    }
  }
}

TEST_F(LocalGroupTest, ReduceLandsOnTheRootOnly) {
  constexpr v1::DataType kType = v1::DATA_TYPE_BFLOAT16;
  constexpr size_t kCount = 4099;
  const std::vector<uint8_t> expected = Fill(kType, kCount, [&](size_t i) {
    int64_t sum = 0;
    for (int rank = 0; rank < world(); ++rank) sum += Value(rank, i, kType);
    return sum;
  });
  const int root = world() - 1;
  DeviceBuffers buffers(AllDevices(), expected.size());
  std::vector<std::vector<uint8_t>> inputs;
  for (int d = 0; d < world(); ++d) {
    inputs.push_back(
        Fill(kType, kCount, [&](size_t i) { return Value(d, i, kType); }));
    buffers.Upload(d, inputs.back());
  }
  const absl::Status status = communicator_->DeviceReduce(
      buffers.pointers(), kCount, kType, DeviceReduceOp::kSum, root,
      CollectiveOptions{kOpTimeout, 0});
  ASSERT_TRUE(status.ok()) << status;
  for (int d = 0; d < world(); ++d) {
    EXPECT_EQ(
        FirstDifference(buffers.Download(d), d == root ? expected : inputs[d]),
        -1)
        << "device " << d;
  }
}

// --- Groups across nodes (threads of this process)
// ------------------------------

struct TwoNodes {
  std::shared_ptr<MemoryKeyValueStore> store =
      std::make_shared<MemoryKeyValueStore>();
  std::vector<std::unique_ptr<NcclTransport>> transports;
  std::vector<absl::StatusOr<std::unique_ptr<DeviceCommunicator>>>
      communicators;

  milliseconds timeout;

  // Node n drives CUDA device devices[n].
  explicit TwoNodes(const std::vector<int>& devices,
                    milliseconds connect_timeout = kConnectTimeout)
      : timeout(connect_timeout) {
    for (int device : devices) {
      transports.push_back(MakeTransport({device}));
      communicators.emplace_back(absl::UnknownError("not connected"));
    }
  }

  ConnectRequest Request(int node) const {
    ConnectRequest request;
    request.node_rank = node;
    request.num_nodes = static_cast<int>(transports.size());
    request.prefix = "gpu-test/g1";
    request.store = store;
    request.timeout = timeout;
    return request;
  }

  void Connect() {
    std::vector<std::thread> threads;
    for (size_t node = 0; node < transports.size(); ++node) {
      threads.emplace_back([this, node] {
        auto connected = transports[node]->ConnectDevices(Request(node));
        if (connected.ok()) {
          communicators[node] = std::move(connected->front());
        } else {
          communicators[node] = connected.status();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
};

// Two agents sharing one GPU (the hierarchical path's case) as two ranks of
// one NCCL group: NCCL 2.x refuses it ("Duplicate GPU detected"); should a
// version accept it, the sum must be right.
TEST(CrossNodeTest, TwoRanksOnOneGpu) {
  TwoNodes nodes({0, 0}, milliseconds(15000));
  nodes.Connect();
  if (!nodes.communicators[0].ok() || !nodes.communicators[1].ok()) {
    const absl::Status status = !nodes.communicators[0].ok()
                                    ? nodes.communicators[0].status()
                                    : nodes.communicators[1].status();
    GTEST_SKIP() << "NCCL refuses two ranks on one GPU: " << status;
  }
  std::vector<std::thread> threads;
  for (int node = 0; node < 2; ++node) {
    threads.emplace_back([&, node] {
      DeviceBuffers buffers({0}, sizeof(float));
      const float value = node + 1.0f;
      ASSERT_EQ(g_api->Memcpy(buffers.pointers()[0], &value, sizeof value),
                gpu::kCudaSuccess);
      const absl::Status status =
          (*nodes.communicators[node])
              ->DeviceAllreduce(buffers.pointers(), 1, v1::DATA_TYPE_FLOAT32,
                                DeviceReduceOp::kSum,
                                CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok()) << status;
      float sum = 0;
      ASSERT_EQ(g_api->Memcpy(&sum, buffers.pointers()[0], sizeof sum),
                gpu::kCudaSuccess);
      EXPECT_EQ(sum, 3.0f);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// A peer that published its device count and never initializes NCCL: the
// pending initialization is aborted at the timeout and the error names it.
TEST(CrossNodeTest, InitializationWithAMissingPeerIsAborted) {
  auto transport = MakeTransport({0});
  ASSERT_NE(transport, nullptr);
  auto store = std::make_shared<MemoryKeyValueStore>();
  ASSERT_TRUE(store->Set("gpu-test/g2/nccl/devices/1", "1").ok());
  ConnectRequest request;
  request.node_rank = 0;
  request.num_nodes = 2;
  request.prefix = "gpu-test/g2";
  request.store = store;
  request.timeout = milliseconds(3000);
  const auto start = SteadyClock::now();
  const absl::Status status = transport->Connect(request).status();
  EXPECT_LT(Since(start), milliseconds(3000 + 10000))
      << "ncclCommAbort of the pending initialization took too long";
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("node rank(s) 1 did not start NCCL's initialization"));
}

// The generation changes while an allreduce waits for a peer that never
// joins it: Abort() from another thread ends it promptly with ABORTED, and
// ncclCommAbort does not hang on the stuck kernel.
TEST(CrossNodeTest, AbortEndsAnOperationAPeerNeverJoins) {
  if (g_devices < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (one per node); this machine has "
                 << g_devices;
  }
  TwoNodes nodes({0, 1});
  nodes.Connect();
  ASSERT_TRUE(nodes.communicators[0].ok()) << nodes.communicators[0].status();
  ASSERT_TRUE(nodes.communicators[1].ok()) << nodes.communicators[1].status();
  DeviceCommunicator& communicator = **nodes.communicators[0];
  DeviceBuffers buffers({0}, size_t{64} << 20);
  absl::Status status;
  std::thread operation([&] {
    status = communicator.DeviceAllreduce(
        buffers.pointers(), size_t{16} << 20, v1::DATA_TYPE_FLOAT32,
        DeviceReduceOp::kSum, CollectiveOptions{kOpTimeout, 0});
  });
  std::this_thread::sleep_for(milliseconds(500));
  const auto aborted_at = SteadyClock::now();
  communicator.Abort(absl::AbortedError("generation 2 replaced generation 1"));
  operation.join();
  EXPECT_LT(Since(aborted_at), milliseconds(10000));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("aborted: generation 2 replaced generation 1"));
  const auto destroyed_at = SteadyClock::now();
  nodes.communicators[1]->reset();
  EXPECT_LT(Since(destroyed_at), milliseconds(10000))
      << "destroying the idle peer's communicator";
}

}  // namespace
}  // namespace baton::agent

int main(int argc, char** argv) {
  return baton::agent::GpuTestMain(
      "nccl_gpu_test", argc, argv,
      [](baton::agent::gpu::GpuApi* api, int devices) {
        baton::agent::g_api = api;
        baton::agent::g_devices = devices;
      });
}
