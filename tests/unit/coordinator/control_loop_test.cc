#include "coordinator/control_loop.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

TEST(ControlLoopTest, RunsTasksInPostOrderIncludingTasksTheyPost) {
  ControlLoop loop;
  std::vector<int> order;
  loop.Post([&] {
    order.push_back(1);
    loop.Post([&] { order.push_back(3); });
  });
  loop.Post([&] { order.push_back(2); });
  EXPECT_EQ(loop.RunUntilIdle(), 3u);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(loop.RunUntilIdle(), 0u);
}

TEST(ControlLoopTest, TasksFromManyThreadsAllRunOnTheLoopThread) {
  ControlLoop loop;
  std::atomic<int> ran{0};
  std::thread::id loop_thread;
  std::atomic<bool> other_thread_ran{false};
  std::thread runner([&] {
    loop_thread = std::this_thread::get_id();
    loop.Run(Clock::Real(), absl::Milliseconds(5), [] {});
  });
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < 250; ++i) {
        loop.Post([&] {
          if (std::this_thread::get_id() != loop_thread)
            other_thread_ran = true;
          ++ran;
        });
      }
    });
  }
  for (std::thread& poster : posters) poster.join();
  while (ran.load() < 1000) std::this_thread::yield();
  loop.Stop();
  runner.join();
  EXPECT_EQ(ran.load(), 1000);
  EXPECT_FALSE(other_thread_ran.load());
}

TEST(ControlLoopTest, TicksWhileIdleAndStopsPromptly) {
  ControlLoop loop;
  std::atomic<int> ticks{0};
  std::thread runner([&] {
    loop.Run(Clock::Real(), absl::Milliseconds(1), [&] { ++ticks; });
  });
  while (ticks.load() < 3) std::this_thread::yield();
  loop.Stop();
  runner.join();
  EXPECT_GE(ticks.load(), 3);
}

// Regression: the tick used to run between queued tasks, so a busy loop
// judged liveness before reading the heartbeats already waiting in its queue.
TEST(ControlLoopTest, TickRunsOnlyAfterTheTasksQueuedBeforeIt) {
  ControlLoop loop;
  int ran = 0;
  for (int i = 0; i < 100; ++i) loop.Post([&] { ++ran; });
  int ran_at_first_tick = -1;
  loop.Run(Clock::Real(), absl::ZeroDuration(), [&] {
    if (ran_at_first_tick < 0) ran_at_first_tick = ran;
    loop.Stop();
  });
  EXPECT_EQ(ran_at_first_tick, 100);
}

// Regression: waking with no task before the tick was due took a task from
// an empty queue. A FakeClock makes every wait wake "early".
TEST(ControlLoopTest, WakingEarlyWithNoTaskWaitsForTheTick) {
  ControlLoop loop;
  FakeClock clock;
  std::atomic<int> ticks{0};
  std::thread runner(
      [&] { loop.Run(&clock, absl::Milliseconds(10), [&] { ++ticks; }); });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(ticks.load(), 0);
  clock.Advance(absl::Milliseconds(10));
  while (ticks.load() == 0) std::this_thread::yield();
  loop.Stop();
  runner.join();
  EXPECT_EQ(ticks.load(), 1);
}

TEST(ControlLoopTest, PostAfterStopIsDropped) {
  ControlLoop loop;
  loop.Stop();
  bool ran = false;
  loop.Post([&] { ran = true; });
  EXPECT_EQ(loop.RunUntilIdle(), 0u);
  EXPECT_FALSE(ran);
  EXPECT_EQ(loop.Pending(), 0u);
}

}  // namespace
}  // namespace baton::coordinator
