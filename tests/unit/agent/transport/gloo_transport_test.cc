// The host transports with N nodes as N threads in one process, each node
// with its own transport on loopback, bootstrapped through an in-memory
// store: the collectives, several communicators, failures and mismatches on
// both GlooTransport and TcpTransport (TcpRing), and the connect errors.
#include "agent/transport/gloo/gloo_transport.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/reduce.h"
#include "agent/transport/tcp/tcp_ring.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/gloo_cluster.h"
#include "tests/unit/agent/transport/typed_values.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

constexpr milliseconds kOpTimeout{10000};
// Error tests: how long a peer may stay silent before the operation fails,
// and the bound on how long a failure may take to surface (scheduling slack
// on a loaded 2-core machine included).
constexpr milliseconds kShortTimeout{500};
constexpr milliseconds kFailFast{3000};

// --- Collectives over node counts and sizes --------------------------------

enum class Size { kOneElement, kOdd, kLarge };

// Elements of `element_size` bytes for `size`; kLarge is 4 MiB + 1 element:
// several segments per peer, and a chunk that does not divide evenly.
size_t Elements(Size size, size_t element_size) {
  switch (size) {
    case Size::kOneElement:
      return 1;
    case Size::kOdd:
      return 1001;
    case Size::kLarge:
      return (size_t{4} << 20) / element_size + 1;
  }
  return 0;
}

std::string KindName(DataTransport kind) {
  return kind == DataTransport::kTcp ? "Tcp" : "Gloo";
}

const auto kKinds =
    ::testing::Values(DataTransport::kGloo, DataTransport::kTcp);

class GlooCollectivesTest
    : public ::testing::TestWithParam<std::tuple<DataTransport, int, Size>> {
 protected:
  DataTransport kind() const { return std::get<0>(GetParam()); }
  int nodes() const { return std::get<1>(GetParam()); }
  Size size() const { return std::get<2>(GetParam()); }

  // Node `rank`'s values, and their sum over every node.
  std::vector<uint8_t> Values(int rank, v1::DataType dtype,
                              size_t count) const {
    std::vector<uint8_t> data(count * ElementSize(dtype));
    for (size_t i = 0; i < count; ++i) {
      WriteElement(dtype, data.data(), i, Value(rank, i, dtype));
    }
    return data;
  }
  std::vector<uint8_t> Sum(v1::DataType dtype, size_t count) const {
    std::vector<uint8_t> sum(count * ElementSize(dtype));
    for (size_t i = 0; i < count; ++i) {
      int64_t total = 0;
      for (int rank = 0; rank < nodes(); ++rank) total += Value(rank, i, dtype);
      WriteElement(dtype, sum.data(), i, total);
    }
    return sum;
  }
};

TEST_P(GlooCollectivesTest, AllreduceIsExactForEveryType) {
  Cluster cluster(nodes(), kind());
  ASSERT_TRUE(cluster.Connect());
  for (v1::DataType dtype : kAllTypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    const size_t element_size = ElementSize(dtype);
    const size_t count = Elements(size(), element_size);
    std::vector<uint8_t> expected = Sum(dtype, count);
    OnEveryNode(nodes(), [&](int rank) {
      cluster.ExpectAllreduce(rank, Values(rank, dtype, count), dtype, count,
                              expected);
    });
  }
}

