// The agent's data plane on a real GPU with its trainers in other
// processes: each trainer (ipc_trainer.h) holds two float32 tensors in
// one cudaMalloc allocation on device 0 and an interprocess ready event,
// and hands their CUDA IPC handles over a pipe; the agents open them
// (CreateCudaDeviceMemory), run push-pull and broadcast through Scheduler
// with real gloo on loopback and the real NCCL transport, and each trainer
// checks the result in its own memory. Expected results are exact
// (integer-valued floats).
//
// Without a CUDA device it prints "skipped: no CUDA device (<why>)" and
// exits with 77, which ctest reports as Skipped (SKIP_RETURN_CODE). Where
// processes cannot share CUDA memory (no CUDA IPC, exclusive-process mode)
// the tests report Skipped with CUDA's error.
//
// Layouts (one GPU is enough):
// - one agent, --gpu_cross_node=nccl: a one-rank NCCL group, so results
//   equal the step's input; what is checked is the path (handles opened at
//   two offsets of one allocation, ready events waited for, NCCL in place on
//   IPC memory, partition by partition);
// - two agents sharing the GPU, --gpu_cross_node=gloo (each ConnectLocal on
//   device 0, gloo between them): real sums, averages and broadcasts across
//   the two trainers through the host stage.
#include <array>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/scheduler/scheduler.h"
#include "agent/transport/memory_key_value_store.h"
#include "agent/transport/nccl/cuda_device_memory.h"
#include "agent/transport/nccl/cuda_nccl_api.h"
#include "agent/transport/nccl/local_gpus.h"
#include "agent/transport/nccl/nccl_transport.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_main.h"
#include "tests/gpu/trainer_process.h"
#include "tests/unit/agent/transport/gloo_cluster.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;

// Set by main before the tests run.
gpu::GpuApi* g_api = nullptr;

// A trainer's tensors: 1 Mi + 3 float32 (five partitions, the last one 12
// bytes) and 1001 (one partition), in one allocation.
constexpr std::array<int64_t, 2> kElements = {(int64_t{1} << 18) + 3, 1001};
constexpr int kTensors = static_cast<int>(kElements.size());
constexpr int64_t kPartitionBytes = 256 << 10;

// Generous: a trainer's first CUDA call creates its context; NCCL's first
// initialization takes seconds. check.sh bounds the whole binary.
constexpr milliseconds kTrainerStartTimeout{30000};
constexpr milliseconds kTrainerTimeout{20000};
constexpr milliseconds kNcclConnectTimeout{30000};
constexpr milliseconds kOpTimeout{15000};
constexpr std::chrono::seconds kOpWait{25};

// Tensor ids of the plan: one per tensor and kind of operation.
enum Kind { kSum = 0, kAverage = 1, kBroadcast = 2 };
uint32_t TensorId(int tensor, Kind kind) {
  return static_cast<uint32_t>(tensor * 3 + kind);
}

// One agent and its trainer.
struct Agent {
  std::unique_ptr<TrainerProcess> trainer;
  bool trainer_ready = false;
  std::unique_ptr<DeviceMemory> memory;
  std::unique_ptr<NcclTransport> transport;
  // The trainer's tensors as opened here, by tensor, and its ready event.
  std::vector<std::shared_ptr<DeviceBuffer>> buffers;
  std::unique_ptr<DeviceEvent> ready;
  // The hierarchical path's host stage, by tensor.
  std::vector<std::vector<uint8_t>> stages;
  std::unique_ptr<Scheduler> plane;

  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, absl::Status> done;
  absl::Status stopped;

  absl::Status WaitDone(uint64_t id) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, kOpWait, [&] { return done.count(id) > 0; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation ", id, " not done after ", kOpWait.count(),
                       " s (data plane stopped: ", stopped.ToString(), ")"));
    }
    return done[id];
  }
};

class DataPlaneIpcTest : public ::testing::Test {
 protected:
  // Starts `agents` agents, each with a trainer process; false when the
  // test cannot go on (a failure, or Skipped without CUDA IPC).
  bool Start(int agents, GpuCrossNode cross_node) {
    StartAgents(agents, cross_node);
    return !HasFatalFailure() && !IsSkipped();
  }

