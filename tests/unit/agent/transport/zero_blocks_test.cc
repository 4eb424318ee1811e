// ZeroBlocks, and TcpRing's allreduce steps that leave out the blocks that
// are all zero: N nodes as N threads on loopback (Cluster), every data type,
// blocks zero on some nodes and not on others, out of place with a divisor,
// and nodes that never skip beside nodes that do.
#include "agent/transport/tcp/zero_blocks.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/reduce.h"
#include "agent/transport/tcp/tcp_ring.h"
#include "agent/transport/tcp/tcp_transport.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/gloo_cluster.h"
#include "tests/unit/agent/transport/typed_values.h"

namespace baton::agent {
namespace {

constexpr size_t kBlock = ZeroBlocks::kBlockBytes;
constexpr std::chrono::milliseconds kOpTimeout{10000};

TEST(ZeroBlocksTest, ScanMarksTheBlocksThatHoldANonzeroByte) {
  // Four blocks, the last one 100 bytes: 0 and 3 hold a nonzero byte (the
  // very last byte of each), 1 and 2 are zero.
  std::vector<uint8_t> data(3 * kBlock + 100, 0);
  data[kBlock - 1] = 1;
  data.back() = 0x80;
  std::vector<uint8_t> bitmap;
  EXPECT_EQ(ZeroBlocks::Scan(data.data(), data.size(), &bitmap), 2u);
  ASSERT_EQ(bitmap.size(), 1u);
  EXPECT_EQ(bitmap[0], 0b1001);
  EXPECT_EQ(ZeroBlocks::Count(data.size()), 4u);
  EXPECT_EQ(ZeroBlocks::Length(data.size(), 3), 100u);
  EXPECT_EQ(ZeroBlocks::Length(data.size(), 2), kBlock);

  // -0.0 is data, not zero.
  std::vector<float> negative_zero(kBlock / sizeof(float), -0.0f);
  EXPECT_EQ(ZeroBlocks::Scan(reinterpret_cast<uint8_t*>(negative_zero.data()),
                             kBlock, &bitmap),
            1u);
}

TEST(ZeroBlocksTest, SkipsWhenAtLeastOneBlockInEightIsZero) {
  EXPECT_FALSE(ZeroBlocks::WorthSkipping(8 * kBlock, 8));
  EXPECT_TRUE(ZeroBlocks::WorthSkipping(8 * kBlock, 7));
  EXPECT_FALSE(ZeroBlocks::WorthSkipping(9 * kBlock, 8));
  EXPECT_TRUE(ZeroBlocks::WorthSkipping(9 * kBlock, 0));
  EXPECT_FALSE(ZeroBlocks::WorthSkipping(0, 0));
}

TEST(ZeroBlocksTest, PresentListsTheMarkedBlocksAndRejectsWhatCannotBe) {
  const size_t bytes = 10 * kBlock + 1;  // 11 blocks: 2 bitmap bytes
  std::vector<uint8_t> bitmap = {0b00000101, 0b00000100};
  absl::StatusOr<std::vector<uint32_t>> present =
      ZeroBlocks::Present(bitmap, bytes, 3);
  ASSERT_TRUE(present.ok()) << present.status();
  EXPECT_EQ(*present, (std::vector<uint32_t>{0, 2, 10}));

  // A block past the last one (11), more or fewer blocks than declared, a
  // bitmap of the wrong size, more blocks declared than there are.
  EXPECT_FALSE(ZeroBlocks::Present({0b101, 0b1100}, bytes, 4).ok());
  EXPECT_FALSE(ZeroBlocks::Present(bitmap, bytes, 2).ok());
  EXPECT_FALSE(ZeroBlocks::Present(bitmap, bytes, 4).ok());
  EXPECT_FALSE(ZeroBlocks::Present({0b101}, bytes, 2).ok());
  EXPECT_FALSE(ZeroBlocks::Present({0, 0}, bytes, 12).ok());
  const absl::Status status =
      ZeroBlocks::Present({0, 0b1000}, bytes, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("block 11 past the last one"),
            std::string::npos)
      << status;
}

// Whether node `rank` zeroes block `block` of its data: every node some
// blocks, no block on every node but those of every fifth, which are zero
// everywhere; node 1 none at all (dense: its steps go unframed by blocks
// while the others' are sparse).
bool Zeroed(int rank, size_t block) {
  if (block % 5 == 0) return true;
  if (rank == 1) return false;
  return (block + static_cast<size_t>(rank)) % 3 != 0;
}

class TcpRingZeroBlocksTest : public ::testing::TestWithParam<int> {
 protected:
  int nodes() const { return GetParam(); }

