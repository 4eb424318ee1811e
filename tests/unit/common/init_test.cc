#include "common/init.h"

#include <gflags/gflags.h>

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

DEFINE_int32(init_test_count, 1, "a flag for this test");
DEFINE_string(init_test_name, "default", "a flag for this test");

namespace baton {
namespace {

using ::testing::HasSubstr;

class EnvironmentOverrideTest : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("BATON_INIT_TEST_COUNT");
    unsetenv("BATON_INIT_TEST_NAME");
    FLAGS_init_test_count = 1;
    FLAGS_init_test_name = "default";
  }
};

TEST_F(EnvironmentOverrideTest, VariableSetsTheFlag) {
  setenv("BATON_INIT_TEST_COUNT", "7", 1);
  setenv("BATON_INIT_TEST_NAME", "from-env", 1);
  ASSERT_TRUE(ApplyEnvironmentOverrides().ok());
  EXPECT_EQ(FLAGS_init_test_count, 7);
  EXPECT_EQ(FLAGS_init_test_name, "from-env");
}

TEST_F(EnvironmentOverrideTest, CommandLineWinsOverTheEnvironment) {
  setenv("BATON_INIT_TEST_COUNT", "7", 1);
  ASSERT_TRUE(ApplyEnvironmentOverrides().ok());
  int argc = 2;
  char arg0[] = "test";
  char arg1[] = "--init_test_count=9";
  char* args[] = {arg0, arg1, nullptr};
  char** argv = args;
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  EXPECT_EQ(FLAGS_init_test_count, 9);
}

TEST_F(EnvironmentOverrideTest, InvalidValueNamesTheVariableAndTheFlag) {
  setenv("BATON_INIT_TEST_COUNT", "seven", 1);
  absl::Status status = ApplyEnvironmentOverrides();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("environment variable BATON_INIT_TEST_COUNT=\"seven\" "
                        "is not a valid value for --init_test_count (int32)"));
  EXPECT_EQ(FLAGS_init_test_count, 1);
}

TEST_F(EnvironmentOverrideTest, UnsetVariablesLeaveDefaults) {
  ASSERT_TRUE(ApplyEnvironmentOverrides().ok());
  EXPECT_EQ(FLAGS_init_test_count, 1);
  EXPECT_EQ(FLAGS_init_test_name, "default");
}

}  // namespace
}  // namespace baton
