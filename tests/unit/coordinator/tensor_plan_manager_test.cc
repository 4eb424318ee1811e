#include "coordinator/tensor_plan_manager.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr char kJob[] = "job";
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kPartitionBytes = 4 * kMiB;

// Nodes in node_rank order, as (name, local_size); rank offsets accumulate.
v1::Membership MakeMembership(
    int64_t generation, const std::vector<std::pair<std::string, int>>& nodes) {
  v1::Membership membership;
  membership.set_job(kJob);
  membership.set_generation(generation);
  int rank_offset = 0;
  for (const auto& [name, local_size] : nodes) {
    v1::NodeInfo* node = membership.add_nodes();
    node->set_node_name(name);
    node->set_data_address(absl::StrCat(name, ":7000"));
    node->set_node_rank(membership.nodes_size() - 1);
    node->set_local_size(local_size);
    node->set_rank_offset(rank_offset);
    rank_offset += local_size;
  }
  membership.set_world_size(rank_offset);
  return membership;
}

v1::TensorSpec Spec(const std::string& name, std::vector<int64_t> shape,
                    v1::DataType dtype = v1::DATA_TYPE_FLOAT32,
                    v1::CollectiveOp op = v1::COLLECTIVE_OP_PUSH_PULL) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(dtype);
  for (int64_t dim : shape) spec.add_shape(dim);
  spec.set_op(op);
  return spec;
}

// `spec` as version `version` of its name.
v1::TensorSpec Version(v1::TensorSpec spec, int32_t version) {
  spec.set_version(version);
  return spec;
}

v1::Manifest MakeManifest(int64_t generation,
                          const std::vector<v1::TensorSpec>& specs) {
  v1::Manifest manifest;
  manifest.set_job(kJob);
  manifest.set_generation(generation);
  for (const v1::TensorSpec& spec : specs) *manifest.add_tensors() = spec;
  return manifest;
}

// "id name priority size partitions", one string per plan entry.
std::vector<std::string> Entries(const v1::TensorPlan& plan) {
  std::vector<std::string> entries;
  for (const v1::TensorPlanEntry& entry : plan.tensors()) {
    entries.push_back(absl::StrCat(
        entry.tensor_id(), " ", entry.spec().name(), " p", entry.priority(),
        " ", entry.size_bytes(), "B ", entry.num_partitions(), "x"));
  }
  return entries;
}

// "value ranks=[..] nodes=[..]", one string per mismatch value.
std::vector<std::string> Values(const v1::TensorMismatch& mismatch) {
  std::vector<std::string> values;
  for (const v1::MismatchValue& value : mismatch.values()) {
    values.push_back(absl::StrCat(
        value.value(), " ranks=[", absl::StrJoin(value.ranks(), ","),
        "] nodes=[", absl::StrJoin(value.nodes(), ","), "]"));
  }
  return values;
}

class TensorPlanManagerTest : public ::testing::Test {
 protected:
  // Two nodes: n0 with ranks 0 and 1, n1 with rank 2.
  void SetUp() override { Seal(MakeMembership(1, {{"n0", 2}, {"n1", 1}})); }

  std::optional<v1::TensorPlan> Seal(const v1::Membership& membership) {
    membership_ = membership;
    return manager_.OnGenerationSealed(membership, kPartitionBytes);
  }

  TensorPlanManager::ManifestOutcome Declare(
      const std::string& node, const std::vector<v1::TensorSpec>& specs,
      int64_t global_step = -1) {
    absl::StatusOr<TensorPlanManager::ManifestOutcome> outcome =
        manager_.OnManifest(membership_, node,
                            MakeManifest(membership_.generation(), specs),
                            global_step);
    EXPECT_TRUE(outcome.ok()) << outcome.status();
    return outcome.ok() ? *std::move(outcome)
                        : TensorPlanManager::ManifestOutcome();
  }

  absl::Status DeclareStatus(const std::string& node,
                             const std::vector<v1::TensorSpec>& specs) {
    return manager_
        .OnManifest(membership_, node,
                    MakeManifest(membership_.generation(), specs), -1)
        .status();
  }

  TensorPlanManager manager_;
  v1::Membership membership_;
};

// --- ValidateSpec ---------------------------------------------------------

TEST(ValidateSpecTest, SizeBytesUsesEachDtypesElementSize) {
  const std::vector<std::pair<v1::DataType, int64_t>> sizes = {
      {v1::DATA_TYPE_FLOAT32, 4}, {v1::DATA_TYPE_FLOAT64, 8},
      {v1::DATA_TYPE_FLOAT16, 2}, {v1::DATA_TYPE_BFLOAT16, 2},
      {v1::DATA_TYPE_INT32, 4},   {v1::DATA_TYPE_INT64, 8},
      {v1::DATA_TYPE_UINT8, 1},   {v1::DATA_TYPE_INT8, 1}};
  for (const auto& [dtype, element_size] : sizes) {
    const v1::TensorSpec spec = Spec("t", {3, 5}, dtype);
    EXPECT_TRUE(TensorPlanManager::ValidateSpec("t", spec).ok());
    EXPECT_EQ(TensorPlanManager::SizeBytes(spec), 15 * element_size)
        << v1::DataType_Name(dtype);
  }
}

TEST(ValidateSpecTest, ScalarIsOneElementAndZeroDimIsEmpty) {
  EXPECT_TRUE(TensorPlanManager::ValidateSpec("t", Spec("s", {})).ok());
  EXPECT_EQ(TensorPlanManager::SizeBytes(Spec("s", {}, v1::DATA_TYPE_INT64)),
            8);
  // A zero dimension empties the tensor whatever the other dims are.
  const v1::TensorSpec empty = Spec("e", {int64_t{1} << 62, 0});
  EXPECT_TRUE(TensorPlanManager::ValidateSpec("t", empty).ok());
  EXPECT_EQ(TensorPlanManager::SizeBytes(empty), 0);
}

TEST(ValidateSpecTest, AcceptsExactly16GiB) {
  const v1::TensorSpec spec = Spec("big", {int64_t{1} << 32});  // float32
  EXPECT_TRUE(TensorPlanManager::ValidateSpec("t", spec).ok());
  EXPECT_EQ(TensorPlanManager::SizeBytes(spec),
            TensorPlanManager::kMaxTensorBytes);
}