  // Node `rank`'s values with its zeroed blocks, and the sum over every
  // node. An element never straddles blocks (kBlock is a multiple of every
  // element size).
  static std::vector<uint8_t> Values(int rank, v1::DataType dtype,
                                     size_t count) {
    const size_t element = ElementSize(dtype);
    std::vector<uint8_t> data(count * element);
    for (size_t i = 0; i < count; ++i) {
      const bool zero = Zeroed(rank, i * element / kBlock);
      WriteElement(dtype, data.data(), i, zero ? 0 : Value(rank, i, dtype));
    }
    return data;
  }
  std::vector<uint8_t> Sum(v1::DataType dtype, size_t count) const {
    const size_t element = ElementSize(dtype);
    std::vector<uint8_t> sum(count * element);
    for (size_t i = 0; i < count; ++i) {
      int64_t total = 0;
      for (int rank = 0; rank < nodes(); ++rank) {
        if (!Zeroed(rank, i * element / kBlock)) total += Value(rank, i, dtype);
      }
      WriteElement(dtype, sum.data(), i, total);
    }
    return sum;
  }
};

// In place, every type, 1 MiB + 3 elements: several scratch segments of
// blocks per step, and chunks that do not end on a block.
TEST_P(TcpRingZeroBlocksTest, SumIsExactWhateverBlocksAreZero) {
  Cluster cluster(nodes(), DataTransport::kTcp);
  ASSERT_TRUE(cluster.Connect());
  for (v1::DataType dtype : kAllTypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    const size_t count = (size_t{1} << 20) / ElementSize(dtype) + 3;
    const std::vector<uint8_t> expected = Sum(dtype, count);
    OnEveryNode(nodes(), [&](int rank) {
      cluster.ExpectAllreduce(rank, Values(rank, dtype, count), dtype, count,
                              expected);
    });
  }
  // Every node but node 1 left blocks out (node 1's own data is dense, but
  // what it passes on in later steps has zero blocks too).
  for (int rank = 0; rank < nodes(); ++rank) {
    const auto* ring =
        dynamic_cast<const TcpRing*>(cluster.communicators[rank][0].get());
    ASSERT_NE(ring, nullptr);
    if (rank != 1) {
      EXPECT_GT(ring->skipped_bytes(), 0u) << "node " << rank;
    }
  }
}

// Out of place with a divisor, into an output full of garbage: the blocks
// nobody sent are written too (the input's, or zero), and the input is only
// read. Node 0 never skips: what it receives it reads either way.
TEST_P(TcpRingZeroBlocksTest, OutOfPlaceAverageFillsTheSkippedBlocks) {
  Cluster cluster(nodes(), DataTransport::kTcp);
  auto dense = TcpTransport::Create("127.0.0.1", Clock::Real(),
                                    /*skip_zero_blocks=*/false);
  ASSERT_TRUE(dense.ok()) << dense.status();
  cluster.transports[0] = std::move(dense).value();
  ASSERT_TRUE(cluster.Connect());
  const int64_t divisor = 2;
  for (v1::DataType dtype :
       {v1::DATA_TYPE_FLOAT32, v1::DATA_TYPE_BFLOAT16, v1::DATA_TYPE_INT64}) {
    SCOPED_TRACE(v1::DataType_Name(dtype));
    const size_t count = (size_t{3} << 18) / ElementSize(dtype) + 1;
    std::vector<uint8_t> expected = Sum(dtype, count);
    DivideInPlace(dtype, expected.data(), count, divisor);
    OnEveryNode(nodes(), [&](int rank) {
      cluster.ExpectOutOfPlaceAllreduce(rank, Values(rank, dtype, count), dtype,
                                        count, divisor, expected);
    });
  }
  const auto* never =
      dynamic_cast<const TcpRing*>(cluster.communicators[0][0].get());
  ASSERT_NE(never, nullptr);
  EXPECT_EQ(never->skipped_bytes(), 0u);
}

// Nothing but zeros, on every node: only preambles and bitmaps cross, and
// the output is zero.
TEST_P(TcpRingZeroBlocksTest, AllZeroGivesZero) {
  Cluster cluster(nodes(), DataTransport::kTcp);
  ASSERT_TRUE(cluster.Connect());
  const size_t count = 100 * kBlock / sizeof(float) + 5;
  OnEveryNode(nodes(), [&](int rank) {
    std::vector<float> input(count, 0.0f);
    std::vector<float> output(count, 1.5f);
    CollectiveOptions options{kOpTimeout, 0};
    options.input = input.data();
    const absl::Status status = cluster.communicators[rank][0]->Allreduce(
        output.data(), count, v1::DATA_TYPE_FLOAT32, options);
    ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(output[i], 0.0f) << "node " << rank << " index " << i;
    }
  });
}

// A block of zeros is the identity of a sum only: for MIN and MAX the
// zero blocks one node holds take part like any value (the ring sends them
// whole), for every type. Values are -8..23 (0..31 unsigned), so zeros win
// the min of signed types and lose their max.
TEST_P(TcpRingZeroBlocksTest, MinAndMaxCountTheZeroBlocks) {
  Cluster cluster(nodes(), DataTransport::kTcp);
  ASSERT_TRUE(cluster.Connect());
  for (v1::ReduceOp op : {v1::REDUCE_OP_MIN, v1::REDUCE_OP_MAX}) {
    for (v1::DataType dtype : kAllTypes) {
      SCOPED_TRACE(
          absl::StrCat(ReduceOpName(op), " ", v1::DataType_Name(dtype)));
      const size_t count = (size_t{1} << 18) / ElementSize(dtype) + 3;
      const size_t element = ElementSize(dtype);
      std::vector<uint8_t> expected(count * element);
      for (size_t i = 0; i < count; ++i) {
        int64_t best = 0;
        for (int rank = 0; rank < nodes(); ++rank) {
          const int64_t v =
              Zeroed(rank, i * element / kBlock) ? 0 : Value(rank, i, dtype);
          best = rank == 0                 ? v
                 : op == v1::REDUCE_OP_MIN ? std::min(best, v)
                                           : std::max(best, v);
        }
        WriteElement(dtype, expected.data(), i, best);
      }
      OnEveryNode(nodes(), [&](int rank) {
        std::vector<uint8_t> data = Values(rank, dtype, count);
        CollectiveOptions options{kOpTimeout, 0};
        options.op = op;
        const absl::Status status = cluster.communicators[rank][0]->Allreduce(
            data.data(), count, dtype, options);
        ASSERT_TRUE(status.ok()) << "node " << rank << ": " << status;
        EXPECT_EQ(data, expected) << "node " << rank;
      });
    }
  }
}

// Nodes that ask for different ops fail, naming both, instead of combining
// the values two ways.
TEST_P(TcpRingZeroBlocksTest, NodesDisagreeingOnTheOpFailNamingBoth) {
  // Up to 3 nodes every node sees a disagreeing neighbour or a closed link
  // at once; in longer rings the nodes between only hear of it at the
  // timeout (the agent's negotiation catches a disagreement on the op
  // before any ring runs).
  if (nodes() > 3) GTEST_SKIP() << "the nodes between wait for the timeout";
  Cluster cluster(nodes(), DataTransport::kTcp);
  ASSERT_TRUE(cluster.Connect());
  OnEveryNode(nodes(), [&](int rank) {
    std::vector<float> data(1000, 1.0f);
    CollectiveOptions options{kOpTimeout, 0};
    options.op = rank == 0 ? v1::REDUCE_OP_MAX : v1::REDUCE_OP_MIN;
    const absl::Status status = cluster.communicators[rank][0]->Allreduce(
        data.data(), data.size(), v1::DATA_TYPE_FLOAT32, options);
    EXPECT_FALSE(status.ok()) << "node " << rank;
    if (rank == 1) {
      // Node 1 reads node 0's header.
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(status.message().find("max"), std::string::npos) << status;
      EXPECT_NE(status.message().find("min"), std::string::npos) << status;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Nodes, TcpRingZeroBlocksTest,
                         ::testing::Values(2, 3, 5),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Nodes");
                         });

}  // namespace
}  // namespace baton::agent
