// The data plane driving the NCCL transport: CUDA tensors opened through
// CUDA IPC, scheduled like host tensors, reduced by NCCL (one group over
// every GPU, or the hierarchical path with gloo between the nodes). Nodes
// are threads with a fake CUDA runtime and NCCL each (fake_gpu_api.h) that
// really reduce the buffers, the real negotiation rounds (TcpRounds) and real
// gloo for the host stage on loopback, and the real CUDA IPC device memory
// over the fake.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/reduce.h"
#include "agent/scheduler/scheduler.h"
#include "agent/transport/nccl/cuda_device_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/fake_nccl_cluster.h"
#include "tests/unit/agent/transport/gloo_cluster.h"

namespace baton::agent {
namespace {

using ::testing::HasSubstr;

// One agent with its local trainers' GPUs: the trainers' side (an
// allocation, a stream and a ready event per GPU, exported through CUDA
// IPC) and the agent's side (the opened buffers and events, the data plane).
struct GpuNode {
  FakeGpuApi* api = nullptr;
  std::unique_ptr<DeviceMemory> memory;
  // Trainers' side, by local device.
  std::vector<float*> tensors;
  std::vector<gpu::Stream> streams;
  std::vector<gpu::Event> events;
  // Agent's side.
  std::vector<std::shared_ptr<DeviceBuffer>> buffers;
  std::vector<std::unique_ptr<DeviceEvent>> ready;
  std::vector<uint8_t> stage;
  std::unique_ptr<Scheduler> plane;

  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, absl::Status> done;

  absl::Status WaitDone(uint64_t id, std::chrono::seconds bound) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, bound, [&] { return done.count(id) > 0; })) {
      return absl::DeadlineExceededError("the operation never finished");
    }
    return done[id];
  }
  bool Done(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    return done.count(id) > 0;
  }
};