TEST(ValidateSpecTest, RejectsEmptyName) {
  const absl::Status status =
      TensorPlanManager::ValidateSpec("Manifest.tensors[2]", Spec("", {1}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[2].name is empty: every tensor needs a name");
}

TEST(ValidateSpecTest, RejectsANegativeOrTooHighVersion) {
  v1::TensorSpec spec = Spec("w", {1});
  spec.set_version(-1);
  const absl::Status status =
      TensorPlanManager::ValidateSpec("Manifest.tensors[0]", spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[0].version of tensor \"w\" is -1; it must be "
            "in 0..1000000 (the name's earlier declarations)");
  spec.set_version(kMaxTensorVersion + 1);
  EXPECT_FALSE(TensorPlanManager::ValidateSpec("t", spec).ok());
  spec.set_version(kMaxTensorVersion);
  EXPECT_TRUE(TensorPlanManager::ValidateSpec("t", spec).ok());
}

TEST(ValidateSpecTest, RejectsUnknownAndUnspecifiedDtype) {
  const absl::Status unknown = TensorPlanManager::ValidateSpec(
      "Manifest.tensors[0]", Spec("w", {1}, static_cast<v1::DataType>(99)));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(),
            "Manifest.tensors[0].dtype of tensor \"w\" is 99, not a known "
            "DataType: declare one of float32, float64, float16, bfloat16, "
            "int32, int64, uint8, int8");
  const absl::Status unspecified = TensorPlanManager::ValidateSpec(
      "Manifest.tensors[0]", Spec("w", {1}, v1::DATA_TYPE_UNSPECIFIED));
  EXPECT_EQ(unspecified.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unspecified.message(),
              HasSubstr(".dtype of tensor \"w\" is unspecified: declare one"));
}

TEST(ValidateSpecTest, RejectsAnUnknownOpAndARankStackedShapeWithoutRanks) {
  const absl::Status unspecified = TensorPlanManager::ValidateSpec(
      "x",
      Spec("w", {1}, v1::DATA_TYPE_FLOAT32, v1::COLLECTIVE_OP_UNSPECIFIED));
  EXPECT_EQ(unspecified.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unspecified.message(),
            "x.op of tensor \"w\" is unspecified: declare push_pull, "
            "broadcast, allgather, reduce_scatter or alltoall");
  // An allgather's, a reduce-scatter's and an alltoall's first dimension is
  // the world size: at least one.
  for (v1::CollectiveOp op :
       {v1::COLLECTIVE_OP_ALLGATHER, v1::COLLECTIVE_OP_REDUCE_SCATTER,
        v1::COLLECTIVE_OP_ALLTOALL}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{}, std::vector<int64_t>{0, 4}}) {
      const absl::Status no_ranks = TensorPlanManager::ValidateSpec(
          "x", Spec("w", shape, v1::DATA_TYPE_FLOAT32, op));
      EXPECT_EQ(no_ranks.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(no_ranks.message(),
                  HasSubstr("shape is [world size, one rank's shape...]"));
    }
    EXPECT_TRUE(TensorPlanManager::ValidateSpec(
                    "x", Spec("w", {3, 2}, v1::DATA_TYPE_FLOAT32, op))
                    .ok());
  }
  const absl::Status unknown = TensorPlanManager::ValidateSpec(
      "x",
      Spec("w", {1}, v1::DATA_TYPE_FLOAT32, static_cast<v1::CollectiveOp>(7)));
  EXPECT_THAT(unknown.message(), HasSubstr("is 7, not a known CollectiveOp"));
  EXPECT_TRUE(
      TensorPlanManager::ValidateSpec("x", Spec("w", {1}, v1::DATA_TYPE_FLOAT32,
                                                v1::COLLECTIVE_OP_BROADCAST))
          .ok());
}

