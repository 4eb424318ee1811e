#include "common/clock.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(DeadlineTest, CountsDownOnItsClock) {
  FakeClock clock;
  const Deadline deadline(clock, absl::Seconds(5));
  EXPECT_EQ(deadline.at(), clock.Now() + absl::Seconds(5));
  EXPECT_EQ(deadline.Left(), absl::Seconds(5));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(deadline.Left(), absl::Seconds(3));
  clock.Advance(absl::Seconds(4));
  EXPECT_EQ(deadline.Left(), absl::Seconds(-1));
}

// Clock is the wall clock: when it steps back, the time left must not grow
// past the timeout, so that a wait for it stays bounded.
TEST(DeadlineTest, TimeLeftNeverExceedsTheTimeoutWhenTheClockStepsBack) {
  FakeClock clock;
  const Deadline deadline(clock, absl::Seconds(5));
  clock.Advance(absl::Hours(-1));
  EXPECT_EQ(deadline.Left(), absl::Seconds(5));
}

}  // namespace
}  // namespace baton