class DataPlaneGpuTest : public ::testing::Test {
 protected:
  // `nodes` agents with `devices` GPUs each; tensors of `elements` float32.
  // `attach_later`: the data planes start without their GPU communicators,
  // which are attached once all started (as the agent does).
  void Start(
      int nodes, int devices, GpuCrossNode cross_node, int64_t elements,
      std::chrono::milliseconds op_timeout = std::chrono::milliseconds(20000),
      bool attach_later = false) {
    nodes_count_ = nodes;
    devices_ = devices;
    elements_ = elements;
    cross_node_ = cross_node;
    fake_ = std::make_unique<FakeCluster>(std::vector<int>(nodes, devices));
    gloo_ = std::make_unique<Cluster>(nodes);
    // The negotiation; one data channel and the hierarchical path's host
    // stage.
    ASSERT_TRUE(gloo_->ConnectNegotiation());
    ASSERT_TRUE(gloo_->Connect(2));
    std::vector<int> ordinals;
    for (int d = 0; d < devices; ++d) ordinals.push_back(d);
    const size_t bytes = static_cast<size_t>(elements) * sizeof(float);
    for (int n = 0; n < nodes; ++n) {
      auto node = std::make_unique<GpuNode>();
      node->api = fake_->apis[n].get();
      auto memory = CreateCudaDeviceMemory(node->api, ordinals);
      ASSERT_TRUE(memory.ok()) << memory.status();
      node->memory = std::move(*memory);
      for (int d = 0; d < devices; ++d) {
        FakeGpuApi& api = *node->api;
        ASSERT_EQ(api.SetDevice(d), gpu::kCudaSuccess);
        void* base = nullptr;
        ASSERT_EQ(api.Malloc(&base, bytes), gpu::kCudaSuccess);
        gpu::Stream stream = nullptr;
        ASSERT_EQ(api.StreamCreate(&stream), gpu::kCudaSuccess);
        gpu::Event event = nullptr;
        ASSERT_EQ(api.EventCreate(&event), gpu::kCudaSuccess);
        node->tensors.push_back(static_cast<float*>(base));
        node->streams.push_back(stream);
        node->events.push_back(event);
        DeviceBufferSpec spec;
        const gpu::IpcMemHandle handle = api.ExportMemory(base);
        spec.memory_handle.assign(handle.bytes.data(), handle.bytes.size());
        const gpu::IpcEventHandle event_handle = api.ExportEvent(event);
        spec.event_handle.assign(event_handle.bytes.data(),
                                 event_handle.bytes.size());
        spec.bytes = static_cast<int64_t>(bytes);
        auto buffer = node->memory->Open(spec);
        ASSERT_TRUE(buffer.ok()) << buffer.status();
        ASSERT_EQ((*buffer)->local_device(), d);
        auto ready = node->memory->OpenEvent(spec);
        ASSERT_TRUE(ready.ok()) << ready.status();
        node->buffers.push_back(std::move(*buffer));
        node->ready.push_back(std::move(*ready));
      }
      node->stage.resize(bytes);
      nodes_.push_back(std::move(node));
    }
    // The GPU communicators, as the agent connects them.
    std::vector<std::unique_ptr<DeviceCommunicator>> device_comms(nodes);
    if (cross_node == GpuCrossNode::kNccl) {
      ASSERT_TRUE(fake_->Connect(1));
      for (int n = 0; n < nodes; ++n) {
        device_comms[n] = std::move(fake_->communicators[n][0]);
      }
    } else {
      for (int n = 0; n < nodes; ++n) {
        auto local = fake_->transports[n]->ConnectLocal(kTimeout);
        ASSERT_TRUE(local.ok()) << local.status();
        device_comms[n] = std::move(*local);
      }
    }
    std::vector<DeviceGroup> groups(nodes);
    for (int n = 0; n < nodes; ++n) {
      GpuNode* node = nodes_[n].get();
      SchedulerOptions options;
      options.job = "gpu";
      options.generation = 1;
      options.node_rank = n;
      options.num_nodes = nodes;
      options.world_size = nodes * devices;
      options.credit_bytes = 16 << 10;
      options.op_timeout = op_timeout;
      Scheduler::Callbacks callbacks;
      callbacks.op_done = [node](uint64_t id, absl::Status status) {
        std::lock_guard<std::mutex> lock(node->mu);
        node->done[id] = status;
        node->cv.notify_all();
      };
      callbacks.stopped = [](absl::Status) {};
      auto& comms = gloo_->communicators[n];
      std::vector<std::unique_ptr<Communicator>> data;
      data.push_back(std::move(comms[0]));
      DeviceGroup group;
      group.cross_node = cross_node;
      group.comm = std::move(device_comms[n]);
      group.memory = node->memory.get();
      if (cross_node == GpuCrossNode::kGloo && nodes > 1) {
        group.host = std::move(comms[1]);
      }
      if (attach_later) {
        groups[n] = std::move(group);
        group = DeviceGroup{};
      }
      node->plane = std::make_unique<Scheduler>(
          options, std::move(gloo_->negotiations[n]), std::move(data),
          callbacks, std::move(group));
      node->plane->SetKnownTensors(8);
    }
    if (attach_later) {
      for (int n = 0; n < nodes; ++n) {
        EXPECT_FALSE(nodes_[n]->plane->has_devices());
        nodes_[n]->plane->AttachDevices(std::move(groups[n]));
      }
    }
  }

  void TearDown() override {
    for (auto& node : nodes_) node->plane.reset();
    for (auto& node : nodes_) {
      // The agent lets go before the trainers free their memory.
      node->buffers.clear();
      node->ready.clear();
      for (size_t d = 0; d < node->tensors.size(); ++d) {
        node->api->SetDevice(static_cast<int>(d));
        node->api->ReleaseStream(node->streams[d]);
        node->api->EventDestroy(node->events[d]);
        node->api->StreamDestroy(node->streams[d]);
        node->api->Free(node->tensors[d]);
      }
    }
    nodes_.clear();
    fake_.reset();
  }

  int world() const { return nodes_count_ * devices_; }
  int rank(int node, int device) const { return node * devices_ + device; }

  // Every trainer writes its input: (rank + 1) x (i % 7 + 1), and records
  // its ready event.
  void WriteInputs() {
    for (int n = 0; n < nodes_count_; ++n) {
      for (int d = 0; d < devices_; ++d) WriteInput(n, d);
    }
  }
  void WriteInput(int n, int d) {
    float* tensor = nodes_[n]->tensors[d];
    for (int64_t i = 0; i < elements_; ++i) {
      tensor[i] = static_cast<float>((rank(n, d) + 1) * (i % 7 + 1));
    }
    Record(n, d);
  }
  void Record(int n, int d) {
    FakeGpuApi& api = *nodes_[n]->api;
    ASSERT_EQ(api.SetDevice(d), gpu::kCudaSuccess);
    ASSERT_EQ(api.EventRecord(nodes_[n]->events[d], nodes_[n]->streams[d]),
              gpu::kCudaSuccess);
  }