TEST(ValidateSpecTest, RejectsNegativeDimension) {
  const absl::Status status = TensorPlanManager::ValidateSpec(
      "Manifest.tensors[1]", Spec("w", {4, -3}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[1].shape[1] of tensor \"w\" is -3: dimensions "
            "must be >= 0");
}

TEST(ValidateSpecTest, RejectsNineDimensions) {
  EXPECT_TRUE(
      TensorPlanManager::ValidateSpec("x", Spec("w", {1, 1, 1, 1, 1, 1, 1, 1}))
          .ok());
  const absl::Status status = TensorPlanManager::ValidateSpec(
      "x", Spec("w", {1, 1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "x.shape of tensor \"w\" has 9 dimensions; the limit is 8: "
            "reshape it");
}

TEST(ValidateSpecTest, RejectsProductThatOverflowsInt64) {
  // 2^40 * 2^40 * 4 bytes wraps a 64-bit product; it must not pass as small.
  const int64_t dim = int64_t{1} << 40;
  const absl::Status status =
      TensorPlanManager::ValidateSpec("x", Spec("w", {dim, dim}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "x.shape of tensor \"w\" ([1099511627776, 1099511627776] float32) "
            "holds more than 16 GiB, the most one tensor may hold: split it "
            "into smaller tensors");
  const int64_t huge = int64_t{1} << 62;
  EXPECT_EQ(TensorPlanManager::ValidateSpec(
                "x", Spec("w", {huge, huge, huge}, v1::DATA_TYPE_FLOAT64))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateSpecTest, RejectsOneByteOver16GiB) {
  const absl::Status status = TensorPlanManager::ValidateSpec(
      "x", Spec("w", {(int64_t{16} << 30) + 1}, v1::DATA_TYPE_UINT8));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("holds more than 16 GiB"));
}

// --- Planning ---------------------------------------------------------------

TEST_F(TensorPlanManagerTest, PlansOnceEveryNodeDeclared) {
  const std::vector<v1::TensorSpec> specs = {
      Spec("embedding", {10 * kMiB / 4}),  // 10 MiB in 4 MiB partitions: 3
      Spec("exact", {kMiB}),               // exactly one partition
      Spec("scalar", {}, v1::DATA_TYPE_INT64, v1::COLLECTIVE_OP_BROADCAST),
      Spec("empty", {0, 7})};
  const auto first = Declare("n0", specs);
  EXPECT_FALSE(first.plan.has_value());
  EXPECT_EQ(manager_.Plan(kJob), nullptr);

  const auto second = Declare("n1", specs);
  ASSERT_TRUE(second.plan.has_value());
  EXPECT_THAT(second.mismatches, IsEmpty());
  const v1::TensorPlan& plan = *second.plan;
  EXPECT_EQ(plan.job(), kJob);
  EXPECT_EQ(plan.generation(), 1);
  EXPECT_EQ(plan.version(), 1);
  EXPECT_EQ(plan.effective_step(), 0);
  EXPECT_EQ(plan.partition_bytes(), kPartitionBytes);
  EXPECT_THAT(
      Entries(plan),
      ElementsAre("0 embedding p0 10485760B 3x", "1 exact p1 4194304B 1x",
                  "2 scalar p2 8B 1x", "3 empty p3 0B 1x"));
  EXPECT_EQ(plan.tensors(2).spec().op(), v1::COLLECTIVE_OP_BROADCAST);
  ASSERT_NE(manager_.Plan(kJob), nullptr);
  EXPECT_EQ(manager_.Plan(kJob)->version(), 1);
}

TEST_F(TensorPlanManagerTest, OrdersNewEntriesByLowestNodeRank) {
  Declare("n1", {Spec("a", {1}), Spec("b", {1}), Spec("c", {1})});
  const auto outcome =
      Declare("n0", {Spec("c", {1}), Spec("a", {1}), Spec("b", {1})});
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_THAT(Entries(*outcome.plan),
              ElementsAre("0 c p0 4B 1x", "1 a p1 4B 1x", "2 b p2 4B 1x"));
}

TEST_F(TensorPlanManagerTest, WaitsForTensorsSomeNodesHaveNotDeclared) {
  Declare("n0", {Spec("a", {1}), Spec("b", {1})});
  const auto outcome = Declare("n1", {Spec("a", {1})});
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_THAT(Entries(*outcome.plan), ElementsAre("0 a p0 4B 1x"));

  const auto later = Declare("n1", {Spec("a", {1}), Spec("b", {1})}, 41);
  ASSERT_TRUE(later.plan.has_value());
  EXPECT_EQ(later.plan->version(), 2);
  EXPECT_EQ(later.plan->effective_step(), 42);
  EXPECT_THAT(Entries(*later.plan),
              ElementsAre("0 a p0 4B 1x", "1 b p1 4B 1x"));
}

TEST_F(TensorPlanManagerTest, AppendedTensorsGetNextIdsAndKeepOldEntries) {
  Declare("n0", {Spec("a", {2, 3}), Spec("b", {4})});
  const auto v1 = Declare("n1", {Spec("a", {2, 3}), Spec("b", {4})});
  ASSERT_TRUE(v1.plan.has_value());

  EXPECT_FALSE(
      Declare("n0", {Spec("a", {2, 3}), Spec("b", {4}), Spec("c", {8})}, 9)
          .plan.has_value());
  const auto v2 =
      Declare("n1", {Spec("a", {2, 3}), Spec("b", {4}), Spec("c", {8})}, 10);
  ASSERT_TRUE(v2.plan.has_value());
  EXPECT_EQ(v2.plan->version(), 2);
  EXPECT_EQ(v2.plan->effective_step(), 11);
  EXPECT_THAT(Entries(*v2.plan),
              ElementsAre("0 a p0 24B 1x", "1 b p1 16B 1x", "2 c p2 32B 1x"));
}

TEST_F(TensorPlanManagerTest, ResentManifestChangesNothing) {
  const std::vector<v1::TensorSpec> specs = {Spec("a", {1})};
  Declare("n0", specs);
  ASSERT_TRUE(Declare("n1", specs).plan.has_value());
  const auto again = Declare("n1", specs);
  EXPECT_FALSE(again.plan.has_value());
  EXPECT_THAT(again.mismatches, IsEmpty());
  EXPECT_EQ(manager_.Plan(kJob)->version(), 1);
}

TEST_F(TensorPlanManagerTest, SingleNodeJobPlansOnItsFirstManifest) {
  Seal(MakeMembership(2, {{"solo", 8}}));
  const auto outcome = Declare("solo", {Spec("w", {3})});
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_EQ(outcome.plan->generation(), 2);
  EXPECT_THAT(Entries(*outcome.plan), ElementsAre("0 w p0 12B 1x"));
}

// --- Mismatches -------------------------------------------------------------

TEST_F(TensorPlanManagerTest, ShapeMismatchNamesValuesRanksAndNodes) {
  EXPECT_THAT(Declare("n0", {Spec("w", {3, 4})}).mismatches, IsEmpty());
  const auto outcome = Declare("n1", {Spec("w", {4, 3})});
  EXPECT_FALSE(outcome.plan.has_value());
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  const v1::TensorMismatch& mismatch = outcome.mismatches[0];
  EXPECT_EQ(mismatch.tensor(), "w");
  EXPECT_EQ(mismatch.field(), "shape");
  EXPECT_THAT(Values(mismatch), ElementsAre("[3, 4] ranks=[0,1] nodes=[n0]",
                                            "[4, 3] ranks=[2] nodes=[n1]"));

  const std::vector<v1::TensorMismatchStatus> statuses =
      manager_.Mismatches(kJob);
  ASSERT_THAT(statuses, SizeIs(1));
  EXPECT_EQ(statuses[0].tensor(), "w");
  EXPECT_EQ(statuses[0].field(), "shape");
  EXPECT_EQ(statuses[0].message(),
            "tensor \"w\" has shape [3, 4] on ranks {0,1} (node n0) but "
            "[4, 3] on ranks {2} (node n1): declare it identically on every "
            "rank");
}

TEST_F(TensorPlanManagerTest, MismatchRanksFollowHeterogeneousLocalSizes) {
  Seal(MakeMembership(2, {{"n0", 4}, {"n1", 1}, {"n2", 3}}));
  Declare("n2", {Spec("w", {1}, v1::DATA_TYPE_FLOAT32)});
  EXPECT_THAT(Declare("n0", {Spec("w", {1}, v1::DATA_TYPE_FLOAT32)}).mismatches,
              IsEmpty());
  const auto outcome = Declare("n1", {Spec("w", {1}, v1::DATA_TYPE_FLOAT16)});
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  EXPECT_EQ(outcome.mismatches[0].field(), "dtype");
  // Values come in the order of the lowest node rank that holds them.
  EXPECT_THAT(Values(outcome.mismatches[0]),
              ElementsAre("float32 ranks=[0,1,2,3,5,6,7] nodes=[n0,n2]",
                          "float16 ranks=[4] nodes=[n1]"));
  EXPECT_EQ(manager_.Mismatches(kJob)[0].message(),
            "tensor \"w\" has dtype float32 on ranks {0-3,5-7} (nodes n0, n2) "
            "but float16 on ranks {4} (node n1): declare it identically on "
            "every rank");
}

TEST_F(TensorPlanManagerTest, ReportsEachTensorAndFieldOnce) {
  Seal(MakeMembership(2, {{"n0", 1}, {"n1", 1}, {"n2", 1}}));
  Declare("n0", {Spec("w", {1}, v1::DATA_TYPE_FLOAT32)});
  ASSERT_THAT(Declare("n1", {Spec("w", {1}, v1::DATA_TYPE_INT32)}).mismatches,
              SizeIs(1));
  // A third dtype is the same (tensor, field): not reported again.
  EXPECT_THAT(Declare("n2", {Spec("w", {1}, v1::DATA_TYPE_INT8)}).mismatches,
              IsEmpty());
  EXPECT_THAT(manager_.Mismatches(kJob), SizeIs(1));
}

TEST_F(TensorPlanManagerTest, ReportsEveryDifferingFieldSeparately) {
  Declare("n0",
          {Spec("w", {2}, v1::DATA_TYPE_FLOAT32, v1::COLLECTIVE_OP_PUSH_PULL)});
  const auto outcome = Declare("n1", {Spec("w", {2}, v1::DATA_TYPE_BFLOAT16,
                                           v1::COLLECTIVE_OP_BROADCAST)});
  ASSERT_THAT(outcome.mismatches, SizeIs(2));
  EXPECT_EQ(outcome.mismatches[0].field(), "dtype");
  EXPECT_THAT(Values(outcome.mismatches[0]),
              ElementsAre("float32 ranks=[0,1] nodes=[n0]",
                          "bfloat16 ranks=[2] nodes=[n1]"));
  EXPECT_EQ(outcome.mismatches[1].field(), "op");
  EXPECT_THAT(Values(outcome.mismatches[1]),
              ElementsAre("push_pull ranks=[0,1] nodes=[n0]",
                          "broadcast ranks=[2] nodes=[n1]"));
}

TEST(ValidateSpecTest, RejectsAnUnknownMemoryKind) {
  v1::TensorSpec spec = Spec("w", {1});
  spec.set_memory(static_cast<v1::MemoryKind>(5));
  const absl::Status unknown = TensorPlanManager::ValidateSpec("x", spec);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(),
            "x.memory of tensor \"w\" is 5, not a known MemoryKind: declare "
            "host or cuda");
  spec.set_memory(v1::MEMORY_KIND_CUDA);
  EXPECT_TRUE(TensorPlanManager::ValidateSpec("x", spec).ok());
}

TEST_F(TensorPlanManagerTest, HostOnOneNodeAndCudaOnAnotherIsMismatch) {
  Declare("n0", {Spec("w", {2})});
  v1::TensorSpec cuda = Spec("w", {2});
  cuda.set_memory(v1::MEMORY_KIND_CUDA);
  const auto outcome = Declare("n1", {cuda});
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  EXPECT_EQ(outcome.mismatches[0].field(), "memory");
  EXPECT_THAT(
      Values(outcome.mismatches[0]),
      ElementsAre("host ranks=[0,1] nodes=[n0]", "cuda ranks=[2] nodes=[n1]"));
  EXPECT_FALSE(outcome.plan.has_value());
}

TEST_F(TensorPlanManagerTest, MismatchRetiresOnlyItsOwnTensor) {
  Declare("n0", {Spec("ok", {1}), Spec("w", {3}), Spec("after", {2})});
  const auto outcome =
      Declare("n1", {Spec("ok", {1}), Spec("w", {5}), Spec("after", {2})});
  EXPECT_THAT(outcome.mismatches, SizeIs(1));
  // "w" is retired; the tensors declared alike around it are planned.
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_THAT(Entries(*outcome.plan),
              ElementsAre("0 ok p0 4B 1x", "1 after p1 8B 1x"));
  // Its next version, declared alike, is planned after them.
  Declare("n0", {Spec("ok", {1}), Spec("w", {3}), Spec("after", {2}),
                 Version(Spec("w", {5}), 1)});
  const auto next =
      Declare("n1", {Spec("ok", {1}), Spec("w", {5}), Spec("after", {2}),
                     Version(Spec("w", {5}), 1)});
  EXPECT_THAT(next.mismatches, IsEmpty());
  ASSERT_TRUE(next.plan.has_value());
  EXPECT_THAT(
      Entries(*next.plan),
      ElementsAre("0 ok p0 4B 1x", "1 after p1 8B 1x", "2 w p2 20B 1x"));
  EXPECT_EQ(next.plan->tensors(2).spec().version(), 1);
}

TEST_F(TensorPlanManagerTest, NodeDeclaringARetiredTensorLaterIsToldOfIt) {
  Seal(MakeMembership(2, {{"n0", 2}, {"n1", 1}, {"n2", 1}}));
  Declare("n0", {Spec("w", {3})});
  const auto found = Declare("n1", {Spec("w", {5})});
  ASSERT_THAT(found.mismatches, SizeIs(1));
  EXPECT_THAT(found.retired, IsEmpty());
  // n2 agrees with n0, but "w" is retired: n2 alone gets the mismatch.
  const auto late = Declare("n2", {Spec("w", {3}), Spec("x", {1})});
  EXPECT_THAT(late.mismatches, IsEmpty());
  ASSERT_THAT(late.retired, SizeIs(1));
  EXPECT_EQ(late.retired[0].tensor(), "w");
  EXPECT_EQ(late.retired[0].field(), "shape");
  // "x" is declared by n2 only: nothing is planned yet.
  EXPECT_FALSE(late.plan.has_value());
}

TEST_F(TensorPlanManagerTest, NewGenerationClearsMismatchesAndPlansAgain) {
  Declare("n0", {Spec("w", {3})});
  ASSERT_THAT(Declare("n1", {Spec("w", {5})}).mismatches, SizeIs(1));

  EXPECT_FALSE(Seal(MakeMembership(2, {{"n0", 2}, {"n2", 1}})).has_value());
  EXPECT_THAT(manager_.Mismatches(kJob), IsEmpty());
  Declare("n0", {Spec("w", {3})});
  const auto outcome = Declare("n2", {Spec("w", {3})});
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_EQ(outcome.plan->generation(), 2);
  EXPECT_EQ(outcome.plan->version(), 1);
  EXPECT_THAT(Entries(*outcome.plan), ElementsAre("0 w p0 12B 1x"));
}

TEST_F(TensorPlanManagerTest, DeclarationDifferingFromPlanIsMismatch) {
  Declare("n0", {Spec("w", {3, 4})});
  ASSERT_TRUE(Declare("n1", {Spec("w", {3, 4})}).plan.has_value());

  Seal(MakeMembership(2, {{"n0", 2}, {"n1", 1}}));
  // Every node agrees with each other, but not with the plan.
  const auto outcome = Declare("n0", {Spec("w", {4, 3})});
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  EXPECT_EQ(outcome.mismatches[0].field(), "shape");
  EXPECT_THAT(Values(outcome.mismatches[0]),
              ElementsAre("[3, 4] (planned) ranks=[] nodes=[]",
                          "[4, 3] ranks=[0,1] nodes=[n0]"));
  EXPECT_EQ(manager_.Mismatches(kJob)[0].message(),
            "tensor \"w\" is planned with shape [3, 4] but has [4, 3] on "
            "ranks {0,1} (node n0): a planned tensor keeps its spec for the "
            "life of the job; declare it as planned");
  // The second node's identical declaration is the same (tensor, field).
  EXPECT_THAT(Declare("n1", {Spec("w", {4, 3})}).mismatches, IsEmpty());
  EXPECT_EQ(manager_.Plan(kJob)->tensors(0).spec().shape(0), 3);
}

TEST_F(TensorPlanManagerTest, PlanMismatchMessageListsOnlyDeviations) {
  Declare("n0", {Spec("w", {2})});
  ASSERT_TRUE(Declare("n1", {Spec("w", {2})}).plan.has_value());

  Seal(MakeMembership(2, {{"n0", 2}, {"n1", 1}, {"n2", 2}}));
  EXPECT_THAT(Declare("n0", {Spec("w", {2})}).mismatches, IsEmpty());
  const auto outcome = Declare("n1", {Spec("w", {2}, v1::DATA_TYPE_FLOAT16)});
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  EXPECT_THAT(Values(outcome.mismatches[0]),
              ElementsAre("float32 (planned) ranks=[] nodes=[]",
                          "float32 ranks=[0,1] nodes=[n0]",
                          "float16 ranks=[2] nodes=[n1]"));
  EXPECT_EQ(manager_.Mismatches(kJob)[0].message(),
            "tensor \"w\" is planned with dtype float32 but has float16 on "
            "ranks {2} (node n1): a planned tensor keeps its spec for the life "
            "of the job; declare it as planned");
  // Only "w" is held back: "x", declared alike everywhere, is planned.
  Declare("n0", {Spec("w", {2}), Spec("x", {1})});
  Declare("n1", {Spec("w", {2}, v1::DATA_TYPE_FLOAT16), Spec("x", {1})});
  const auto outcome2 = Declare("n2", {Spec("w", {2}), Spec("x", {1})});
  ASSERT_TRUE(outcome2.plan.has_value());
  EXPECT_THAT(Entries(*outcome2.plan),
              ElementsAre("0 w p0 8B 1x", "1 x p1 4B 1x"));
}

TEST_F(TensorPlanManagerTest, LongRankListsAreShortenedInMessages) {
  std::vector<std::pair<std::string, int>> nodes;
  for (int i = 0; i < 20; ++i) nodes.emplace_back(absl::StrCat("n", i), 1);
  Seal(MakeMembership(2, nodes));
  // The even nodes agree first; their ranks do not form runs.
  for (int i = 0; i < 20; i += 2) {
    Declare(absl::StrCat("n", i), {Spec("w", {1}, v1::DATA_TYPE_FLOAT32)});
  }
  const auto outcome = Declare("n1", {Spec("w", {1}, v1::DATA_TYPE_FLOAT64)});
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  // The proto keeps every rank and node; the message lists the first few.
  EXPECT_THAT(outcome.mismatches[0].values(0).ranks(), SizeIs(10));
  EXPECT_THAT(outcome.mismatches[0].values(0).nodes(), SizeIs(10));
  EXPECT_EQ(manager_.Mismatches(kJob)[0].message(),
            "tensor \"w\" has dtype float32 on ranks {0,2,4,6,8,10,12,14,...} "
            "(nodes n0, n2, n4, n6, n8, n10, n12, n14 and 2 more) but float64 "
            "on ranks {1} (node n1): declare it identically on every rank");
}

TEST_F(TensorPlanManagerTest, ManyNodesMismatchListsEveryRankInProto) {
  std::vector<std::pair<std::string, int>> nodes;
  for (int i = 0; i < 12; ++i) nodes.emplace_back(absl::StrCat("n", i), 2);
  Seal(MakeMembership(2, nodes));
  for (int i = 0; i < 11; ++i) {
    EXPECT_THAT(Declare(absl::StrCat("n", i), {Spec("w", {1})}).mismatches,
                IsEmpty());
  }
  const auto outcome = Declare("n11", {Spec("w", {2})});
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  EXPECT_THAT(outcome.mismatches[0].values(0).ranks(), SizeIs(22));
  EXPECT_THAT(outcome.mismatches[0].values(0).nodes(), SizeIs(11));
  EXPECT_EQ(manager_.Mismatches(kJob)[0].message(),
            "tensor \"w\" has shape [1] on ranks {0-21} (nodes n0, n1, n2, n3, "
            "n4, n5, n6, n7 and 3 more) but [2] on ranks {22,23} (node n11): "
            "declare it identically on every rank");
}

// --- Rejected manifests -----------------------------------------------------

TEST_F(TensorPlanManagerTest, RejectsReorderedOrChangedEntries) {
  Declare("n0", {Spec("a", {4}), Spec("b", {4})});
  const absl::Status reordered =
      DeclareStatus("n0", {Spec("a", {4}), Spec("c", {4}), Spec("b", {4})});
  EXPECT_EQ(reordered.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reordered.message(),
            "Manifest.tensors[1] is \"c\" (float32 [4] push_pull) but node "
            "\"n0\" declared \"b\" (float32 [4] push_pull) there before in "
            "generation 1: manifests are append-only; declare new tensors "
            "after the existing ones");
  const absl::Status changed =
      DeclareStatus("n0", {Spec("a", {4}), Spec("b", {4}, v1::DATA_TYPE_INT8)});
  EXPECT_EQ(changed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(changed.message(),
              HasSubstr("is \"b\" (int8 [4] push_pull) but node \"n0\" "
                        "declared \"b\" (float32 [4] push_pull)"));
}

TEST_F(TensorPlanManagerTest, RejectsDroppedEntries) {
  Declare("n0", {Spec("a", {4}), Spec("b", {4})});
  const absl::Status status = DeclareStatus("n0", {Spec("a", {4})});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "Manifest has 1 tensors but node \"n0\" declared 2 before in "
            "generation 1 (Manifest.tensors[1] \"b\" (float32 [4] push_pull) "
            "is missing): manifests are append-only; resend every tensor "
            "declared before, in the same order");
}

TEST_F(TensorPlanManagerTest, RejectedManifestChangesNothing) {
  Declare("n0", {Spec("a", {4}), Spec("b", {4})});
  EXPECT_FALSE(DeclareStatus("n0", {Spec("a", {4}), Spec("c", {4})}).ok());
  EXPECT_FALSE(DeclareStatus("n1", {Spec("a", {4}), Spec("", {4})}).ok());
  // n1 now declares what n0 really has: a and b are planned, c never was.
  const auto outcome = Declare("n1", {Spec("a", {4}), Spec("b", {4})});
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_THAT(Entries(*outcome.plan),
              ElementsAre("0 a p0 16B 1x", "1 b p1 16B 1x"));
}

TEST_F(TensorPlanManagerTest, AppendOnlyStartsOverInNewGeneration) {
  Declare("n0", {Spec("a", {4}), Spec("b", {4})});
  Seal(MakeMembership(2, {{"n0", 2}, {"n1", 1}}));
  EXPECT_TRUE(DeclareStatus("n0", {Spec("b", {4})}).ok());
}

TEST_F(TensorPlanManagerTest, RejectsInvalidSpecByIndex) {
  const absl::Status status =
      DeclareStatus("n0", {Spec("a", {4}), Spec("b", {2, -1})});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[1].shape[1] of tensor \"b\" is -1: dimensions "
            "must be >= 0");
}

TEST_F(TensorPlanManagerTest, RejectsDuplicateNames) {
  const absl::Status status =
      DeclareStatus("n0", {Spec("a", {4}), Spec("b", {4}), Spec("a", {4})});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[2] declares tensor \"a\" (float32 [4] push_pull) "
            "again (first at Manifest.tensors[0]): declare each tensor once, "
            "and a name anew with the next version");
}

TEST_F(TensorPlanManagerTest, RejectsRedeclaringAnEarlierTensor) {
  Declare("n0", {Spec("a", {4}), Spec("b", {4})});
  const absl::Status status = DeclareStatus(
      "n0", {Spec("a", {4}), Spec("b", {4}), Spec("c", {1}), Spec("b", {4})});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[3] declares tensor \"b\" (float32 [4] push_pull) "
            "again (first at Manifest.tensors[1]): declare each tensor once, "
            "and a name anew with the next version");
}

