// OpCompletion: an operation's end, finished exactly once whoever comes
// first, and the lease on its buffers.
#include "agent/op_completion.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/recording_sink.h"

namespace baton::agent {
namespace {

using ::testing::HasSubstr;

struct Fixture {
  Fixture() : completion("Gradient.fc.weight", 3, 7, 2) {
    completion.AddTarget({0, rank0, nullptr});
    completion.AddTarget({1, rank1, nullptr});
  }
  std::shared_ptr<RecordingSink> rank0 = std::make_shared<RecordingSink>();
  std::shared_ptr<RecordingSink> rank1 = std::make_shared<RecordingSink>();
  OpCompletion completion;
};

TEST(OpCompletionTest,
     TheFirstFinishTellsEveryRankOnceAndTheRestChangeNothing) {
  Fixture f;
  const absl::Time t0 = absl::FromUnixSeconds(100);
  EXPECT_TRUE(f.completion.Finish(absl::AbortedError("node n1 was lost"), t0));
  EXPECT_FALSE(f.completion.Finish(absl::OkStatus(), t0 + absl::Seconds(1)));
  EXPECT_FALSE(f.completion.Finish(absl::CancelledError("stop"), t0));
  EXPECT_TRUE(f.completion.finished());
  EXPECT_EQ(f.completion.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(f.completion.finished_at(), t0);
  for (const auto& sink : {f.rank0, f.rank1}) {
    const auto events = sink->events();
    ASSERT_EQ(events.size(), 1u);
    ASSERT_TRUE(events[0].has_failed());
    const v1::OperationFailed& failed = events[0].failed();
    EXPECT_EQ(failed.index(), 3);
    EXPECT_EQ(failed.step(), 7);
    EXPECT_EQ(failed.generation(), 2);
    EXPECT_EQ(failed.code(), static_cast<int32_t>(absl::StatusCode::kAborted));
    EXPECT_EQ(failed.message(),
              "tensor \"Gradient.fc.weight\" step 7: node n1 was lost");
  }
}

TEST(OpCompletionTest,
     TheDataPlanesSuccessFinishesAndReleasesItsFailureOnlyReleases) {
  Fixture ok;
  ok.completion.Submitted();
  EXPECT_FALSE(ok.completion.released());
  ok.completion.DataPlaneDone(absl::OkStatus(), absl::FromUnixSeconds(5));
  EXPECT_TRUE(ok.completion.released());
  EXPECT_TRUE(ok.completion.finished());
  ASSERT_EQ(ok.rank0->events().size(), 1u);
  EXPECT_TRUE(ok.rank0->events()[0].has_completion());
  EXPECT_EQ(ok.rank0->events()[0].completion().generation(), 2);

  // A failure is the job's to explain: the buffers are free, nobody is told.
  Fixture failed;
  failed.completion.Submitted();
  failed.completion.DataPlaneDone(absl::UnavailableError("connection reset"),
                                  absl::FromUnixSeconds(5));
  EXPECT_TRUE(failed.completion.released());
  EXPECT_FALSE(failed.completion.finished());
  EXPECT_TRUE(failed.rank0->events().empty());
}

// The lease: a failure told while the data plane still holds the buffers
// leaves them leased until it lets go; its late success tells nobody.
TEST(OpCompletionTest, AFailureBeforeTheDataPlaneLetsGoKeepsTheLease) {
  Fixture f;
  f.completion.Submitted();
  EXPECT_TRUE(f.completion.Finish(absl::AbortedError("aborted"),
                                  absl::FromUnixSeconds(1)));
  EXPECT_FALSE(f.completion.released());
  f.completion.DataPlaneDone(absl::OkStatus(), absl::FromUnixSeconds(2));
  EXPECT_TRUE(f.completion.released());
  EXPECT_EQ(f.completion.status().code(), absl::StatusCode::kAborted);
  ASSERT_EQ(f.rank1->events().size(), 1u);
  EXPECT_TRUE(f.rank1->events()[0].has_failed());
}

TEST(OpCompletionTest, AForgottenRankIsToldNothing) {
  Fixture f;
  f.completion.Forget(1);
  f.completion.Finish(absl::OkStatus(), absl::FromUnixSeconds(1));
  EXPECT_EQ(f.rank0->events().size(), 1u);
  EXPECT_TRUE(f.rank1->events().empty());
}

TEST(OpCompletionTest, AFailureNamingTheTensorIsNotPrefixedAgain) {
  EXPECT_EQ(OperationFailureMessage("w", 3, "tensor \"w\" differs on n2"),
            "tensor \"w\" differs on n2");
  EXPECT_THAT(OperationFailureMessage("w", 3, "node n2 left"),
              HasSubstr("tensor \"w\" step 3: node n2 left"));
}

// Data-plane threads and the job thread race to finish: whatever the
// interleaving, each rank hears exactly once, and exactly one caller won.
TEST(OpCompletionTest, RacingFinishersTellEachRankExactlyOnce) {
  for (int round = 0; round < 200; ++round) {
    Fixture f;
    f.completion.Submitted();
    std::atomic<int> winners{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        if (t % 2 == 0) {
          f.completion.DataPlaneDone(absl::OkStatus(), absl::Now());
        } else if (f.completion.Finish(absl::AbortedError("abort"),
                                       absl::Now())) {
          ++winners;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_LE(winners.load(), 1);
    EXPECT_TRUE(f.completion.finished());
    EXPECT_TRUE(f.completion.released());
    ASSERT_EQ(f.rank0->events().size(), 1u) << "round " << round;
    ASSERT_EQ(f.rank1->events().size(), 1u) << "round " << round;
    EXPECT_EQ(f.rank0->events()[0].has_completion(),
              f.completion.status().ok());
  }
}

}  // namespace
}  // namespace baton::agent
