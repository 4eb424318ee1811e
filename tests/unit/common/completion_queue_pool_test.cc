#include "common/completion_queue_pool.h"

#include <grpcpp/alarm.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace baton {
namespace {

// Counts its completions and remembers the thread and the outcome.
class RecordingTag final : public CompletionTag {
 public:
  void Complete(bool ok) override {
    absl::MutexLock lock(&mu_);
    ok_ = ok;
    thread_ = std::this_thread::get_id();
    ++completions_;
  }
  void AwaitCompletion() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* completions) { return *completions > 0; }, &completions_));
  }
  int completions() {
    absl::MutexLock lock(&mu_);
    return completions_;
  }
  bool ok() {
    absl::MutexLock lock(&mu_);
    return ok_;
  }
  std::thread::id thread() {
    absl::MutexLock lock(&mu_);
    return thread_;
  }

 private:
  absl::Mutex mu_;
  int completions_ ABSL_GUARDED_BY(mu_) = 0;
  bool ok_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id thread_ ABSL_GUARDED_BY(mu_);
};

gpr_timespec Now() { return gpr_now(GPR_CLOCK_MONOTONIC); }

gpr_timespec InAnHour() {
  return gpr_time_add(Now(), gpr_time_from_seconds(3600, GPR_TIMESPAN));
}

TEST(CompletionQueuePoolTest, EachQueuesTagsCompleteOnItsOwnThread) {
  CompletionQueuePool pool(3);
  pool.Start("test-cq");
  ASSERT_EQ(pool.size(), 3u);
  std::vector<RecordingTag> tags(6);
  std::vector<grpc::Alarm> alarms(6);
  for (size_t i = 0; i < tags.size(); ++i) {
    alarms[i].Set(pool.queue(i % 3), Now(), &tags[i]);
  }
  for (RecordingTag& tag : tags) tag.AwaitCompletion();
  for (size_t i = 0; i < tags.size(); ++i) {
    EXPECT_TRUE(tags[i].ok()) << i;
    EXPECT_EQ(tags[i].completions(), 1) << i;
    EXPECT_NE(tags[i].thread(), std::this_thread::get_id()) << i;
    // Tags of one queue complete on one thread, of another queue on another.
    EXPECT_EQ(tags[i].thread(), tags[(i + 3) % 6].thread()) << i;
    EXPECT_NE(tags[i].thread(), tags[(i + 1) % 6].thread()) << i;
  }
  pool.Shutdown();
}

TEST(CompletionQueuePoolTest, ACancelledOperationCompletesNotOk) {
  CompletionQueuePool pool(2);
  pool.Start("test-cq");
  RecordingTag tag;
  grpc::Alarm alarm;
  alarm.Set(pool.queue(1), InAnHour(), &tag);
  alarm.Cancel();
  tag.AwaitCompletion();
  EXPECT_FALSE(tag.ok());
  pool.Shutdown();
  EXPECT_EQ(tag.completions(), 1);
}

TEST(CompletionQueuePoolTest, ShutdownDeliversEveryCompletionFirst) {
  RecordingTag tag;
  {
    CompletionQueuePool pool(2);
    pool.Start("test-cq");
    grpc::Alarm alarm;
    alarm.Set(pool.queue(0), Now(), &tag);
    // The alarm has fired or will: Shutdown returns only after its tag
    // was delivered, and twice is harmless.
    tag.AwaitCompletion();
    pool.Shutdown();
    pool.Shutdown();
  }
  EXPECT_EQ(tag.completions(), 1);
  EXPECT_TRUE(tag.ok());
}

TEST(CompletionQueuePoolTest, AnUnstartedPoolDrainsItsQueuesOnShutdown) {
  RecordingTag tag;
  auto pool = std::make_unique<CompletionQueuePool>(1);
  {
    grpc::Alarm alarm;
    alarm.Set(pool->queue(0), Now(), &tag);
    // Destroying a pending alarm cancels it; its tag is still delivered.
  }
  pool->Shutdown();
  EXPECT_EQ(tag.completions(), 1);
}

}  // namespace
}  // namespace baton