// A name declared anew with another spec is its next version: a tensor of
// its own, planned beside the first, with its own id.
TEST_F(TensorPlanManagerTest, ANameDeclaredAnewIsPlannedAsItsNextVersion) {
  const std::vector<v1::TensorSpec> first = {Spec("x", {10, 100}),
                                             Spec("y", {1})};
  Declare("n0", first);
  ASSERT_TRUE(Declare("n1", first).plan.has_value());
  std::vector<v1::TensorSpec> anew = first;
  anew.push_back(Version(Spec("x", {10}, v1::DATA_TYPE_INT64), 1));
  EXPECT_FALSE(Declare("n0", anew, 5).plan.has_value());
  const auto outcome = Declare("n1", anew, 5);
  EXPECT_THAT(outcome.mismatches, IsEmpty());
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_EQ(outcome.plan->version(), 2);
  EXPECT_THAT(Entries(*outcome.plan),
              ElementsAre("0 x p0 4000B 1x", "1 y p1 4B 1x", "2 x p2 80B 1x"));
  EXPECT_EQ(outcome.plan->tensors(2).spec().version(), 1);
  EXPECT_EQ(manager_.TensorName(kJob, 2), "x (version 1)");
  EXPECT_EQ(manager_.TensorName(kJob, 0), "x");
}