// CollectiveOptions.op: MIN, MAX and PRODUCT for every type, and the
// bitwise ops for the integer ones, the same on every node and on both
// transports. Values are -8..23, so products of up to 5 nodes wrap in the
// narrow types exactly as their reference (computed in int64, then
// narrowed) does; the floating ones hold them exactly.
TEST_P(GlooCollectivesTest, EveryReduceOpIsExact) {
  // The kernels are the sum's paths with another operation: several
  // segments per peer (kLarge) add time, not coverage.
  if (size() == Size::kLarge) GTEST_SKIP() << "covered by kOdd";
  Cluster cluster(nodes(), kind());
  ASSERT_TRUE(cluster.Connect());
  for (v1::ReduceOp op :
       {v1::REDUCE_OP_MIN, v1::REDUCE_OP_MAX, v1::REDUCE_OP_PRODUCT,
        v1::REDUCE_OP_BAND, v1::REDUCE_OP_BOR, v1::REDUCE_OP_BXOR}) {
    for (v1::DataType dtype : kAllTypes) {
      if (!ReduceOpApplies(op, dtype)) continue;
      // Products overflow what half and bfloat16 hold exactly.
      if (op == v1::REDUCE_OP_PRODUCT &&
          (dtype == v1::DATA_TYPE_FLOAT16 || dtype == v1::DATA_TYPE_BFLOAT16)) {
        continue;
      }
      SCOPED_TRACE(
          absl::StrCat(ReduceOpName(op), " ", v1::DataType_Name(dtype)));
      const size_t count = Elements(size(), ElementSize(dtype));
      std::vector<uint8_t> expected(count * ElementSize(dtype));
      for (size_t i = 0; i < count; ++i) {
        int64_t acc = Value(0, i, dtype);
        for (int rank = 1; rank < nodes(); ++rank) {
          const int64_t v = Value(rank, i, dtype);
          switch (op) {
            case v1::REDUCE_OP_MIN:
              acc = std::min(acc, v);
              break;
            case v1::REDUCE_OP_MAX:
              acc = std::max(acc, v);
              break;
            case v1::REDUCE_OP_PRODUCT:
              acc *= v;
              break;
            case v1::REDUCE_OP_BAND:
              acc &= v;
              break;
            case v1::REDUCE_OP_BOR:
              acc |= v;
              break;
            default:
              acc ^= v;
          }
        }
        WriteElement(dtype, expected.data(), i, acc);
      }
      OnEveryNode(nodes(), [&](int rank) {
        std::vector<uint8_t> data = Values(rank, dtype, count);
        CollectiveOptions options{std::chrono::milliseconds(10000), 0};
        options.op = op;
        const absl::Status status = cluster.communicators[rank][0]->Allreduce(
            data.data(), count, dtype, options);
        ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
        // A product with a zero is -0.0 where a factor was negative (IEEE);
        // the reference's zeros are +0.0.
        if (dtype == v1::DATA_TYPE_FLOAT32) {
          auto* f = reinterpret_cast<float*>(data.data());
          for (size_t i = 0; i < count; ++i) f[i] += 0.0f;
        } else if (dtype == v1::DATA_TYPE_FLOAT64) {
          auto* d = reinterpret_cast<double*>(data.data());
          for (size_t i = 0; i < count; ++i) d[i] += 0.0;
        }
        EXPECT_EQ(data, expected) << "node " << rank;
      });
    }
  }
}

// Allgather of unequal chunks on both transports: node i gives i x
// (the size's elements) + 3 bytes (node 0 just 3), some of them blocks of
// zeros (which the TCP rings leave out), and every node gets every chunk
// at its place, byte for byte. Nodes whose lengths differ fail.
TEST_P(GlooCollectivesTest, AllgatherOfUnequalChunks) {
  Cluster cluster(nodes(), kind());
  ASSERT_TRUE(cluster.Connect());
  const size_t unit = Elements(size(), 1);
  std::vector<size_t> lengths;
  std::vector<uint8_t> expected;
  for (int i = 0; i < nodes(); ++i) {
    lengths.push_back(static_cast<size_t>(i) * unit + 3);
    for (size_t b = 0; b < lengths.back(); ++b) {
      // Zero except near the chunk's ends: whole blocks of zeros between.
      const bool edge = b < 64 || b + 64 >= lengths.back();
      expected.push_back(edge ? static_cast<uint8_t>(i * 31 + b % 251 + 1) : 0);
    }
  }
  OnEveryNode(nodes(), [&](int rank) {
    std::vector<uint8_t> data(expected.size(), 0xab);
    size_t offset = 0;
    for (int i = 0; i < rank; ++i) offset += lengths[i];
    std::copy(expected.begin() + offset,
              expected.begin() + offset + lengths[rank], data.begin() + offset);
    const absl::Status status = cluster.communicators[rank][0]->Allgather(
        data.data(), lengths,
        CollectiveOptions{std::chrono::milliseconds(10000), 0});
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(FirstDifference(data, expected), -1) << "node " << rank;
  });
  // Ring nodes that disagree on the lengths fail at the first step, naming
  // both (gloo's never match, and time out; longer rings' middle nodes
  // too).
  if (kind() == DataTransport::kTcp && nodes() > 1 && nodes() <= 3 &&
      size() == Size::kOdd) {
    OnEveryNode(nodes(), [&](int rank) {
      std::vector<size_t> mine = lengths;
      if (rank == 0) mine[0] += 1;
      std::vector<uint8_t> data(expected.size() + 1);
      const absl::Status status = cluster.communicators[rank][0]->Allgather(
          data.data(), mine,
          CollectiveOptions{std::chrono::milliseconds(10000), 0});
      EXPECT_FALSE(status.ok()) << "node " << rank;
      if (rank == 1) {
        EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition)
            << status;
        EXPECT_THAT(std::string(status.message()), HasSubstr("allgather #"))
            << status;
      }
    });
    return;
  }
  // The lengths must be one per member.
  std::vector<uint8_t> one(4);
  const absl::Status wrong = cluster.communicators[0][0]->Allgather(
      one.data(), std::vector<size_t>(nodes() + 1, 1),
      CollectiveOptions{std::chrono::milliseconds(10000), 0});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
}