  // The operation every node submits for tensor `tensor` step `step`.
  std::shared_ptr<Operation> Op(int n, uint32_t tensor, int64_t step,
                                v1::CollectiveOp kind, bool average,
                                int root_rank = -1) {
    auto op = std::make_shared<Operation>();
    op->id = tensor * 1000 + static_cast<uint64_t>(step) + 1;
    op->tensor_id = tensor;
    op->tensor_name = absl::StrCat("g", tensor);
    op->step = step;
    op->kind = kind;
    op->average = average;
    op->size_bytes = elements_ * static_cast<int64_t>(sizeof(float));
    op->partition_bytes = 4096;  // several partitions per tensor
    op->on_device = true;
    for (int d = 0; d < devices_; ++d) {
      op->device_buffers.push_back(
          static_cast<uint8_t*>(nodes_[n]->buffers[d]->data()));
      op->ready.push_back(nodes_[n]->ready[d].get());
    }
    if (cross_node_ == GpuCrossNode::kGloo && nodes_count_ > 1) {
      op->output = nodes_[n]->stage.data();
    }
    if (kind == v1::COLLECTIVE_OP_BROADCAST) {
      op->root_rank = root_rank;
      op->root_node = root_rank / devices_;
      op->root_local = root_rank % devices_;
    }
    return op;
  }

  // Submits the operation on every node and waits for it everywhere.
  void RunEverywhere(uint32_t tensor, int64_t step, v1::CollectiveOp kind,
                     bool average, int root_rank = -1,
                     v1::ReduceOp reduce_op = v1::REDUCE_OP_SUM) {
    std::vector<uint64_t> ids;
    for (int n = 0; n < nodes_count_; ++n) {
      auto op = Op(n, tensor, step, kind, average, root_rank);
      op->reduce_op = reduce_op;
      ids.push_back(op->id);
      nodes_[n]->plane->Submit(std::move(op));
    }
    for (int n = 0; n < nodes_count_; ++n) {
      const absl::Status status =
          nodes_[n]->WaitDone(ids[n], std::chrono::seconds(30));
      ASSERT_TRUE(status.ok()) << "node " << n << ": " << status;
    }
  }

  // Every GPU of every node holds `expected(i)`.
  template <typename F>
  void ExpectEverywhere(F expected) {
    for (int n = 0; n < nodes_count_; ++n) {
      for (int d = 0; d < devices_; ++d) {
        const float* tensor = nodes_[n]->tensors[d];
        for (int64_t i = 0; i < elements_; ++i) {
          ASSERT_EQ(tensor[i], expected(i))
              << "node " << n << " device " << d << " element " << i;
        }
      }
    }
  }

  // sum over ranks of (rank + 1) = world (world + 1) / 2.
  float Sum(int64_t i) const {
    return static_cast<float>(world() * (world() + 1) / 2 * (i % 7 + 1));
  }

  int nodes_count_ = 0;
  int devices_ = 0;
  int64_t elements_ = 0;
  GpuCrossNode cross_node_ = GpuCrossNode::kNccl;
  std::unique_ptr<FakeCluster> fake_;
  std::unique_ptr<Cluster> gloo_;
  std::vector<std::unique_ptr<GpuNode>> nodes_;
};

// --- Results over layouts and both cross-node paths ------------------------

class DataPlaneGpuLayoutTest
    : public DataPlaneGpuTest,
      public ::testing::WithParamInterface<std::tuple<int, int, GpuCrossNode>> {
 protected:
  void SetUp() override {
    // 3001 floats: three partitions of 4 KiB, the last one short.
    Start(std::get<0>(GetParam()), std::get<1>(GetParam()),
          std::get<2>(GetParam()), 3001);
  }
};

TEST_P(DataPlaneGpuLayoutTest, PushPullSumsEveryGpuInPlace) {
  WriteInputs();
  RunEverywhere(0, 0, v1::COLLECTIVE_OP_PUSH_PULL, /*average=*/false);
  ExpectEverywhere([&](int64_t i) { return Sum(i); });
}

TEST_P(DataPlaneGpuLayoutTest, PushPullAveragesOverTheWorld) {
  WriteInputs();
  RunEverywhere(1, 0, v1::COLLECTIVE_OP_PUSH_PULL, /*average=*/true);
  ExpectEverywhere([&](int64_t i) { return Sum(i) / world(); });
}