TEST_F(TensorPlanManagerTest, VersionsDisagreeingBetweenNodesAreAMismatch) {
  Declare("n0", {Spec("x", {4}), Version(Spec("x", {2}), 1)});
  const auto outcome =
      Declare("n1", {Spec("x", {4}), Version(Spec("x", {3}), 1)});
  ASSERT_THAT(outcome.mismatches, SizeIs(1));
  EXPECT_EQ(outcome.mismatches[0].tensor(), "x");
  EXPECT_EQ(outcome.mismatches[0].version(), 1);
  EXPECT_EQ(outcome.mismatches[0].field(), "shape");
  ASSERT_THAT(manager_.Mismatches(kJob), SizeIs(1));
  EXPECT_EQ(manager_.Mismatches(kJob)[0].tensor(), "x (version 1)");
  EXPECT_THAT(manager_.Mismatches(kJob)[0].message(),
              HasSubstr("tensor \"x\" (version 1) has shape [2]"));
}

TEST_F(TensorPlanManagerTest, RejectsAVersionWithoutTheOneBefore) {
  const absl::Status status =
      DeclareStatus("n0", {Spec("x", {4}), Version(Spec("x", {2}), 2)});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[1] declares tensor \"x\" version 2 (float32 "
            "[2] push_pull) but not version 1 before it: a name's versions "
            "are declared in order");
  EXPECT_EQ(DeclareStatus("n0", {Version(Spec("y", {2}), 1)}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TensorPlanManagerTest, RecoveredPlanKeepsEveryVersionOfAName) {
  Declare("n0", {Spec("x", {4}), Version(Spec("x", {2}), 1)});
  const auto outcome =
      Declare("n1", {Spec("x", {4}), Version(Spec("x", {2}), 1)});
  ASSERT_TRUE(outcome.plan.has_value());
  TensorPlanManager recovered;
  EXPECT_TRUE(recovered.Recover(kJob, *outcome.plan).ok());
  EXPECT_EQ(recovered.TensorName(kJob, 1), "x (version 1)");
  v1::TensorPlan repeated = *outcome.plan;
  repeated.mutable_tensors(1)->mutable_spec()->set_version(0);
  TensorPlanManager refused;
  EXPECT_EQ(refused.Recover(kJob, repeated).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TensorPlanManagerTest, RejectsNodeOutsideMembership) {
  const absl::Status status = DeclareStatus("n9", {Spec("a", {4})});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "node \"n9\" is not a member of job \"job\" generation 1: only "
            "members of the sealed generation declare tensors");
}

TEST_F(TensorPlanManagerTest, RejectsJobThatWasNeverSealed) {
  v1::Membership other = MakeMembership(1, {{"n0", 1}});
  other.set_job("other");
  const absl::Status status =
      manager_.OnManifest(other, "n0", MakeManifest(1, {Spec("a", {1})}), -1)
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("job \"other\" has no sealed"));
  EXPECT_EQ(manager_.Plan("other"), nullptr);
}

