// CUDA tensors end to end: a real coordinator process, real agents (in this
// process, so that they can be given fake GPUs), real trainers' sessions
// over the agents' unix sockets, gloo on loopback, and a fake CUDA runtime
// and NCCL per node (tests/unit/agent/transport/fake_gpu_api.h) that really
// reduces the device buffers. Covers what only the agent's job wiring does:
// opening the trainers' buffers at declare, connecting the GPU group once
// the plan has a CUDA tensor, building device operations, and the refusals.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "agent/transport/nccl/cuda_device_memory.h"
#include "agent/transport/nccl/nccl_transport.h"
#include "baton/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator_process.h"
#include "tests/unit/agent/transport/fake_gpu_api.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "gpujob";

// One trainer's CUDA tensor on its node's fake GPU: the allocation, the
// stream that writes it and the ready event, exported like a trainer
// process would (cudaIpcGetMemHandle / cudaIpcGetEventHandle).
struct TrainerTensor {
  agent::FakeGpuApi* api = nullptr;
  int device = 0;
  float* data = nullptr;
  int64_t elements = 0;
  agent::gpu::Stream stream = nullptr;
  agent::gpu::Event event = nullptr;

  TrainerTensor(agent::FakeGpuApi* fake, int gpu, int64_t count)
      : api(fake), device(gpu), elements(count) {
    EXPECT_EQ(api->SetDevice(device), agent::gpu::kCudaSuccess);
    void* base = nullptr;
    EXPECT_EQ(api->Malloc(&base, static_cast<size_t>(count) * sizeof(float)),
              agent::gpu::kCudaSuccess);
    data = static_cast<float*>(base);
    EXPECT_EQ(api->StreamCreate(&stream), agent::gpu::kCudaSuccess);
    EXPECT_EQ(api->EventCreate(&event), agent::gpu::kCudaSuccess);
  }
  ~TrainerTensor() {
    api->SetDevice(device);
    api->EventDestroy(event);
    api->StreamDestroy(stream);
    api->Free(data);
  }

  DeviceBuffer Buffer() const {
    DeviceBuffer buffer;
    buffer.dtype = v1::DATA_TYPE_FLOAT32;
    buffer.shape = {elements};
    const agent::gpu::IpcMemHandle memory = api->ExportMemory(data);
    buffer.memory_handle.assign(memory.bytes.data(), memory.bytes.size());
    const agent::gpu::IpcEventHandle ready = api->ExportEvent(event);
    buffer.event_handle.assign(ready.bytes.data(), ready.bytes.size());
    return buffer;
  }
  // Writes the input and records the ready event behind it.
  void Write(float scale) {
    for (int64_t i = 0; i < elements; ++i) {
      data[i] = scale * static_cast<float>(i % 5 + 1);
    }
    api->SetDevice(device);
    EXPECT_EQ(api->EventRecord(event, stream), agent::gpu::kCudaSuccess);
  }
};

