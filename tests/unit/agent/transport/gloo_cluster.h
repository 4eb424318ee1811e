#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/scheduler/operation.h"
#include "agent/transport/gloo/gloo_transport.h"
#include "agent/transport/memory_key_value_store.h"
#include "agent/transport/tcp/tcp_transport.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/node_threads.h"
#include "tests/unit/agent/transport/typed_values.h"

// Test helpers for the host transports: N nodes as N threads of one
// process, each with its own transport (GlooTransport, or TcpTransport) on
// loopback, sharing an in-memory store.

namespace baton::agent {

inline constexpr std::chrono::milliseconds kConnectTimeout{10000};
// What the coordinator would hand out as the generation's data-plane secret.
inline const std::string kTestSecret(32, '\x5a');

// `nodes` agents, each with its own transport, sharing one store.
struct Cluster {
  std::shared_ptr<MemoryKeyValueStore> store =
      std::make_shared<MemoryKeyValueStore>();
  std::vector<std::unique_ptr<Transport>> transports;
  // [node rank][communicator index]
  std::vector<std::vector<std::unique_ptr<Communicator>>> communicators;
  // [node rank]: the negotiation rounds (ConnectNegotiation).
  std::vector<std::unique_ptr<NegotiationWire>> negotiations;
  // The wire ConnectNegotiation asks for (auto: all-to-all up to
  // NegotiationChoice::kAllToAllUpTo nodes).
  NegotiationChoice negotiation;

  explicit Cluster(int nodes, DataTransport kind = DataTransport::kGloo,
                   GlooTransport::Options options = {}) {
    for (int rank = 0; rank < nodes; ++rank) {
      if (kind == DataTransport::kTcp) {
        auto transport = TcpTransport::Create("127.0.0.1");
        EXPECT_TRUE(transport.ok()) << transport.status();
        transports.push_back(std::move(transport).value());
      } else {
        auto transport = GlooTransport::Create("127.0.0.1", options);
        EXPECT_TRUE(transport.ok()) << transport.status();
        transports.push_back(std::move(transport).value());
      }
    }
    communicators.resize(nodes);
    negotiations.resize(nodes);
  }

  int nodes() const { return static_cast<int>(transports.size()); }

  ConnectRequest Request(int rank, int count,
                         std::chrono::milliseconds timeout) const {
    ConnectRequest request;
    request.node_rank = rank;
    request.num_nodes = nodes();
    request.prefix = "baton/job/1/";
    request.store = store;
    request.count = count;
    request.timeout = timeout;
    request.secret = kTestSecret;
    request.negotiation = negotiation;
    return request;
  }

  // Connects `count` communicators on every node; true when all did.
  bool Connect(int count = 1) {
    OnEveryNode(nodes(), [&](int rank) {
      auto connected =
          transports[rank]->Connect(Request(rank, count, kConnectTimeout));
      ASSERT_TRUE(connected.ok())
          << "node " << rank << ": " << connected.status();
      communicators[rank] = std::move(connected).value();
    });
    for (const auto& node : communicators) {
      if (node.size() != static_cast<size_t>(count)) return false;
    }
    return true;
  }

  // Node `rank`'s allreduce of `data` in place: it must become `expected`.
  void ExpectAllreduce(int rank, std::vector<uint8_t> data, v1::DataType dtype,
                       size_t count, const std::vector<uint8_t>& expected) {
    const absl::Status status = communicators[rank][0]->Allreduce(
        data.data(), count, dtype,
        CollectiveOptions{std::chrono::milliseconds(10000), 0});
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(FirstDifference(data, expected), -1)
        << "node " << rank << " (byte index of the first wrong value)";
  }

  // Node `rank`'s out-of-place allreduce of `input` (`count` elements of
  // `dtype`) with `divisor`, into an output full of 0xab: the output must
  // be `expected`, and the input as it was.
  void ExpectOutOfPlaceAllreduce(int rank, std::vector<uint8_t> input,
                                 v1::DataType dtype, size_t count,
                                 int64_t divisor,
                                 const std::vector<uint8_t>& expected) {
    const std::vector<uint8_t> original = input;
    std::vector<uint8_t> output(input.size(), 0xab);
    CollectiveOptions options{std::chrono::milliseconds(10000), 0};
    options.input = input.data();
    options.divisor = divisor;
    const absl::Status status =
        communicators[rank][0]->Allreduce(output.data(), count, dtype, options);
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(FirstDifference(output, expected), -1) << "node " << rank;
    EXPECT_EQ(FirstDifference(input, original), -1)
        << "node " << rank << ": the input was written";
  }

  // Connects the negotiation rounds on every node; true when all did.
  bool ConnectNegotiation() {
    OnEveryNode(nodes(), [&](int rank) {
      auto connected = transports[rank]->ConnectNegotiation(
          Request(rank, 1, kConnectTimeout));
      ASSERT_TRUE(connected.ok())
          << "node " << rank << ": " << connected.status();
      negotiations[rank] = std::move(connected).value();
    });
    for (const auto& negotiation : negotiations) {
      if (negotiation == nullptr) return false;
    }
    return true;
  }
};

}  // namespace baton::agent