// Alltoall of unequal chunks on both transports: node s sends node d
// (s + 2d) x (the size's elements) / 4 + 1 bytes (so chunks of either
// direction differ, and some are one byte), with blocks of zeros between
// their ends; every node receives every chunk meant for it at its place,
// its own included, and the input is only read. Nodes whose lengths
// differ fail.
TEST_P(GlooCollectivesTest, AlltoallOfUnequalChunks) {
  if (size() == Size::kLarge && nodes() > 3) {
    GTEST_SKIP() << "covered by kOdd and by 2 and 3 nodes";
  }
  Cluster cluster(nodes(), kind());
  ASSERT_TRUE(cluster.Connect());
  const size_t n = static_cast<size_t>(nodes());
  const size_t unit = Elements(size(), 1) / 4;
  std::vector<size_t> lengths(n * n);
  for (size_t s = 0; s < n; ++s) {
    for (size_t d = 0; d < n; ++d) lengths[s * n + d] = (s + 2 * d) * unit + 1;
  }
  // Byte b of the chunk from s to d.
  const auto byte = [](size_t s, size_t d, size_t b, size_t length) {
    const bool edge = b < 64 || b + 64 >= length;
    return edge ? static_cast<uint8_t>(s * 31 + d * 7 + b % 251 + 1) : 0;
  };
  OnEveryNode(nodes(), [&](int rank) {
    const size_t me = static_cast<size_t>(rank);
    std::vector<uint8_t> send;
    std::vector<uint8_t> expected;
    for (size_t d = 0; d < n; ++d) {
      for (size_t b = 0; b < lengths[me * n + d]; ++b) {
        send.push_back(byte(me, d, b, lengths[me * n + d]));
      }
    }
    for (size_t s = 0; s < n; ++s) {
      for (size_t b = 0; b < lengths[s * n + me]; ++b) {
        expected.push_back(byte(s, me, b, lengths[s * n + me]));
      }
    }
    const std::vector<uint8_t> sent = send;
    std::vector<uint8_t> recv(expected.size(), 0xab);
    const absl::Status status = cluster.communicators[rank][0]->Alltoall(
        send.data(), recv.data(), lengths,
        CollectiveOptions{std::chrono::milliseconds(10000), 0});
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    EXPECT_EQ(FirstDifference(recv, expected), -1) << "node " << rank;
    EXPECT_EQ(send, sent) << "node " << rank;
  });
  if (kind() == DataTransport::kTcp && nodes() > 1 && nodes() <= 3 &&
      size() == Size::kOdd) {
    // Ring nodes that disagree fail at the first step, naming both.
    OnEveryNode(nodes(), [&](int rank) {
      std::vector<size_t> mine = lengths;
      if (rank == 0) mine[n * n - 1] += 1;
      std::vector<uint8_t> send(n * n * (3 * n * unit + 2));
      std::vector<uint8_t> recv(send.size());
      const absl::Status status = cluster.communicators[rank][0]->Alltoall(
          send.data(), recv.data(), mine,
          CollectiveOptions{std::chrono::milliseconds(10000), 0});
      EXPECT_FALSE(status.ok()) << "node " << rank;
      if (rank == 1) {
        EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition)
            << status;
        EXPECT_THAT(std::string(status.message()), HasSubstr("alltoall #"))
            << status;
      }
    });
    return;
  }
  // The lengths must be one per pair of members.
  std::vector<uint8_t> one(4);
  const absl::Status wrong = cluster.communicators[0][0]->Alltoall(
      one.data(), one.data(), std::vector<size_t>(n * n + 1, 1),
      CollectiveOptions{std::chrono::milliseconds(10000), 0});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
}

// Reduce-scatter of unequal chunks (node i's: i x the size's elements + 1)
// on both transports, summed and maxed in every dtype, out of place: each
// node's own chunk is exact, and the input is only read. Nodes whose
// counts differ fail.
TEST_P(GlooCollectivesTest, ReduceScatterOfUnequalChunks) {
  if (size() == Size::kLarge) GTEST_SKIP() << "covered by kOdd";
  Cluster cluster(nodes(), kind());
  ASSERT_TRUE(cluster.Connect());
  for (v1::ReduceOp op : {v1::REDUCE_OP_SUM, v1::REDUCE_OP_MAX}) {
    for (v1::DataType dtype : kAllTypes) {
      SCOPED_TRACE(
          absl::StrCat(ReduceOpName(op), " ", v1::DataType_Name(dtype)));
      const size_t element = ElementSize(dtype);
      const size_t unit = Elements(size(), element);
      std::vector<size_t> counts;
      size_t total = 0;
      for (int i = 0; i < nodes(); ++i) {
        counts.push_back(static_cast<size_t>(i) * unit + 1);
        total += counts.back();
      }
      std::vector<uint8_t> expected(total * element);
      for (size_t i = 0; i < total; ++i) {
        int64_t acc = Value(0, i, dtype);
        for (int rank = 1; rank < nodes(); ++rank) {
          const int64_t v = Value(rank, i, dtype);
          acc = op == v1::REDUCE_OP_SUM ? acc + v : std::max(acc, v);
        }
        WriteElement(dtype, expected.data(), i, acc);
      }
      OnEveryNode(nodes(), [&](int rank) {
        const std::vector<uint8_t> input = Values(rank, dtype, total);
        std::vector<uint8_t> data(input.size(), 0xab);
        CollectiveOptions options{std::chrono::milliseconds(10000), 0};
        options.op = op;
        options.input = input.data();
        const absl::Status status =
            cluster.communicators[rank][0]->ReduceScatter(data.data(), counts,
                                                          dtype, options);
        ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
        size_t begin = 0;
        for (int i = 0; i < rank; ++i) begin += counts[i];
        const std::vector<uint8_t> mine(
            data.begin() + begin * element,
            data.begin() + (begin + counts[rank]) * element);
        const std::vector<uint8_t> want(
            expected.begin() + begin * element,
            expected.begin() + (begin + counts[rank]) * element);
        EXPECT_EQ(mine, want) << "node " << rank;
        EXPECT_EQ(input, Values(rank, dtype, total)) << "node " << rank;
      });
    }
  }
  if (kind() == DataTransport::kTcp && nodes() > 1 && nodes() <= 3) {
    OnEveryNode(nodes(), [&](int rank) {
      std::vector<size_t> counts(nodes(), 4);
      if (rank == 0) counts[0] = 5;
      std::vector<uint8_t> data(4 * (4 * nodes() + 1));
      const absl::Status status = cluster.communicators[rank][0]->ReduceScatter(
          data.data(), counts, v1::DATA_TYPE_FLOAT32,
          CollectiveOptions{std::chrono::milliseconds(10000), 0});
      EXPECT_FALSE(status.ok()) << "node " << rank;
      if (rank == 1) {
        EXPECT_THAT(std::string(status.message()),
                    HasSubstr("reduce-scatter #"))
            << status;
      }
    });
  }
}