TEST_F(TensorPlanManagerTest, RejectsStaleGeneration) {
  const v1::Membership old = membership_;
  Seal(MakeMembership(2, {{"n0", 2}, {"n1", 1}}));
  const absl::Status status =
      manager_.OnManifest(old, "n0", MakeManifest(1, {Spec("a", {1})}), -1)
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("generation 1 of job \"job\" is over"));
}

TEST_F(TensorPlanManagerTest, RejectsMoreThanMaxTensors) {
  std::vector<v1::TensorSpec> specs;
  for (int i = 0; i <= TensorPlanManager::kMaxTensors; ++i) {
    specs.push_back(Spec(absl::StrCat("t", i), {1}));
  }
  const absl::Status status = DeclareStatus("n0", specs);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest declares 100001 tensors; the limit is 100000 per job: "
            "fuse small tensors into larger buckets");
}

TEST_F(TensorPlanManagerTest,
       RejectsPlanGrowingPastMaxTensorsAcrossGenerations) {
  std::vector<v1::TensorSpec> first, second;
  for (int i = 0; i < TensorPlanManager::kMaxTensors; ++i) {
    first.push_back(Spec(absl::StrCat("a", i), {1}));
  }
  Declare("n0", first);
  ASSERT_TRUE(Declare("n1", first).plan.has_value());
  Seal(MakeMembership(2, {{"n0", 2}, {"n1", 1}}));
  const absl::Status status = DeclareStatus("n0", {Spec("new", {1})});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("1 tensors that are not planned yet; with the 100000 "
                        "planned the job would exceed 100000 tensors"));
  // Redeclaring planned tensors is fine.
  EXPECT_TRUE(DeclareStatus("n0", {first[5]}).ok());
}

TEST(TensorPlanManagerPartitionTest, RejectsTensorNeedingTooManyPartitions) {
  TensorPlanManager manager;
  const v1::Membership membership = MakeMembership(1, {{"n0", 1}});
  manager.OnGenerationSealed(membership, 8);
  // 16 GiB in 8-byte partitions is 2^31 partitions, one past int32.
  const absl::Status status =
      manager
          .OnManifest(membership, "n0",
                      MakeManifest(1, {Spec("big", {int64_t{1} << 32})}), -1)
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "Manifest.tensors[0] tensor \"big\" would need 2147483648 "
            "partitions of 8 bytes, more than a plan can count: split the "
            "tensor");
}

// --- Generations ------------------------------------------------------------

