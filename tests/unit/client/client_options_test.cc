// ClientOptions::FromEnvironment: what a launcher's variables (batonrun's,
// torchrun's) become, and the errors a bad one gets.
#include <cstdlib>
#include <string>
#include <vector>

#include "baton/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

class ClientOptionsTest : public ::testing::Test {
 protected:
  ClientOptionsTest() {
    for (const char* name : kVariables) unsetenv(name);
  }
  ~ClientOptionsTest() override {
    for (const char* name : kVariables) unsetenv(name);
  }

  static constexpr const char* kVariables[] = {
      "BATON_JOB",  "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
      "WORLD_SIZE", "BATON_NODES",         "GROUP_RANK"};
};

// torchrun's worker environment alone names the job and places the node.
TEST_F(ClientOptionsTest, TorchrunsEnvironmentIsEnough) {
  setenv("TORCHELASTIC_RUN_ID", "run7", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("WORLD_SIZE", "6", 1);
  setenv("GROUP_RANK", "2", 1);
  absl::StatusOr<ClientOptions> options = ClientOptions::FromEnvironment();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job, "run7");
  EXPECT_EQ(options->local_rank, 1);
  EXPECT_EQ(options->expected_nodes, 3);
  EXPECT_EQ(options->node_rank, 2);
  // BATON_JOB wins over torchrun's run id.
  setenv("BATON_JOB", "mine", 1);
  EXPECT_EQ(ClientOptions::FromEnvironment()->job, "mine");
}

TEST_F(ClientOptionsTest, WithoutGroupRankTheCoordinatorPlacesTheNode) {
  setenv("BATON_JOB", "j", 1);
  absl::StatusOr<ClientOptions> options = ClientOptions::FromEnvironment();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->node_rank, -1);
}

TEST_F(ClientOptionsTest, ABadGroupRankOrNoJobIsNamed) {
  absl::StatusOr<ClientOptions> options = ClientOptions::FromEnvironment();
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(options.status().message(),
              HasSubstr("BATON_JOB is not set (nor torchrun's "
                        "TORCHELASTIC_RUN_ID)"));
  setenv("BATON_JOB", "j", 1);
  setenv("WORLD_SIZE", "2", 1);
  for (const std::string value : {"2", "-5"}) {
    setenv("GROUP_RANK", value.c_str(), 1);
    options = ClientOptions::FromEnvironment();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(options.status().message(),
                HasSubstr("environment variable GROUP_RANK=" + value +
                          " must be in 0..1 (the job's nodes - 1), or unset"));
  }
  setenv("GROUP_RANK", "x", 1);
  EXPECT_THAT(ClientOptions::FromEnvironment().status().message(),
              HasSubstr("environment variable GROUP_RANK=\"x\" is not an "
                        "integer"));
}

}  // namespace
}  // namespace baton