// CollectiveOptions.input and divisor: the input is only read, and the
// output is the sum divided once (an average), the same on every node.
TEST_P(GlooCollectivesTest, OutOfPlaceAverageLeavesTheInputAlone) {
  Cluster cluster(nodes(), kind());
  ASSERT_TRUE(cluster.Connect());
  const int64_t divisor = nodes() + 1;  // a world of more ranks than nodes
  for (v1::DataType dtype : kAllTypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    const size_t element_size = ElementSize(dtype);
    const size_t count = Elements(size(), element_size);
    std::vector<uint8_t> expected = Sum(dtype, count);
    DivideInPlace(dtype, expected.data(), count, divisor);
    OnEveryNode(nodes(), [&](int rank) {
      cluster.ExpectOutOfPlaceAllreduce(rank, Values(rank, dtype, count), dtype,
                                        count, divisor, expected);
    });
  }
}

TEST_P(GlooCollectivesTest, BroadcastFromEveryRoot) {
  Cluster cluster(nodes(), kind());
  ASSERT_TRUE(cluster.Connect());
  const size_t bytes = Elements(size(), 1);
  for (int root = 0; root < nodes(); ++root) {
    SCOPED_TRACE(absl::StrCat("root ", root));
    std::vector<uint8_t> expected(bytes);
    for (size_t i = 0; i < bytes; ++i) expected[i] = BytePattern(root, i);
    OnEveryNode(nodes(), [&](int rank) {
      std::vector<uint8_t> data(bytes);
      for (size_t i = 0; i < bytes; ++i) data[i] = BytePattern(rank, i);
      const absl::Status status = cluster.communicators[rank][0]->Broadcast(
          data.data(), bytes, root, CollectiveOptions{kOpTimeout, 0});
      ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
      EXPECT_EQ(FirstDifference(data, expected), -1) << "node " << rank;
    });
  }
}

std::string SizeName(Size size) {
  switch (size) {
    case Size::kOneElement:
      return "OneElement";
    case Size::kOdd:
      return "1001Elements";
    case Size::kLarge:
      return "4MiBPlusOneElement";
  }
  return "";
}

INSTANTIATE_TEST_SUITE_P(
    NodesAndSizes, GlooCollectivesTest,
    ::testing::Combine(kKinds, ::testing::Values(1, 2, 3, 4, 5),
                       ::testing::Values(Size::kOneElement, Size::kOdd,
                                         Size::kLarge)),
    [](const ::testing::TestParamInfo<std::tuple<DataTransport, int, Size>>&
           info) {
      return absl::StrCat(KindName(std::get<0>(info.param)), "_",
                          std::get<1>(info.param), "Nodes_",
                          SizeName(std::get<2>(info.param)));
    });

// The kinds and node counts of the other suites.
using KindAndNodes = std::tuple<DataTransport, int>;
std::string KindAndNodesName(
    const ::testing::TestParamInfo<KindAndNodes>& info) {
  return absl::StrCat(KindName(std::get<0>(info.param)), "_",
                      std::get<1>(info.param), "Nodes");
}

// --- Several communicators ---------------------------------------------------

class GlooCommunicatorsTest : public ::testing::TestWithParam<KindAndNodes> {};

