#include "common/log_context.h"

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(LogPrefixTest, NamesJobGenerationNodeAndRankInThatOrder) {
  EXPECT_EQ(LogPrefix({"resnet", 3, "node-7", 12}),
            "job=resnet gen=3 node=node-7 rank=12 ");
  EXPECT_EQ(LogPrefix({"resnet", 3, "node-7", 0}),
            "job=resnet gen=3 node=node-7 rank=0 ");
}

TEST(LogPrefixTest, LeavesOutWhatDoesNotApply) {
  // Before the first seal: no generation, no global rank yet.
  EXPECT_EQ(LogPrefix({"resnet", 0, "node-7"}), "job=resnet node=node-7 ");
  EXPECT_EQ(LogPrefix({"resnet", 2, ""}), "job=resnet gen=2 ");
  EXPECT_EQ(LogPrefix({"", 0, "node-7"}), "node=node-7 ");
  EXPECT_EQ(LogPrefix({}), "");
}

TEST(LogPrefixTest, OneJobsLinesAreFoundWithoutItsNamesakes) {
  // `grep 'job=a '` must not match job "a2": the prefix ends each field
  // with a space.
  const std::string line = LogPrefix({"a2", 1, "n1"}) + "sealed";
  EXPECT_EQ(line.find("job=a "), std::string::npos);
  EXPECT_NE(LogPrefix({"a", 1, "n1"}).find("job=a "), std::string::npos);
}

}  // namespace
}  // namespace baton