  void StartAgents(int agents, GpuCrossNode cross_node) {
    agents_count_ = agents;
    const bool staged = cross_node == GpuCrossNode::kGloo && agents > 1;
    const std::vector<int64_t> elements(kElements.begin(), kElements.end());
    // The trainers start first, and make their CUDA contexts in parallel.
    for (int a = 0; a < agents; ++a) {
      auto agent = std::make_unique<Agent>();
      auto trainer = TrainerProcess::Start(elements);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      agent->trainer = std::move(*trainer);
      agents_.push_back(std::move(agent));
    }
    for (int a = 0; a < agents; ++a) {
      const absl::Status ready =
          agents_[a]->trainer->AwaitReady(kTrainerStartTimeout);
      if (absl::IsFailedPrecondition(ready)) GTEST_SKIP() << ready.message();
      ASSERT_TRUE(ready.ok()) << "agent " << a << ": " << ready;
      agents_[a]->trainer_ready = true;
    }
    for (int a = 0; a < agents; ++a) {
      Agent& agent = *agents_[a];
      auto memory = CreateCudaDeviceMemory(g_api, {0});
      ASSERT_TRUE(memory.ok()) << memory.status();
      agent.memory = std::move(*memory);
      NcclTransport::Options options;
      options.devices = {0};
      auto transport = NcclTransport::Create(g_api, options);
      ASSERT_TRUE(transport.ok()) << transport.status();
      agent.transport = std::move(*transport);
      for (int t = 0; t < kTensors; ++t) {
        auto buffer = agent.memory->Open(agent.trainer->Spec(t));
        ASSERT_TRUE(buffer.ok())
            << "agent " << a << " tensor " << t << ": " << buffer.status();
        ASSERT_EQ((*buffer)->local_device(), 0);
        agent.buffers.push_back(std::move(*buffer));
        agent.stages.emplace_back(staged ? kElements[t] * sizeof(float) : 0);
      }
      auto ready = agent.memory->OpenEvent(agent.trainer->Spec(0));
      ASSERT_TRUE(ready.ok()) << "agent " << a << ": " << ready.status();
      agent.ready = std::move(*ready);
    }

    // The negotiation (its own TCP connections); one data channel and the
    // host stage between agents over gloo.
    gloo_ = std::make_unique<Cluster>(agents);
    ASSERT_TRUE(gloo_->ConnectNegotiation());
    ASSERT_TRUE(gloo_->Connect(staged ? 2 : 1));
    std::vector<std::unique_ptr<DeviceCommunicator>> device_comms(agents);
    if (cross_node == GpuCrossNode::kNccl) {
      // One GPU: NCCL takes one rank per GPU, so one node.
      ASSERT_EQ(agents, 1);
      ConnectRequest request;
      request.node_rank = 0;
      request.num_nodes = 1;
      request.prefix = "baton/job/1/gpu/";
      request.store = std::make_shared<MemoryKeyValueStore>();
      request.count = 1;
      request.timeout = kNcclConnectTimeout;
      auto comms = agents_[0]->transport->ConnectDevices(request);
      ASSERT_TRUE(comms.ok()) << comms.status();
      ASSERT_EQ(comms->size(), 1u);
      device_comms[0] = std::move((*comms)[0]);
    } else {
      for (int a = 0; a < agents; ++a) {
        auto local = agents_[a]->transport->ConnectLocal(kNcclConnectTimeout);
        ASSERT_TRUE(local.ok()) << "agent " << a << ": " << local.status();
        device_comms[a] = std::move(*local);
      }
    }
    for (int a = 0; a < agents; ++a) {
      Agent* agent = agents_[a].get();
      SchedulerOptions options;
      options.job = "gpu-ipc";
      options.generation = 1;
      options.node_rank = a;
      options.num_nodes = agents;
      options.world_size = agents;  // one trainer (GPU) per agent
      options.credit_bytes = 2 * kPartitionBytes;
      options.op_timeout = kOpTimeout;
      Scheduler::Callbacks callbacks;
      callbacks.op_done = [agent](uint64_t id, absl::Status status) {
        std::lock_guard<std::mutex> lock(agent->mu);
        agent->done[id] = status;
        agent->cv.notify_all();
      };
      callbacks.stopped = [agent](absl::Status status) {
        std::lock_guard<std::mutex> lock(agent->mu);
        agent->stopped = status;
      };
      auto& comms = gloo_->communicators[a];
      std::vector<std::unique_ptr<Communicator>> data;
      data.push_back(std::move(comms[0]));
      DeviceGroup group;
      group.cross_node = cross_node;
      group.comm = std::move(device_comms[a]);
      group.memory = agent->memory.get();
      if (staged) group.host = std::move(comms[1]);
      agent->plane = std::make_unique<Scheduler>(
          options, std::move(gloo_->negotiations[a]), std::move(data),
          callbacks, std::move(group));
      agent->plane->SetKnownTensors(kTensors * 3);
    }
  }