// Each communicator is its own set of connections: one thread per
// communicator, all at once, different data on each, every result right.
TEST_P(GlooCommunicatorsTest, ParallelCommunicatorsKeepTheirData) {
  const int nodes = std::get<1>(GetParam());
  constexpr int kCommunicators = 3;
  constexpr int kRounds = 4;
  constexpr size_t kCount = (size_t{1} << 18) + 3;
  Cluster cluster(nodes, std::get<0>(GetParam()));
  ASSERT_TRUE(cluster.Connect(kCommunicators));
  for (int rank = 0; rank < nodes; ++rank) {
    for (int c = 0; c < kCommunicators; ++c) {
      EXPECT_EQ(cluster.communicators[rank][c]->rank(), rank);
      EXPECT_EQ(cluster.communicators[rank][c]->size(), nodes);
    }
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nodes; ++rank) {
    for (int c = 0; c < kCommunicators; ++c) {
      threads.emplace_back([&, rank, c] {
        Communicator& communicator = *cluster.communicators[rank][c];
        for (int round = 0; round < kRounds; ++round) {
          const int salt = c * 100 + round;
          std::vector<float> data(kCount);
          for (size_t i = 0; i < kCount; ++i) {
            data[i] = static_cast<float>((i + salt + rank * 3) % 1000);
          }
          const absl::Status status =
              communicator.Allreduce(data.data(), kCount, v1::DATA_TYPE_FLOAT32,
                                     CollectiveOptions{kOpTimeout, 0});
          ASSERT_TRUE(status.ok()) << status;
          for (size_t i = 0; i < kCount; ++i) {
            float expected = 0;
            for (int r = 0; r < nodes; ++r) {
              expected += static_cast<float>((i + salt + r * 3) % 1000);
            }
            ASSERT_EQ(data[i], expected)
                << "node " << rank << " communicator " << c << " round "
                << round << " index " << i;
          }
        }
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
}

INSTANTIATE_TEST_SUITE_P(Nodes, GlooCommunicatorsTest,
                         ::testing::Combine(kKinds,
                                            ::testing::Values(1, 2, 3, 4)),
                         KindAndNodesName);

// --- Failures ----------------------------------------------------------------

class GlooFailureTest : public ::testing::TestWithParam<KindAndNodes> {
 protected:
  DataTransport kind() const { return std::get<0>(GetParam()); }
};

// A node that drops its communicator (a crashed agent) makes every other
// node fail promptly, even those not next to it in the ring and even with a
// long timeout. On gloo each survivor closes its connections on error. A
// TCP ring keeps them (a re-form may keep them): the node that reads from
// the gone one fails at once, naming it, and the others end when the agent
// aborts their data plane, as it does on the generation change that
// follows (the one that sent to it may notice first).
TEST_P(GlooFailureTest, PeerThatDestroysItsCommunicatorFailsEveryOtherNode) {
  const int nodes = std::get<1>(GetParam());
  Cluster cluster(nodes, kind());
  ASSERT_TRUE(cluster.Connect());
  constexpr size_t kCount = size_t{1} << 20;
  const std::string what = absl::StrCat(
      "allreduce of 4194304 bytes (float32) on communicator c0 of ", nodes,
      " nodes");
  absl::Notification reader_failed;
  std::thread generation_change([&] {
    if (kind() != DataTransport::kTcp) return;
    reader_failed.WaitForNotificationWithTimeout(absl::FromChrono(kFailFast));
    for (int rank = 0; rank < nodes - 1; ++rank) {
      cluster.communicators[rank][0]->Abort(
          absl::AbortedError("generation 2 began"));
    }
  });
  OnEveryNode(nodes, [&](int rank) {
    auto& communicator = cluster.communicators[rank][0];
    if (rank == nodes - 1) {
      communicator.reset();
      return;
    }
    std::vector<float> data(kCount, 1.0f);
    const auto start = SteadyClock::now();
    const absl::Status status =
        communicator->Allreduce(data.data(), kCount, v1::DATA_TYPE_FLOAT32,
                                CollectiveOptions{kOpTimeout, 0});
    EXPECT_LT(Since(start).count(), kFailFast.count())
        << "node " << rank << ": " << status;
    // Node rank 0 reads from the gone node.
    if (rank == 0) reader_failed.Notify();
    const bool named = status.code() == absl::StatusCode::kUnavailable;
    if (rank == 0 || kind() == DataTransport::kGloo) {
      EXPECT_TRUE(named) << "node " << rank << ": " << status;
    } else if (!named) {
      // Aborted in flight, or before it started (FAILED_PRECONDITION).
      EXPECT_THAT(status.code(), AnyOf(absl::StatusCode::kAborted,
                                       absl::StatusCode::kFailedPrecondition))
          << "node " << rank << ": " << status;
      EXPECT_THAT(std::string(status.message()),
                  HasSubstr("generation 2 began"));
    }
    if (named) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(what))
          << "node " << rank;
    }
    EXPECT_TRUE(communicator->poisoned());

    const absl::Status again =
        communicator->Allreduce(data.data(), kCount, v1::DATA_TYPE_FLOAT32,
                                CollectiveOptions{kOpTimeout, 0});
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_THAT(std::string(again.message()),
                HasSubstr("communicator poisoned by"));
    EXPECT_THAT(std::string(again.message()),
                HasSubstr(named ? what : "generation 2 began"));
    int64_t value = 1;
    EXPECT_EQ(communicator
                  ->Broadcast(&value, sizeof value, 0,
                              CollectiveOptions{kOpTimeout, 0})
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  });
  generation_change.join();
}

// A node that stays connected but never joins the collective: the others
// time out after the configured timeout (not gloo's 30 s default) instead
// of hanging, and the silent node fails at once when it finally calls.
TEST_P(GlooFailureTest, SilentPeerMakesOthersTimeOut) {
  const int nodes = std::get<1>(GetParam());
  Cluster cluster(nodes, kind());
  ASSERT_TRUE(cluster.Connect());
  constexpr size_t kCount = 1000;
  std::vector<absl::Status> statuses(nodes);
  OnEveryNode(nodes - 1, [&](int rank) {
    std::vector<float> data(kCount, 1.0f);
    const auto start = SteadyClock::now();
    statuses[rank] = cluster.communicators[rank][0]->Allreduce(
        data.data(), kCount, v1::DATA_TYPE_FLOAT32,
        CollectiveOptions{kShortTimeout, 0});
    EXPECT_LT(Since(start).count(), (kShortTimeout + kFailFast).count())
        << "node " << rank << ": " << statuses[rank];
  });
  int timed_out = 0;
  for (int rank = 0; rank < nodes - 1; ++rank) {
    EXPECT_THAT(statuses[rank].code(),
                AnyOf(absl::StatusCode::kDeadlineExceeded,
                      absl::StatusCode::kUnavailable))
        << "node " << rank << ": " << statuses[rank];
    if (statuses[rank].code() == absl::StatusCode::kDeadlineExceeded) {
      ++timed_out;
      EXPECT_THAT(statuses[rank].message(), HasSubstr("timed out"));
    }
    EXPECT_TRUE(cluster.communicators[rank][0]->poisoned());
  }
  EXPECT_GE(timed_out, 1);

  // The silent node's peers closed their connections to it.
  std::vector<float> data(kCount, 1.0f);
  const auto start = SteadyClock::now();
  const absl::Status late = cluster.communicators[nodes - 1][0]->Allreduce(
      data.data(), kCount, v1::DATA_TYPE_FLOAT32,
      CollectiveOptions{kShortTimeout, 0});
  EXPECT_THAT(late.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                 absl::StatusCode::kUnavailable))
      << late;
  EXPECT_LT(Since(start).count(), (kShortTimeout + kFailFast).count()) << late;
}

INSTANTIATE_TEST_SUITE_P(Nodes, GlooFailureTest,
                         ::testing::Combine(kKinds, ::testing::Values(2, 3, 4)),
                         KindAndNodesName);

// Regression: gloo's event-loop thread threw (std::terminate, the whole
// agent gone) when a peer's message was larger than the receive posted for
// it. Nodes that disagree on size or type now fail the operation instead.
TEST(GlooMismatchTest, NodesThatDisagreeOnSizeOrTypeFailInsteadOfCrashing) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Connect(3));
  std::vector<absl::Status> sizes(2), types(2), broadcasts(2);
  OnEveryNode(2, [&](int rank) {
    const CollectiveOptions options{kShortTimeout, 0};
    std::vector<float> data(rank == 0 ? 1000 : 3000, 1.0f);
    sizes[rank] = cluster.communicators[rank][0]->Allreduce(
        data.data(), data.size(), v1::DATA_TYPE_FLOAT32, options);
    // Same bytes, different element size: different segment sizes.
    std::vector<uint8_t> bytes(4002);
    types[rank] = cluster.communicators[rank][1]->Allreduce(
        bytes.data(), rank == 0 ? 1000 : 2001,
        rank == 0 ? v1::DATA_TYPE_FLOAT32 : v1::DATA_TYPE_FLOAT16, options);
    broadcasts[rank] = cluster.communicators[rank][2]->Broadcast(
        bytes.data(), rank == 0 ? 4002 : 100, 0, options);
  });
  for (int rank = 0; rank < 2; ++rank) {
    for (const absl::Status& status :
         {sizes[rank], types[rank], broadcasts[rank]}) {
      EXPECT_THAT(status.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                       absl::StatusCode::kUnavailable))
          << "node " << rank << ": " << status;
    }
  }
}