// Rank r holds (r + 1)(i % 7 + 1): the min is rank 0's, the max the last
// rank's, the product (i % 7 + 1)^world x world!, on NCCL alone and through
// the host between nodes.
TEST_P(DataPlaneGpuLayoutTest, PushPullMinMaxAndProduct) {
  float factorial = 1;
  for (int r = 1; r <= world(); ++r) factorial *= static_cast<float>(r);
  int64_t step = 0;
  for (v1::ReduceOp op :
       {v1::REDUCE_OP_MIN, v1::REDUCE_OP_MAX, v1::REDUCE_OP_PRODUCT}) {
    SCOPED_TRACE(ReduceOpName(op));
    WriteInputs();
    RunEverywhere(3, step++, v1::COLLECTIVE_OP_PUSH_PULL, false, -1, op);
    ExpectEverywhere([&](int64_t i) {
      const float x = static_cast<float>(i % 7 + 1);
      if (op == v1::REDUCE_OP_MIN) return x;
      if (op == v1::REDUCE_OP_MAX) return static_cast<float>(world()) * x;
      return factorial * std::pow(x, static_cast<float>(world()));
    });
  }
}

TEST_P(DataPlaneGpuLayoutTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < world(); ++root) {
    WriteInputs();
    RunEverywhere(2, root, v1::COLLECTIVE_OP_BROADCAST, false, root);
    ExpectEverywhere([&](int64_t i) {
      return static_cast<float>((root + 1) * (i % 7 + 1));
    });
  }
}

TEST_P(DataPlaneGpuLayoutTest, StepsAndTensorsInterleave) {
  for (int64_t step = 0; step < 3; ++step) {
    WriteInputs();
    RunEverywhere(3, step, v1::COLLECTIVE_OP_PUSH_PULL, false);
    ExpectEverywhere([&](int64_t i) { return Sum(i); });
  }
}

std::string LayoutName(
    const ::testing::TestParamInfo<std::tuple<int, int, GpuCrossNode>>& info) {
  return absl::StrCat(std::get<0>(info.param), "nodes_",
                      std::get<1>(info.param), "gpus_",
                      GpuCrossNodeName(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DataPlaneGpuLayoutTest,
    ::testing::Values(std::make_tuple(1, 2, GpuCrossNode::kNccl),
                      std::make_tuple(2, 1, GpuCrossNode::kNccl),
                      std::make_tuple(2, 2, GpuCrossNode::kNccl),
                      std::make_tuple(1, 2, GpuCrossNode::kGloo),
                      // Two agents sharing one GPU each way: the check
                      // script's layout on a one-GPU machine.
                      std::make_tuple(2, 1, GpuCrossNode::kGloo),
                      std::make_tuple(2, 2, GpuCrossNode::kGloo),
                      std::make_tuple(3, 2, GpuCrossNode::kGloo)),
    LayoutName);

// --- Ready events, aborts, refusals ----------------------------------------

TEST_F(DataPlaneGpuTest, WaitsForTheTrainersReadyEvent) {
  Start(2, 2, GpuCrossNode::kNccl, 1000);
  WriteInputs();
  // Node 1's second trainer is still in its backward pass: its stream is
  // held, and its ready event is recorded behind that work.
  nodes_[1]->api->HoldStream(nodes_[1]->streams[1]);
  Record(1, 1);
  std::vector<uint64_t> ids;
  for (int n = 0; n < 2; ++n) {
    auto op = Op(n, 0, 0, v1::COLLECTIVE_OP_PUSH_PULL, false);
    ids.push_back(op->id);
    nodes_[n]->plane->Submit(std::move(op));
  }
  // The gradient is produced only now; the collective must see it.
  float* late = nodes_[1]->tensors[1];
  for (int64_t i = 0; i < elements_; ++i) late[i] = 1000.0f;
  EXPECT_FALSE(nodes_[0]->Done(ids[0]));
  EXPECT_FALSE(nodes_[1]->Done(ids[1]));
  nodes_[1]->api->ReleaseStream(nodes_[1]->streams[1]);
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(nodes_[n]->WaitDone(ids[n], std::chrono::seconds(30)).ok());
  }
  ExpectEverywhere([&](int64_t i) {
    return static_cast<float>((1 + 2 + 3) * (i % 7 + 1)) + 1000.0f;
  });
}

TEST_F(DataPlaneGpuTest, ReadyEventThatNeverCompletesFailsAtTheTimeout) {
  Start(1, 2, GpuCrossNode::kNccl, 1000, std::chrono::milliseconds(300));
  WriteInputs();
  nodes_[0]->api->HoldStream(nodes_[0]->streams[0]);
  Record(0, 0);
  auto op = Op(0, 0, 0, v1::COLLECTIVE_OP_PUSH_PULL, false);
  const uint64_t id = op->id;
  nodes_[0]->plane->Submit(std::move(op));
  const absl::Status status = nodes_[0]->WaitDone(id, std::chrono::seconds(30));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("ready event"));
  EXPECT_THAT(status.message(), HasSubstr("tensor \"g0\""));
}

