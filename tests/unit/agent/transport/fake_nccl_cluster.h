#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "agent/transport/memory_key_value_store.h"
#include "agent/transport/nccl/nccl_transport.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/fake_gpu_api.h"
#include "tests/unit/agent/transport/node_threads.h"

// Test helpers for the NCCL transport: N nodes as N threads of one process,
// each with its own FakeGpuApi and NcclTransport, sharing one fake NCCL
// fabric and an in-memory store.

namespace baton::agent {

// Bounds connecting and every collective that is meant to succeed.
inline constexpr std::chrono::milliseconds kTimeout{10000};

// `nodes` agents, each with `devices[node]` fake GPUs and its own transport,
// sharing the fabric and the store.
struct FakeCluster {
  std::shared_ptr<FakeNcclFabric> fabric = std::make_shared<FakeNcclFabric>();
  std::shared_ptr<MemoryKeyValueStore> store =
      std::make_shared<MemoryKeyValueStore>();
  std::vector<std::unique_ptr<FakeGpuApi>> apis;
  std::vector<std::unique_ptr<NcclTransport>> transports;
  // [node][group]
  std::vector<std::vector<std::unique_ptr<DeviceCommunicator>>> communicators;

  explicit FakeCluster(std::vector<int> devices, Clock* clock = nullptr) {
    for (int count : devices) {
      apis.push_back(std::make_unique<FakeGpuApi>(
          fabric, FakeGpuApi::Options{count, gpu::kCudaSuccess}));
      NcclTransport::Options options;
      for (int d = 0; d < count; ++d) options.devices.push_back(d);
      options.clock = clock;
      auto transport = NcclTransport::Create(apis.back().get(), options);
      EXPECT_TRUE(transport.ok()) << transport.status();
      transports.push_back(std::move(transport).value());
    }
    communicators.resize(devices.size());
  }

  // Checks that the test left nothing live and misused nothing.
  ~FakeCluster() {
    communicators.clear();
    for (size_t node = 0; node < apis.size(); ++node) {
      EXPECT_THAT(apis[node]->misuses(), ::testing::IsEmpty())
          << "node " << node;
      EXPECT_EQ(apis[node]->live_comms(), 0) << "node " << node;
      EXPECT_EQ(apis[node]->live_streams(), 0) << "node " << node;
      EXPECT_EQ(apis[node]->live_events(), 0) << "node " << node;
    }
  }

  int nodes() const { return static_cast<int>(apis.size()); }

  ConnectRequest Request(int node, int count,
                         std::chrono::milliseconds timeout) const {
    ConnectRequest request;
    request.node_rank = node;
    request.num_nodes = nodes();
    request.prefix = "baton/job/1/g3";
    request.store = store;
    request.count = count;
    request.timeout = timeout;
    return request;
  }

  // Connects `count` groups on every node; true when all did.
  bool Connect(int count = 1) {
    OnEveryNode(nodes(), [&](int node) {
      auto connected =
          transports[node]->ConnectDevices(Request(node, count, kTimeout));
      ASSERT_TRUE(connected.ok())
          << "node " << node << ": " << connected.status();
      communicators[node] = std::move(connected).value();
    });
    for (const auto& node : communicators) {
      if (node.size() != static_cast<size_t>(count)) return false;
    }
    return true;
  }

  DeviceCommunicator& communicator(int node, int group = 0) {
    return *communicators[node][group];
  }
};

// One device buffer per local device of a fake node (host memory, so the
// test reads and writes it directly).
class DeviceBuffers {
 public:
  DeviceBuffers(FakeGpuApi& api, int devices, size_t bytes) : api_(api) {
    for (int d = 0; d < devices; ++d) {
      EXPECT_EQ(api_.SetDevice(d), gpu::kCudaSuccess);
      void* pointer = nullptr;
      EXPECT_EQ(api_.Malloc(&pointer, bytes), gpu::kCudaSuccess);
      pointers_.push_back(pointer);
    }
  }
  ~DeviceBuffers() {
    for (void* pointer : pointers_) api_.Free(pointer);
  }
  const std::vector<void*>& pointers() const { return pointers_; }
  uint8_t* bytes(int local) { return static_cast<uint8_t*>(pointers_[local]); }

 private:
  FakeGpuApi& api_;
  std::vector<void*> pointers_;
};

inline std::vector<uint8_t> Copy(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  return std::vector<uint8_t>(p, p + bytes);
}

}  // namespace baton::agent