// TcpRing: every operation starts with a header, so nodes that disagree on
// the collective, its size, type or root fail at once with
// FAILED_PRECONDITION naming both sides, instead of at the timeout.
TEST(TcpRingMismatchTest, NodesThatDisagreeFailAtOnceNamingBothSides) {
  Cluster cluster(2, DataTransport::kTcp);
  ASSERT_TRUE(cluster.Connect(4));
  std::vector<absl::Status> sizes(2), types(2), roots(2), kinds(2);
  const auto start = SteadyClock::now();
  OnEveryNode(2, [&](int rank) {
    const CollectiveOptions options{kOpTimeout, 0};
    std::vector<float> data(rank == 0 ? 1000 : 3000, 1.0f);
    sizes[rank] = cluster.communicators[rank][0]->Allreduce(
        data.data(), data.size(), v1::DATA_TYPE_FLOAT32, options);
    std::vector<uint8_t> bytes(4002);
    types[rank] = cluster.communicators[rank][1]->Allreduce(
        bytes.data(), 1000,
        rank == 0 ? v1::DATA_TYPE_FLOAT32 : v1::DATA_TYPE_INT32, options);
    roots[rank] = cluster.communicators[rank][2]->Broadcast(bytes.data(), 100,
                                                            rank, options);
    kinds[rank] = rank == 0
                      ? cluster.communicators[rank][3]->Broadcast(
                            bytes.data(), 400, 0, options)
                      : cluster.communicators[rank][3]->Allreduce(
                            bytes.data(), 100, v1::DATA_TYPE_FLOAT32, options);
  });
  EXPECT_LT(Since(start).count(), kFailFast.count());
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("node ", rank));
    EXPECT_EQ(sizes[rank].code(), absl::StatusCode::kFailedPrecondition)
        << sizes[rank];
    EXPECT_THAT(sizes[rank].message(), HasSubstr("of 4000 bytes"));
    EXPECT_THAT(sizes[rank].message(), HasSubstr("of 12000 bytes"));
    EXPECT_THAT(sizes[rank].message(),
                HasSubstr("disagree on the order of collectives"));
    EXPECT_EQ(types[rank].code(), absl::StatusCode::kFailedPrecondition)
        << types[rank];
    EXPECT_THAT(types[rank].message(), HasSubstr("dtype"));
    // Each node is the root it names: neither sends what the other awaits,
    // both send a header.
    EXPECT_EQ(roots[rank].code(), absl::StatusCode::kFailedPrecondition)
        << roots[rank];
    EXPECT_THAT(roots[rank].message(), HasSubstr("root 0"));
    EXPECT_THAT(roots[rank].message(), HasSubstr("root 1"));
    EXPECT_EQ(kinds[rank].code(), absl::StatusCode::kFailedPrecondition)
        << kinds[rank];
    EXPECT_TRUE(cluster.communicators[rank][0]->poisoned());
  }
  EXPECT_THAT(kinds[1].message(), HasSubstr("runs broadcast"));
}