TEST_F(TensorPlanManagerTest, PlanSurvivesGenerationsWithStableEntries) {
  Declare("n0", {Spec("a", {8}), Spec("b", {16})});
  const auto v1 = Declare("n1", {Spec("a", {8}), Spec("b", {16})});
  ASSERT_TRUE(v1.plan.has_value());

  // A replacement node joins; the plan comes back restamped.
  const std::optional<v1::TensorPlan> resealed =
      Seal(MakeMembership(3, {{"n0", 2}, {"n2", 4}}));
  ASSERT_TRUE(resealed.has_value());
  EXPECT_EQ(resealed->generation(), 3);
  EXPECT_EQ(resealed->version(), 1);
  EXPECT_THAT(Entries(*resealed), Entries(*v1.plan));
  EXPECT_EQ(manager_.Plan(kJob)->generation(), 3);

  // The new generation declares the old tensors plus one.
  const std::vector<v1::TensorSpec> specs = {Spec("a", {8}), Spec("b", {16}),
                                             Spec("c", {4})};
  Declare("n2", specs);
  const auto v2 = Declare("n0", specs, 100);
  ASSERT_TRUE(v2.plan.has_value());
  EXPECT_EQ(v2.plan->generation(), 3);
  EXPECT_EQ(v2.plan->version(), 2);
  EXPECT_EQ(v2.plan->effective_step(), 101);
  EXPECT_THAT(Entries(*v2.plan),
              ElementsAre("0 a p0 32B 1x", "1 b p1 64B 1x", "2 c p2 16B 1x"));
}

TEST_F(TensorPlanManagerTest, PartitionBytesFixedAtFirstSeal) {
  manager_.OnGenerationSealed(MakeMembership(2, {{"n0", 2}, {"n1", 1}}),
                              kPartitionBytes * 2);
  EXPECT_EQ(manager_.Summary(kJob).partition_bytes(), kPartitionBytes);
}

// --- Recover ----------------------------------------------------------------

v1::TensorPlan ReportedPlan() {
  v1::TensorPlan plan;
  plan.set_job(kJob);
  plan.set_generation(4);
  plan.set_version(3);
  plan.set_effective_step(120);
  plan.set_partition_bytes(kPartitionBytes);
  const std::vector<std::pair<uint32_t, v1::TensorSpec>> entries = {
      {0, Spec("a", {3 * kMiB})}, {5, Spec("b", {2})}};
  for (const auto& [id, spec] : entries) {
    v1::TensorPlanEntry* entry = plan.add_tensors();
    entry->set_tensor_id(id);
    *entry->mutable_spec() = spec;
    entry->set_priority(plan.tensors_size() - 1);
    entry->set_size_bytes(TensorPlanManager::SizeBytes(spec));
    entry->set_num_partitions(static_cast<int32_t>(
        (entry->size_bytes() + kPartitionBytes - 1) / kPartitionBytes));
  }
  return plan;
}

TEST(TensorPlanManagerRecoverTest, AdoptsFirstReportAndContinuesIds) {
  TensorPlanManager manager;
  ASSERT_TRUE(manager.Recover(kJob, ReportedPlan()).ok());
  ASSERT_NE(manager.Plan(kJob), nullptr);
  EXPECT_EQ(manager.Plan(kJob)->version(), 3);
  EXPECT_THAT(Entries(*manager.Plan(kJob)),
              ElementsAre("0 a p0 12582912B 3x", "5 b p1 8B 1x"));
  EXPECT_EQ(manager.TensorName(kJob, 5), "b");

  // The restarted coordinator may see manifests before sealing again: the
  // membership starts the generation and new ids continue after 5.
  const v1::Membership membership = MakeMembership(4, {{"n0", 1}});
  const auto outcome = manager.OnManifest(
      membership, "n0",
      MakeManifest(4, {Spec("a", {3 * kMiB}), Spec("b", {2}), Spec("c", {1})}),
      130);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  ASSERT_TRUE(outcome->plan.has_value());
  EXPECT_EQ(outcome->plan->version(), 4);
  EXPECT_EQ(outcome->plan->effective_step(), 131);
  EXPECT_THAT(
      Entries(*outcome->plan),
      ElementsAre("0 a p0 12582912B 3x", "5 b p1 8B 1x", "6 c p2 4B 1x"));
}

TEST(TensorPlanManagerRecoverTest, LaterMatchingReportIsAccepted) {
  TensorPlanManager manager;
  ASSERT_TRUE(manager.Recover(kJob, ReportedPlan()).ok());
  v1::TensorPlan same = ReportedPlan();
  same.set_generation(5);  // the stamp is not part of the plan's identity
  EXPECT_TRUE(manager.Recover(kJob, same).ok());
}