TEST_F(DataPlaneGpuTest, AbortEndsAnNcclCollectiveInFlightAtOnce) {
  // op_timeout is a minute: only the abort can end the collective in time.
  Start(2, 1, GpuCrossNode::kNccl, 1000, std::chrono::milliseconds(60000));
  WriteInputs();
  // Node 1's collectives never arrive: node 0's waits for them.
  nodes_[1]->api->HangCollectives(true);
  std::vector<uint64_t> ids;
  for (int n = 0; n < 2; ++n) {
    auto op = Op(n, 0, 0, v1::COLLECTIVE_OP_PUSH_PULL, false);
    ids.push_back(op->id);
    nodes_[n]->plane->Submit(std::move(op));
  }
  nodes_[0]->api->AwaitWaitingCollectives(1);
  const auto start = std::chrono::steady_clock::now();
  for (auto& node : nodes_) {
    node->plane->Abort(absl::AbortedError("generation 1 was aborted"));
  }
  for (int n = 0; n < 2; ++n) {
    const absl::Status status =
        nodes_[n]->WaitDone(ids[n], std::chrono::seconds(30));
    // Node 0 is aborted first. Node 1 may hear first that node 0 closed
    // the negotiation (its scheduler stops with that) before its own
    // Abort: either way its collective ends at once.
    if (n == 1 && status.code() == absl::StatusCode::kUnavailable) {
      EXPECT_THAT(status.message(), HasSubstr("node rank 0 closed"));
      continue;
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted)
        << "node " << n << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("generation 1 was aborted"));
  }
  // Far below the op timeout: the abort, not the timeout, ended it.
  EXPECT_LT(Since(start), std::chrono::milliseconds(30000));
}

TEST_F(DataPlaneGpuTest, CudaTensorWithoutGpuCommunicatorsFails) {
  Cluster gloo(1);
  ASSERT_TRUE(gloo.ConnectNegotiation());
  ASSERT_TRUE(gloo.Connect(1));
  SchedulerOptions options;
  options.job = "cpu";
  std::mutex mu;
  std::condition_variable cv;
  absl::Status result;
  bool done = false;
  Scheduler::Callbacks callbacks;
  callbacks.op_done = [&](uint64_t, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    result = status;
    done = true;
    cv.notify_all();
  };
  std::vector<std::unique_ptr<Communicator>> data;
  data.push_back(std::move(gloo.communicators[0][0]));
  Scheduler plane(options, std::move(gloo.negotiations[0]), std::move(data),
                  callbacks);
  EXPECT_FALSE(plane.has_devices());
  auto op = std::make_shared<Operation>();
  op->id = 7;
  op->tensor_name = "g";
  op->size_bytes = 4;
  op->on_device = true;
  plane.Submit(op);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(
      cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; }));
  EXPECT_EQ(result.code(), absl::StatusCode::kFailedPrecondition) << result;
  EXPECT_THAT(result.message(), HasSubstr("no GPU communicator"));
}

TEST_F(DataPlaneGpuTest, DevicesAttachedLaterRunTheWaitingWork) {
  // The agent connects NCCL only once the plan has a CUDA tensor, after the
  // data plane started; AttachDevices hands the group over then.
  Start(2, 2, GpuCrossNode::kGloo, 2000, std::chrono::milliseconds(20000),
        /*attach_later=*/true);
  WriteInputs();
  RunEverywhere(0, 0, v1::COLLECTIVE_OP_PUSH_PULL, false);
  ExpectEverywhere([&](int64_t i) { return Sum(i); });
  for (auto& node : nodes_) EXPECT_TRUE(node->plane->has_devices());
}

}  // namespace
}  // namespace baton::agent