// Abort (the data plane stopping on a generation change) ends a collective
// that waits for a silent neighbour at once, not at its timeout, and names
// the reason.
TEST(TcpRingTest, AbortEndsACollectiveInFlightAtOnce) {
  Cluster cluster(2, DataTransport::kTcp);
  ASSERT_TRUE(cluster.Connect());
  Communicator& communicator = *cluster.communicators[0][0];
  absl::Notification started;
  absl::Status status;
  std::thread waiter([&] {
    std::vector<float> data(1000, 1.0f);
    started.Notify();
    status =
        communicator.Allreduce(data.data(), data.size(), v1::DATA_TYPE_FLOAT32,
                               CollectiveOptions{kOpTimeout, 0});
  });
  started.WaitForNotification();
  const auto start = SteadyClock::now();
  communicator.Abort(absl::AbortedError("generation 1 was aborted"));
  waiter.join();
  EXPECT_LT(Since(start).count(), kFailFast.count()) << status;
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("generation 1 was aborted"));
  EXPECT_TRUE(communicator.poisoned());
  // The connection stays up (a re-form may keep it): the neighbour's
  // collective ends at its own abort, or its timeout.
  std::vector<float> data(1000, 1.0f);
  const absl::Status peer = cluster.communicators[1][0]->Allreduce(
      data.data(), data.size(), v1::DATA_TYPE_FLOAT32,
      CollectiveOptions{kShortTimeout, 0});
  EXPECT_EQ(peer.code(), absl::StatusCode::kDeadlineExceeded) << peer;
}

// A ring connects each node to its two neighbours only, under its own keys.
TEST(TcpRingTest, MissingNeighbourGivesDeadlineExceededNamingIt) {
  Cluster cluster(3, DataTransport::kTcp);
  std::vector<absl::Status> statuses(2);
  OnEveryNode(2, [&](int rank) {
    statuses[rank] = cluster.transports[rank]
                         ->Connect(cluster.Request(rank, 1, kShortTimeout))
                         .status();
  });
  // Both wait for node 2's address (a node reads every neighbour's first:
  // it may keep a connection with any of them).
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kDeadlineExceeded)
      << statuses[0];
  EXPECT_THAT(std::string(statuses[0].message()),
              HasSubstr("still missing \"baton/job/1/ring/c0/2\""));
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kDeadlineExceeded)
      << statuses[1];
  EXPECT_THAT(statuses[1].message(),
              HasSubstr("connecting communicator c0 of 3"));
  EXPECT_THAT(statuses[1].message(), HasSubstr("baton/job/1/ring/c0"));
}

