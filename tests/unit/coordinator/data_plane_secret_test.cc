// Each generation's data-plane secret (Membership.data_plane_secret): drawn
// at every seal, carried through a coordinator restart by the rejoining
// agents, and never shown by the status API.
#include <set>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/secret_source.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/coordinator_harness.h"

namespace baton::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

class DataPlaneSecretTest : public CoordinatorTest {
 protected:
  // Every serialized status answer, where a leaked secret would show.
  std::string EverythingStatusSays(const std::string& job) {
    std::string all = Status(job).SerializeAsString();
    all += coordinator_->ListJobs().SerializeAsString();
    return all;
  }

  v1::Membership LastMembership(Agent& agent) {
    auto memberships = agent.Received(v1::CoordinatorMessage::kMembership);
    EXPECT_THAT(memberships, Not(SizeIs(0))) << agent.node;
    return memberships.empty() ? v1::Membership()
                               : memberships.back().membership();
  }

  void Rejoin(Agent& agent, const v1::Membership& membership) {
    v1::AgentMessage message;
    *message.mutable_rejoin()->mutable_membership() = membership;
    message.mutable_rejoin()->set_expected_nodes(2);
    Send(agent, message);
  }
};

TEST_F(DataPlaneSecretTest, EachSealDrawsANewSecretThatStatusNeverShows) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  const v1::Membership first = LastMembership(a);
  ASSERT_EQ(first.data_plane_secret().size(), kDataPlaneSecretBytes);
  EXPECT_EQ(LastMembership(b).data_plane_secret(), first.data_plane_secret());
  EXPECT_EQ(EverythingStatusSays("job").find(first.data_plane_secret()),
            std::string::npos);

  // A node is lost and another takes its place: generation 2, new secret.
  coordinator_->OnSessionClosed(b.id, "the agent closed its stream");
  Agent c = Connect("n2");
  Join(c, "job", 1, 2);
  const v1::Membership second = LastMembership(a);
  ASSERT_EQ(second.generation(), 2);
  ASSERT_EQ(second.data_plane_secret().size(), kDataPlaneSecretBytes);
  EXPECT_NE(second.data_plane_secret(), first.data_plane_secret());
  EXPECT_EQ(LastMembership(c).data_plane_secret(), second.data_plane_secret());
  EXPECT_EQ(EverythingStatusSays("job").find(second.data_plane_secret()),
            std::string::npos);
}

// After a restart the job is rebuilt from the agents' reports, secret
// included; a report carrying another secret, or none, is refused.
TEST_F(DataPlaneSecretTest, RecoveryKeepsTheSecretTheAgentsReport) {
  Agent a = Connect("n0"), b = Connect("n1");
  Join(a, "job", 1, 2);
  Join(b, "job", 1, 2);
  const v1::Membership sealed = LastMembership(a);
  const v1::Membership sealed_b = LastMembership(b);

  Restart();
  a = Connect("n0");
  b = Connect("n1");
  v1::Membership none = sealed;
  none.clear_data_plane_secret();
  Rejoin(a, none);
  EXPECT_THAT(a.Received(v1::CoordinatorMessage::kJoinAccepted), SizeIs(0));
  EXPECT_THAT(a.LastError().message(),
              HasSubstr("RejoinJob.membership.data_plane_secret has 0 bytes; "
                        "a sealed generation's has 32"));

  Rejoin(a, sealed);
  ASSERT_THAT(a.Received(v1::CoordinatorMessage::kJoinAccepted), SizeIs(1))
      << a.LastError().message();
  v1::Membership other = sealed_b;
  other.mutable_data_plane_secret()->back() ^= 1;
  Rejoin(b, other);
  EXPECT_THAT(b.Received(v1::CoordinatorMessage::kJoinAccepted), SizeIs(0));
  EXPECT_THAT(b.LastError().message(),
              HasSubstr("carries another data-plane secret than the "
                        "recovered one: join again"));
  // Neither error quotes a secret.
  EXPECT_EQ(b.LastError().SerializeAsString().find(sealed.data_plane_secret()),
            std::string::npos);
  Rejoin(b, sealed_b);
  EXPECT_THAT(b.Received(v1::CoordinatorMessage::kJoinAccepted), SizeIs(1))
      << b.LastError().message();
  EXPECT_EQ(EverythingStatusSays("job").find(sealed.data_plane_secret()),
            std::string::npos);
}

TEST(CryptoSecretSourceTest, DrawsDifferentSecretsOfTheAskedSize) {
  std::set<std::string> drawn;
  for (int i = 0; i < 8; ++i) {
    const std::string secret =
        CryptoSecretSource()->Draw(kDataPlaneSecretBytes);
    EXPECT_EQ(secret.size(), kDataPlaneSecretBytes);
    drawn.insert(secret);
  }
  EXPECT_EQ(drawn.size(), 8u);
}

}  // namespace
}  // namespace baton::coordinator
