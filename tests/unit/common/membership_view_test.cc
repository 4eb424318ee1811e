// What each agent is told of a sealed generation: its own entry, the local
// sizes run-length encoded, and the table only at node ranks 0 and 1.
#include "common/membership_view.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

// A sealed membership of nodes n0..n(k-1) with these local sizes.
v1::Membership Sealed(const std::vector<int32_t>& local_sizes) {
  v1::Membership m;
  m.set_job("job");
  m.set_generation(3);
  m.set_store_prefix("baton/job/3/");
  m.set_data_plane_secret(std::string(32, 's'));
  m.set_sealed_unix_ms(1000);
  int32_t offset = 0;
  for (size_t i = 0; i < local_sizes.size(); ++i) {
    v1::NodeInfo* node = m.add_nodes();
    node->set_node_name("n" + std::to_string(i));
    node->set_data_address("10.0.0." + std::to_string(i) + ":0");
    node->set_node_rank(static_cast<int32_t>(i));
    node->set_local_size(local_sizes[i]);
    node->set_rank_offset(offset);
    offset += local_sizes[i];
  }
  m.set_world_size(offset);
  CompleteMembership(&m);
  return m;
}

TEST(MembershipViewTest, EqualLocalSizesAreOneRun) {
  const v1::Membership m = Sealed(std::vector<int32_t>(1000, 8));
  EXPECT_EQ(m.num_nodes(), 1000);
  ASSERT_EQ(m.local_sizes_size(), 1);
  EXPECT_EQ(m.local_sizes(0).nodes(), 1000);
  EXPECT_EQ(m.local_sizes(0).local_size(), 8);
}

TEST(MembershipViewTest, OnlyNodeRanksZeroAndOneGetTheTable) {
  const v1::Membership full = Sealed(std::vector<int32_t>(1000, 8));
  for (const int32_t rank : {0, 1, 2, 999}) {
    SCOPED_TRACE(rank);
    const v1::Membership view = MembershipView(full, rank);
    EXPECT_EQ(view.self().node_name(), "n" + std::to_string(rank));
    EXPECT_EQ(view.self().rank_offset(), rank * 8);
    EXPECT_EQ(view.nodes_size(), rank < kMembershipKeepers ? 1000 : 0);
    EXPECT_EQ(view.num_nodes(), 1000);
    EXPECT_EQ(view.world_size(), 8000);
    EXPECT_EQ(view.data_plane_secret(), full.data_plane_secret());
    EXPECT_EQ(view.sealed_unix_ms(), 1000);
    EXPECT_TRUE(ValidateMembershipView("view", view, 1000).ok());
  }
  // A node's view stays small however large the job: O(N) bytes per seal.
  EXPECT_LT(MembershipView(full, 500).ByteSizeLong(), 200u);
}

TEST(MembershipViewTest, NodeOfRankFollowsTheRuns) {
  const v1::Membership m = Sealed({2, 2, 1, 3, 3});
  // Ranks: n0 0-1, n1 2-3, n2 4, n3 5-7, n4 8-10.
  const int32_t expected_node[] = {0, 0, 1, 1, 2, 3, 3, 3, 4, 4, 4};
  for (int32_t rank = 0; rank < 11; ++rank) {
    SCOPED_TRACE(rank);
    const std::optional<RankPlace> place = NodeOfRank(m, rank);
    ASSERT_TRUE(place.has_value());
    EXPECT_EQ(place->node_rank, expected_node[rank]);
    const v1::NodeInfo& node = m.nodes(place->node_rank);
    EXPECT_EQ(place->rank_offset, node.rank_offset());
    EXPECT_EQ(place->local_size, node.local_size());
  }
  EXPECT_FALSE(NodeOfRank(m, 11).has_value());
  EXPECT_FALSE(NodeOfRank(m, -1).has_value());
}

TEST(MembershipViewTest, ValidationNamesWhatIsInconsistent) {
  const v1::Membership full = Sealed({2, 1, 3});
  v1::Membership view = MembershipView(full, 2);
  EXPECT_TRUE(ValidateMembershipView("RejoinJob.membership", view, 3).ok());
  EXPECT_THAT(
      ValidateMembershipView("RejoinJob.membership", view, 2).message(),
      HasSubstr("RejoinJob.membership.num_nodes is 3: it must be 1..2"));

  v1::Membership bad = view;
  bad.set_world_size(7);
  EXPECT_THAT(ValidateMembershipView("m", bad, 3).message(),
              HasSubstr("m.local_sizes cover 3 nodes and 6 ranks"));
  bad = view;
  bad.mutable_local_sizes(0)->set_local_size(0);
  EXPECT_THAT(ValidateMembershipView("m", bad, 3).message(),
              HasSubstr("m.local_sizes[0] is 1 nodes of 0 trainers"));
  bad = view;
  bad.mutable_self()->set_rank_offset(2);
  EXPECT_THAT(ValidateMembershipView("m", bad, 3).message(),
              HasSubstr("m.self has node_rank 2, rank_offset 2"));
  bad = view;
  bad.mutable_self()->set_node_rank(5);
  EXPECT_THAT(ValidateMembershipView("m", bad, 3).message(),
              HasSubstr("m.self has node_rank 5"));

  v1::Membership keeper = MembershipView(full, 0);
  EXPECT_TRUE(ValidateMembershipView("m", keeper, 3).ok());
  bad = keeper;
  bad.mutable_nodes(1)->set_local_size(2);
  EXPECT_THAT(ValidateMembershipView("m", bad, 3).message(),
              HasSubstr("m.nodes[1] has node_rank 1, rank_offset 2 and "
                        "local_size 2, which do not follow"));
  bad = keeper;
  bad.mutable_nodes()->RemoveLast();
  EXPECT_THAT(ValidateMembershipView("m", bad, 3).message(),
              HasSubstr("m lists 2 nodes; num_nodes is 3"));
  bad = keeper;
  bad.mutable_self()->set_node_name("n9");
  EXPECT_THAT(ValidateMembershipView("m", bad, 3).message(),
              HasSubstr("m.self names node \"n9\" but nodes[0] is \"n0\""));
}

}  // namespace
}  // namespace baton