  // The agents let go of the trainers' memory before the trainers free it;
  // every trainer then exits 0 (its cudaEventDestroy and cudaFree worked).
  void TearDown() override {
    for (auto& agent : agents_) agent->plane.reset();
    for (auto& agent : agents_) {
      agent->buffers.clear();
      agent->ready.reset();
      agent->memory.reset();
      agent->transport.reset();
    }
    gloo_.reset();
    for (size_t a = 0; a < agents_.size(); ++a) {
      if (agents_[a]->trainer_ready) {
        const absl::Status quit = agents_[a]->trainer->Quit(kTrainerTimeout);
        EXPECT_TRUE(quit.ok()) << "agent " << a << ": " << quit;
      }
      agents_[a]->trainer.reset();
    }
    agents_.clear();
  }

  // Agent `a`'s trainer writes `multiplier` into tensor `tensor` and
  // records its ready event.
  void Write(int a, int tensor, int64_t multiplier) {
    const absl::Status status =
        agents_[a]->trainer->Write(tensor, multiplier, kTrainerTimeout);
    ASSERT_TRUE(status.ok()) << "agent " << a << ": " << status;
  }

  // Agent `a`'s trainer finds `multiplier` in tensor `tensor`.
  void Check(int a, int tensor, int64_t multiplier) {
    const absl::Status status =
        agents_[a]->trainer->Check(tensor, multiplier, kTrainerTimeout);
    EXPECT_TRUE(status.ok()) << "agent " << a << ": " << status;
  }

  // Every agent submits the operation on tensor `tensor`; all succeed.
  void Run(int tensor, Kind kind, int64_t step, int root = -1) {
    std::vector<uint64_t> ids;
    for (int a = 0; a < agents_count_; ++a) {
      auto op = std::make_shared<Operation>();
      op->tensor_id = TensorId(tensor, kind);
      op->id = op->tensor_id * 1000 + static_cast<uint64_t>(step) + 1;
      op->tensor_name = absl::StrCat("t", tensor, "/", kind);
      op->step = step;
      op->kind = kind == kBroadcast ? v1::COLLECTIVE_OP_BROADCAST
                                    : v1::COLLECTIVE_OP_PUSH_PULL;
      op->dtype = v1::DATA_TYPE_FLOAT32;
      op->average = kind == kAverage;
      op->size_bytes = kElements[tensor] * static_cast<int64_t>(sizeof(float));
      op->partition_bytes = kPartitionBytes;
      op->on_device = true;
      Agent& agent = *agents_[a];
      op->device_buffers.push_back(
          static_cast<uint8_t*>(agent.buffers[tensor]->data()));
      op->ready.push_back(agent.ready.get());
      if (!agent.stages[tensor].empty()) {
        op->output = agent.stages[tensor].data();
      }
      if (kind == kBroadcast) {
        op->root_rank = root;
        op->root_node = root;  // one GPU per agent
        op->root_local = root == a ? 0 : -1;
      }
      ids.push_back(op->id);
      agent.plane->Submit(std::move(op));
    }
    for (int a = 0; a < agents_count_; ++a) {
      const absl::Status status = agents_[a]->WaitDone(ids[a]);
      ASSERT_TRUE(status.ok()) << "agent " << a << ", tensor " << tensor
                               << ", step " << step << ": " << status;
    }
  }