TEST(GlooConnectTest, MissingPeerGivesDeadlineExceededNamingIt) {
  Cluster cluster(3);
  std::vector<absl::Status> statuses(2);
  OnEveryNode(2, [&](int rank) {
    const auto start = SteadyClock::now();
    statuses[rank] = cluster.transports[rank]
                         ->Connect(cluster.Request(rank, 2, kShortTimeout))
                         .status();
    EXPECT_LT(Since(start).count(), (kShortTimeout + kFailFast).count())
        << statuses[rank];
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(statuses[rank].code(), absl::StatusCode::kDeadlineExceeded)
        << statuses[rank];
    EXPECT_THAT(statuses[rank].message(),
                HasSubstr("node rank(s) 2 did not publish their gloo address"));
    EXPECT_THAT(statuses[rank].message(),
                HasSubstr("communicator c0 of 3 nodes"));
    EXPECT_THAT(statuses[rank].message(), HasSubstr("baton/job/1/c0/2"));
  }
}

TEST(GlooConnectTest, AbortedStoreGivesAborted) {
  Cluster cluster(2);
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    cluster.store->Abort(absl::AbortedError(
        "job \"job\" generation 1 was aborted while this Get waited"));
  });
  const auto start = SteadyClock::now();
  const absl::Status status =
      cluster.transports[0]
          ->Connect(cluster.Request(0, 1, kConnectTimeout))
          .status();
  aborter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(), HasSubstr("was aborted while this Get waited"));
  EXPECT_LT(Since(start).count(), kFailFast.count());
}

TEST(GlooConnectTest, InvalidRequestsAreRejected) {
  Cluster cluster(1);
  Transport& transport = *cluster.transports[0];
  ConnectRequest request = cluster.Request(0, 1, kShortTimeout);
  request.node_rank = 1;
  EXPECT_EQ(transport.Connect(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request = cluster.Request(0, 0, kShortTimeout);
  EXPECT_EQ(transport.Connect(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request = cluster.Request(0, 1, kShortTimeout);
  request.store = nullptr;
  EXPECT_EQ(transport.Connect(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request = cluster.Request(0, 1, kShortTimeout);
  request.prefix.clear();
  EXPECT_EQ(transport.Connect(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request = cluster.Request(0, 1, milliseconds(0));
  EXPECT_EQ(transport.Connect(request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooConnectTest, AddressThatIsNotLocalIsRejected) {
  // 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
  const auto transport = GlooTransport::Create("192.0.2.1");
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kInvalidArgument)
      << transport.status();
  EXPECT_THAT(transport.status().message(), HasSubstr("192.0.2.1"));
}

// Regression: gloo's own lookup ignores getaddrinfo's error and crashed
// (SIGSEGV) on a name that does not resolve.
TEST(GlooConnectTest, NameThatDoesNotResolveIsRejected) {
  const auto transport = GlooTransport::Create("no-such-host.invalid");
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kInvalidArgument)
      << transport.status();
  EXPECT_THAT(transport.status().message(),
              HasSubstr("cannot resolve the data-plane address"));
}

// Bad arguments are answered without touching the network: no node hangs
// and the communicator stays usable.
TEST(GlooArgumentsTest, InvalidArgumentsDoNotPoison) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Connect());
  const CollectiveOptions options{kOpTimeout, 0};
  OnEveryNode(2, [&](int rank) {
    Communicator& communicator = *cluster.communicators[rank][0];
    EXPECT_EQ(communicator.Allreduce(nullptr, 4, v1::DATA_TYPE_FLOAT32, options)
                  .code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        communicator.Allreduce(nullptr, 0, v1::DATA_TYPE_FLOAT32, options)
            .ok());
    float x = 1;
    const absl::Status unspecified =
        communicator.Allreduce(&x, 1, v1::DATA_TYPE_UNSPECIFIED, options);
    EXPECT_EQ(unspecified.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(unspecified.message(), HasSubstr("unsupported data type"));
    EXPECT_EQ(
        communicator.Allreduce(&x, 1, static_cast<v1::DataType>(99), options)
            .code(),
        absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(communicator
                  .Allreduce(&x, 1, v1::DATA_TYPE_FLOAT32,
                             CollectiveOptions{milliseconds(0), 0})
                  .code(),
              absl::StatusCode::kInvalidArgument);
    const absl::Status root = communicator.Broadcast(&x, sizeof x, 2, options);
    EXPECT_EQ(root.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(root.message(), HasSubstr("root 2 is not a node rank"));
    EXPECT_EQ(communicator.Broadcast(&x, sizeof x, -1, options).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(communicator.Broadcast(nullptr, 4, 0, options).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(communicator.Broadcast(nullptr, 0, 0, options).ok());
    EXPECT_FALSE(communicator.poisoned());

    std::vector<int32_t> data(10, rank + 1);
    const absl::Status status = communicator.Allreduce(
        data.data(), data.size(), v1::DATA_TYPE_INT32, options);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(data, std::vector<int32_t>(10, 3));
  });
}

}  // namespace
}  // namespace baton::agent