TEST(TensorPlanManagerRecoverTest, LaterDifferentReportIsRejected) {
  TensorPlanManager manager;
  ASSERT_TRUE(manager.Recover(kJob, ReportedPlan()).ok());

  v1::TensorPlan newer = ReportedPlan();
  newer.set_version(4);
  const absl::Status version = manager.Recover(kJob, newer);
  EXPECT_EQ(version.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(version.message(),
            "job \"job\" already has plan version 3 but this agent "
            "reports version 4 with 2 tensors in partitions of 4194304 bytes "
            "instead of 2 tensors in partitions of 4194304 bytes: the job's "
            "agents disagree on the plan");

  v1::TensorPlan renamed = ReportedPlan();
  renamed.mutable_tensors(1)->mutable_spec()->set_name("z");
  const absl::Status entry = manager.Recover(kJob, renamed);
  EXPECT_EQ(entry.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(entry.message(),
            "job \"job\" already has plan version 3 but this agent "
            "reports tensors[1] as tensor_id 5 \"z\" (float32 [2] push_pull) "
            "priority 1, 8 bytes in 1 partitions instead of tensor_id 5 \"b\" "
            "(float32 [2] push_pull) priority 1, 8 bytes in 1 partitions: the "
            "job's agents disagree on the plan");
  EXPECT_EQ(manager.TensorName(kJob, 5), "b");
}

TEST(TensorPlanManagerRecoverTest, EmptyReportIsIgnored) {
  TensorPlanManager manager;
  EXPECT_TRUE(manager.Recover(kJob, v1::TensorPlan()).ok());
  EXPECT_EQ(manager.Plan(kJob), nullptr);
  ASSERT_TRUE(manager.Recover(kJob, ReportedPlan()).ok());
  EXPECT_TRUE(manager.Recover(kJob, v1::TensorPlan()).ok());
  EXPECT_EQ(manager.Plan(kJob)->version(), 3);
}

TEST(TensorPlanManagerRecoverTest, RejectsInvalidReports) {
  struct Case {
    std::string what;
    std::function<void(v1::TensorPlan*)> corrupt;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"partition_bytes", [](v1::TensorPlan* p) { p->set_partition_bytes(12); },
       "TensorPlan has version 3, partition_bytes 12 and 2 tensors; a plan "
       "has version >= 1, partition_bytes a positive multiple of 8 and at "
       "most 100000 tensors"},
      {"version", [](v1::TensorPlan* p) { p->set_version(0); },
       "TensorPlan has version 0, partition_bytes 4194304 and 2 tensors; a "
       "plan has version >= 1, partition_bytes a positive multiple of 8 and "
       "at most 100000 tensors"},
      {"spec",
       [](v1::TensorPlan* p) {
         p->mutable_tensors(1)->mutable_spec()->set_dtype(
             static_cast<v1::DataType>(99));
       },
       "TensorPlan.tensors[1].spec.dtype of tensor \"b\" is 99, not a known "
       "DataType: declare one of float32, float64, float16, bfloat16, int32, "
       "int64, uint8, int8"},
      {"id", [](v1::TensorPlan* p) { p->mutable_tensors(1)->set_tensor_id(0); },
       "TensorPlan.tensors[1] reuses tensor_id 0 of TensorPlan.tensors[0]"},
      {"name",
       [](v1::TensorPlan* p) {
         p->mutable_tensors(1)->mutable_spec()->set_name("a");
       },
       "TensorPlan.tensors[1] repeats tensor \"a\" (float32 [2] push_pull) "
       "of TensorPlan.tensors[0]"},
      {"priority",
       [](v1::TensorPlan* p) { p->mutable_tensors(1)->set_priority(7); },
       "TensorPlan.tensors[1] is tensor_id 5 \"b\" (float32 [2] push_pull) "
       "priority 7, 8 bytes in 1 partitions; expected priority 1 (entries are "
       "ordered by priority), 8 bytes in 1 partitions"},
      {"partitions",
       [](v1::TensorPlan* p) { p->mutable_tensors(0)->set_num_partitions(1); },
       "TensorPlan.tensors[0] is tensor_id 0 \"a\" (float32 [3145728] "
       "push_pull) priority 0, 12582912 bytes in 1 partitions; expected "
       "priority 0 (entries are ordered by priority), 12582912 bytes in 3 "
       "partitions"},
  };
  for (const Case& c : cases) {
    TensorPlanManager manager;
    v1::TensorPlan plan = ReportedPlan();
    c.corrupt(&plan);
    const absl::Status status = manager.Recover(kJob, plan);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(status.message(), c.message) << c.what;
    EXPECT_EQ(manager.Plan(kJob), nullptr) << c.what;
  }
}

TEST_F(TensorPlanManagerTest, RecoverMatchesAgreedPlan) {
  Declare("n0", {Spec("a", {1})});
  const auto outcome = Declare("n1", {Spec("a", {1})});
  ASSERT_TRUE(outcome.plan.has_value());
  EXPECT_TRUE(manager_.Recover(kJob, *outcome.plan).ok());
  v1::TensorPlan other = *outcome.plan;
  other.mutable_tensors(0)->mutable_spec()->set_shape(0, 2);
  EXPECT_EQ(manager_.Recover(kJob, other).code(),
            absl::StatusCode::kFailedPrecondition);
}

// --- Summary, names, removal ------------------------------------------------

TEST_F(TensorPlanManagerTest, SummaryAddsUpThePlan) {
  const v1::PlanSummary empty = manager_.Summary(kJob);
  EXPECT_EQ(empty.version(), 0);
  EXPECT_EQ(empty.num_tensors(), 0);
  EXPECT_EQ(empty.total_bytes(), 0);
  EXPECT_EQ(empty.num_partitions(), 0);
  EXPECT_EQ(empty.partition_bytes(), kPartitionBytes);

  const std::vector<v1::TensorSpec> specs = {Spec("big", {10 * kMiB / 4}),
                                             Spec("small", {3})};
  Declare("n0", specs);
  Declare("n1", specs);
  const v1::PlanSummary summary = manager_.Summary(kJob);
  EXPECT_EQ(summary.version(), 1);
  EXPECT_EQ(summary.effective_step(), 0);
  EXPECT_EQ(summary.num_tensors(), 2);
  EXPECT_EQ(summary.total_bytes(), 10 * kMiB + 12);
  EXPECT_EQ(summary.partition_bytes(), kPartitionBytes);
  EXPECT_EQ(summary.num_partitions(), 4);
}

TEST_F(TensorPlanManagerTest, TensorNameFallsBackToId) {
  Declare("n0", {Spec("layer1.weight", {1})});
  Declare("n1", {Spec("layer1.weight", {1})});
  EXPECT_EQ(manager_.TensorName(kJob, 0), "layer1.weight");
  EXPECT_EQ(manager_.TensorName(kJob, 7), "tensor#7");
  EXPECT_EQ(manager_.TensorName("other", 0), "tensor#0");
}

TEST_F(TensorPlanManagerTest, RemoveJobForgetsEverything) {
  Declare("n0", {Spec("a", {1})});
  Declare("n1", {Spec("a", {1})});
  manager_.RemoveJob(kJob);
  EXPECT_EQ(manager_.Plan(kJob), nullptr);
  EXPECT_EQ(manager_.Summary(kJob).partition_bytes(), 0);
  EXPECT_THAT(manager_.Mismatches(kJob), IsEmpty());
  EXPECT_FALSE(DeclareStatus("n0", {Spec("a", {1})}).ok());
}

// --- Scale ------------------------------------------------------------------

// 1000 nodes x 5000 tensors declared in growing manifests. Nodes share the
// declarations, so this stays fast and small; a per-node copy or a scan of
// every node per entry would make it crawl.
TEST(TensorPlanManagerScaleTest, ManyNodesManyTensors) {
  constexpr int kNodes = 1000;
  constexpr int kTensors = 5000;
  std::vector<std::pair<std::string, int>> nodes;
  for (int i = 0; i < kNodes; ++i) nodes.emplace_back(absl::StrCat("n", i), 8);
  const v1::Membership membership = MakeMembership(1, nodes);
  TensorPlanManager manager;
  manager.OnGenerationSealed(membership, kPartitionBytes);
  v1::Manifest half = MakeManifest(1, {});
  v1::Manifest full = MakeManifest(1, {});
  for (int i = 0; i < kTensors; ++i) {
    const v1::TensorSpec spec = Spec(absl::StrCat("t", i), {i + 1});
    if (i < kTensors / 2) *half.add_tensors() = spec;
    *full.add_tensors() = spec;
  }
  std::optional<v1::TensorPlan> plan;
  for (const v1::Manifest* manifest : {&half, &full}) {
    for (int i = 0; i < kNodes; ++i) {
      auto outcome = manager.OnManifest(membership, nodes[i].first, *manifest,
                                        manifest == &half ? -1 : 3);
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      ASSERT_THAT(outcome->mismatches, IsEmpty());
      if (outcome->plan) plan = outcome->plan;
    }
  }
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->version(), 2);
  EXPECT_EQ(plan->effective_step(), 4);
  ASSERT_EQ(plan->tensors_size(), kTensors);
  EXPECT_EQ(plan->tensors(4999).tensor_id(), 4999u);
  EXPECT_EQ(plan->tensors(4999).spec().name(), "t4999");
}

}  // namespace
}  // namespace baton::coordinator