  int agents_count_ = 0;
  std::unique_ptr<Cluster> gloo_;
  std::vector<std::unique_ptr<Agent>> agents_;
};

TEST_F(DataPlaneIpcTest, NcclOneAgentPushPullAndBroadcastInPlace) {
  if (!Start(1, GpuCrossNode::kNccl)) return;
  for (int64_t step = 0; step < 2; ++step) {
    for (int t = 0; t < kTensors; ++t) {
      // A new input each time: a stale result would show.
      const int64_t m = 10 * (step + 1) + 3 * t;
      ASSERT_NO_FATAL_FAILURE(Write(0, t, m));
      ASSERT_NO_FATAL_FAILURE(Run(t, kSum, step));
      Check(0, t, m);
      ASSERT_NO_FATAL_FAILURE(Write(0, t, m + 1));
      ASSERT_NO_FATAL_FAILURE(Run(t, kAverage, step));
      Check(0, t, m + 1);
      ASSERT_NO_FATAL_FAILURE(Write(0, t, m + 2));
      ASSERT_NO_FATAL_FAILURE(Run(t, kBroadcast, step, /*root=*/0));
      Check(0, t, m + 2);
    }
  }
}

TEST_F(DataPlaneIpcTest, GlooTwoAgentsSharingTheGpuPushPull) {
  if (!Start(2, GpuCrossNode::kGloo)) return;
  for (int64_t step = 0; step < 2; ++step) {
    for (int t = 0; t < kTensors; ++t) {
      // Even, different per agent, step and tensor: the average is exact.
      const int64_t m0 = 2 * (1 + step + 2 * t);
      const int64_t m1 = 4 * m0;
      ASSERT_NO_FATAL_FAILURE(Write(0, t, m0));
      ASSERT_NO_FATAL_FAILURE(Write(1, t, m1));
      ASSERT_NO_FATAL_FAILURE(Run(t, kSum, step));
      Check(0, t, m0 + m1);
      Check(1, t, m0 + m1);
      ASSERT_NO_FATAL_FAILURE(Write(0, t, m0));
      ASSERT_NO_FATAL_FAILURE(Write(1, t, m1));
      ASSERT_NO_FATAL_FAILURE(Run(t, kAverage, step));
      Check(0, t, (m0 + m1) / 2);
      Check(1, t, (m0 + m1) / 2);
    }
  }
}

TEST_F(DataPlaneIpcTest, GlooTwoAgentsSharingTheGpuBroadcastFromEitherRoot) {
  if (!Start(2, GpuCrossNode::kGloo)) return;
  for (int root = 0; root < 2; ++root) {
    for (int t = 0; t < kTensors; ++t) {
      const int64_t m[2] = {3 + root + 10 * t, 50 + root + 10 * t};
      ASSERT_NO_FATAL_FAILURE(Write(0, t, m[0]));
      ASSERT_NO_FATAL_FAILURE(Write(1, t, m[1]));
      ASSERT_NO_FATAL_FAILURE(Run(t, kBroadcast, /*step=*/root, root));
      Check(0, t, m[root]);
      Check(1, t, m[root]);
    }
  }
}

}  // namespace
}  // namespace baton::agent

int main(int argc, char** argv) {
  // A trainer: this binary started again by TrainerProcess.
  if (argc > 1 && absl::StartsWith(argv[1], baton::agent::kTrainerFlag)) {
    return baton::agent::RunTrainer(argv[1] +
                                    std::strlen(baton::agent::kTrainerFlag));
  }
  // A trainer that dies must not take the test with it.
  std::signal(SIGPIPE, SIG_IGN);
  baton::agent::SetTrainerProgram(argv[0]);
  return baton::agent::GpuTestMain(
      "data_plane_gpu_ipc_test", argc, argv,
      [](baton::agent::gpu::GpuApi* api, int) { baton::agent::g_api = api; });
}