class AgentGpuTest
    : public ::testing::TestWithParam<std::tuple<agent::GpuCrossNode, int>> {
 protected:
  agent::GpuCrossNode cross_node() const { return std::get<0>(GetParam()); }
  int nodes() const { return 2; }
  int gpus() const { return std::get<1>(GetParam()); }
  // Local trainers of the node started n-th (one per GPU by default).
  virtual int trainers(int n) const {
    (void)n;
    return gpus();
  }
  int world() const { return nodes() * gpus(); }

  void SetUp() override {
    ASSERT_TRUE(coordinator_.Start().ok());
    dir_ = absl::StrCat(::testing::TempDir(), "agent_gpu_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->random_seed());
    for (int n = 0; n < nodes(); ++n) {
      apis_.push_back(std::make_unique<agent::FakeGpuApi>(
          fabric_, agent::FakeGpuApi::Options{gpus(), 0}));
    }
    for (int n = 0; n < nodes(); ++n) StartAgent(n, /*with_gpus=*/true);
  }

  void StartAgent(int n, bool with_gpus) {
    agent::AgentConfig config;
    config.coordinator = coordinator_.address();
    config.node_name = absl::StrCat("gpu-node", n);
    config.socket_path = absl::StrCat(dir_, ".", n, ".sock");
    config.gpu_cross_node = cross_node();
    config.op_timeout = std::chrono::milliseconds(20000);
    config.data_channels = 1;
    config.timeline_records = 0;
    config.pid = static_cast<int>(getpid());
    agent::GpuSupport support;
    if (with_gpus) {
      std::vector<int> ordinals;
      for (int d = 0; d < gpus(); ++d) ordinals.push_back(d);
      auto memory = agent::CreateCudaDeviceMemory(apis_[n].get(), ordinals);
      ASSERT_TRUE(memory.ok()) << memory.status();
      support.memory = std::move(*memory);
      support.transport =
          agent::NcclTransport::MakeFactory(apis_[n].get(), ordinals);
    } else {
      support.unavailable = "no CUDA device (the test gave it none)";
    }
    agents_.push_back(
        std::make_unique<agent::Agent>(config, std::move(support)));
    ASSERT_TRUE(agents_.back()->Start().ok());
    sockets_.push_back(config.socket_path);
  }

  void TearDown() override {
    agents_.clear();  // the agents let go of the trainers' memory first
    tensors_.clear();
    apis_.clear();
    coordinator_.Terminate();
  }

  ClientOptions Options(int n, int local_rank) const {
    ClientOptions options;
    options.socket = sockets_[n];
    options.job = kJob;
    options.local_rank = local_rank;
    options.local_size = trainers(n);
    options.expected_nodes = nodes();
    options.partition_bytes = 4096;
    options.attach_timeout = std::chrono::seconds(20);
    return options;
  }

  // Runs `body(session, rank, tensor)` on every trainer at once, each on
  // its own thread with its own session and CUDA tensor.
  // `device_of(local_rank)`: the GPU each trainer uses (its own by default).
  template <typename Body>
  void OnEveryTrainer(
      int64_t elements, Body body,
      int (*device_of)(int) = [](int r) { return r; }) {
    for (int n = 0; n < nodes(); ++n) {
      for (int r = 0; r < trainers(n); ++r) {
        tensors_.push_back(std::make_unique<TrainerTensor>(
            apis_[n].get(), device_of(r), elements));
      }
    }
    std::vector<std::thread> threads;
    size_t next = 0;
    for (int n = 0; n < nodes(); ++n) {
      for (int r = 0; r < trainers(n); ++r) {
        TrainerTensor* tensor = tensors_[next++].get();
        threads.emplace_back([this, n, r, tensor, &body] {
          auto session = Session::Init(Options(n, r));
          ASSERT_TRUE(session.ok()) << session.status();
          body(**session, (*session)->rank(), *tensor);
          EXPECT_TRUE((*session)->Shutdown().ok());
        });
      }
    }
    for (std::thread& thread : threads) thread.join();
  }

  std::shared_ptr<agent::FakeNcclFabric> fabric_ =
      std::make_shared<agent::FakeNcclFabric>();
  std::vector<std::unique_ptr<agent::FakeGpuApi>> apis_;
  CoordinatorProcess coordinator_;
  std::string dir_;
  std::vector<std::string> sockets_;
  std::vector<std::unique_ptr<agent::Agent>> agents_;
  std::vector<std::unique_ptr<TrainerTensor>> tensors_;
};

TEST_P(AgentGpuTest, PushPullAndBroadcastOnTheTrainersGpus) {
  // 3000 floats: three partitions of 4 KiB.
  const int world_size = world();
  OnEveryTrainer(3000, [&](Session& session, int rank, TrainerTensor& t) {
    const DeviceBuffer buffer = t.Buffer();
    for (int step = 0; step < 2; ++step) {
      t.Write(static_cast<float>(rank + 1 + step));
      absl::Status status = session.PushPull("grad", buffer, /*average=*/false);
      ASSERT_TRUE(status.ok()) << status;
      // sum over ranks of (rank + 1 + step).
      const float total = static_cast<float>(world_size * (world_size + 1) / 2 +
                                             world_size * step);
      for (int64_t i = 0; i < t.elements; ++i) {
        ASSERT_EQ(t.data[i], total * static_cast<float>(i % 5 + 1))
            << "rank " << rank << " step " << step << " element " << i;
      }
    }
    const int root = world_size - 1;
    t.Write(static_cast<float>(100 + rank));
    absl::Status status = session.Broadcast("params", buffer, root);
    ASSERT_TRUE(status.ok()) << status;
    for (int64_t i = 0; i < t.elements; ++i) {
      ASSERT_EQ(t.data[i], static_cast<float>((100 + root) * (i % 5 + 1)))
          << "rank " << rank << " element " << i;
    }
  });
}

TEST_P(AgentGpuTest, HostAndCudaTensorsMixInOneJob) {
  const int world_size = world();
  OnEveryTrainer(100, [&](Session& session, int rank, TrainerTensor& t) {
    t.Write(static_cast<float>(rank + 1));
    std::vector<float> host(7, static_cast<float>(rank + 1));
    auto on_host = session.PushPullAsync(
        "host", Buffer{host.data(), v1::DATA_TYPE_FLOAT32, {7}}, true);
    ASSERT_TRUE(on_host.ok()) << on_host.status();
    absl::Status status = session.PushPull("cuda", t.Buffer(), true);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(session.Synchronize(*on_host).ok());
    const float mean = static_cast<float>(world_size + 1) / 2.0f;
    for (float value : host) EXPECT_EQ(value, mean);
    for (int64_t i = 0; i < t.elements; ++i) {
      ASSERT_EQ(t.data[i], mean * static_cast<float>(i % 5 + 1));
    }
  });
}

// Two local trainers per node whose tensors are on the same GPU.
class AgentGpuSharedTest : public AgentGpuTest {};

TEST_P(AgentGpuSharedTest, TwoTrainersOnOneGpuAreRefused) {
  std::mutex mu;
  std::vector<absl::Status> outcomes;  // by global rank
  outcomes.resize(world());
  OnEveryTrainer(
      16,
      [&](Session& session, int rank, TrainerTensor& t) {
        const absl::Status status = session.DeclareTensor(
            "grad", t.Buffer(), v1::COLLECTIVE_OP_PUSH_PULL);
        std::lock_guard<std::mutex> lock(mu);
        outcomes[rank] = status;
      },
      [](int) { return 0; });
  // On each node the first to declare gets the GPU, the other is refused.
  for (int n = 0; n < nodes(); ++n) {
    int refused = 0;
    for (int r = 0; r < gpus(); ++r) {
      const absl::Status& status = outcomes[n * gpus() + r];
      if (status.ok()) continue;
      ++refused;
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_THAT(status.message(),
                  HasSubstr("uses already; NCCL takes one rank per GPU"));
    }
    EXPECT_EQ(refused, 1) << "node rank " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    CrossNode, AgentGpuSharedTest,
    ::testing::Values(std::make_tuple(agent::GpuCrossNode::kNccl, 2),
                      std::make_tuple(agent::GpuCrossNode::kGloo, 2)),
    [](const auto& info) {
      return std::string(agent::GpuCrossNodeName(std::get<0>(info.param)));
    });

// Nodes with different trainer counts (2 and 1). They cannot form one NCCL
// group: with --gpu_cross_node=nccl the CUDA operations fail with the
// reason while host tensors keep running; the hierarchical path reduces
// each node's GPUs on their own and works.
class AgentGpuUnevenTest : public AgentGpuTest {
 protected:
  int trainers(int n) const override { return n == 0 ? 2 : 1; }
};

TEST_P(AgentGpuUnevenTest, UnevenNodesNeedTheHierarchicalPath) {
  std::mutex mu;
  std::condition_variable all_done;
  std::vector<absl::Status> cuda;
  const bool nccl = cross_node() == agent::GpuCrossNode::kNccl;
  OnEveryTrainer(64, [&](Session& session, int rank, TrainerTensor& t) {
    std::vector<float> host(5, 1.0f);
    absl::Status status = session.PushPull(
        "host", Buffer{host.data(), v1::DATA_TYPE_FLOAT32, {5}}, false);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(host[0], 3.0f);  // three trainers
    t.Write(static_cast<float>(rank + 1));
    status = session.PushPull("cuda", t.Buffer(), /*average=*/true);
    if (status.ok()) {
      // (1 + 2 + 3) / 3 = 2.
      for (int64_t i = 0; i < t.elements; ++i) {
        EXPECT_EQ(t.data[i], 2.0f * static_cast<float>(i % 5 + 1));
      }
    }
    std::unique_lock<std::mutex> lock(mu);
    cuda.push_back(status);
    all_done.notify_all();
    // Nobody detaches before every trainer has its outcome: a node that
    // leaves first would fail the others' operations for that reason.
    all_done.wait_for(lock, std::chrono::seconds(30),
                      [&] { return cuda.size() == 3; });
  });
  ASSERT_EQ(cuda.size(), 3u);
  for (const absl::Status& status : cuda) {
    if (!nccl) {
      EXPECT_TRUE(status.ok()) << status;
      continue;
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                HasSubstr("every node must drive the same number of devices"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    CrossNode, AgentGpuUnevenTest,
    ::testing::Values(std::make_tuple(agent::GpuCrossNode::kNccl, 2),
                      std::make_tuple(agent::GpuCrossNode::kGloo, 2)),
    [](const auto& info) {
      return std::string(agent::GpuCrossNodeName(std::get<0>(info.param)));
    });

INSTANTIATE_TEST_SUITE_P(
    CrossNode, AgentGpuTest,
    ::testing::Combine(::testing::Values(agent::GpuCrossNode::kNccl,
                                         agent::GpuCrossNode::kGloo),
                       ::testing::Values(1, 2)),
    [](const auto& info) {
      return absl::StrCat(agent::GpuCrossNodeName(std::get<0>(info.param)), "_",
                          std::get<1>(info.param), "gpus");
    });

}  // namespace
}  // namespace baton
