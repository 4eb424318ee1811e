// The trainer <-> agent fast path (common/shm_channel.h): the single-producer
// / single-consumer ring, and the futex doorbell that wakes its consumer.
// Producers and consumers run as threads, and in one test as two processes
// with separate mappings of one shared-memory object, as a trainer and its
// agent do.
#include "common/shm_channel.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/shm.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

constexpr int64_t kCapacity = static_cast<int64_t>(ChannelRing::kCapacity);
// Longer than any test here takes: a Wait that runs this long means the
// wake-up it waited for was lost.
constexpr microseconds kNoWake = std::chrono::seconds(60);

// Entry `step` of producer `index`, with a payload that says both, so that a
// torn or misplaced slot shows.
ChannelEntry Entry(int32_t index, int64_t step) {
  return ChannelEntry{index, static_cast<int32_t>(step % 2), step,
                      index * 1000003 + step, ~step};
}

bool IsEntry(const ChannelEntry& e, int32_t index, int64_t step) {
  const ChannelEntry want = Entry(index, step);
  return e.index == want.index && e.flags == want.flags &&
         e.step == want.step && e.value == want.value &&
         e.generation == want.generation;
}

std::string Describe(const ChannelEntry& e) {
  return absl::StrCat("{index ", e.index, ", flags ", e.flags, ", step ",
                      e.step, ", value ", e.value, ", generation ",
                      e.generation, "}");
}

// Whole milliseconds, so that failed bounds print as numbers.
int64_t Millis(SteadyClock::duration d) {
  return std::chrono::duration_cast<milliseconds>(d).count();
}

pid_t ThisThread() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// True when the task whose /proc directory is `proc` ("/proc/<pid>" or
// "/proc/self/task/<tid>") is asleep inside futex(2). The kernel compares
// the futex word before the task goes to sleep, so a waiter seen asleep
// there can only leave through a FUTEX_WAKE or its timeout.
bool AsleepInFutex(const std::string& proc) {
  std::ifstream stat_file(proc + "/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)),
                   std::istreambuf_iterator<char>());
  // "<pid> (<comm>) <state> ...": the command may hold spaces and ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size() ||
      stat[close + 2] != 'S') {
    return false;
  }
  std::ifstream syscall_file(proc + "/syscall");
  long number = -1;
  return static_cast<bool>(syscall_file >> number) && number == SYS_futex;
}

// A thread blocked in bell.Wait(seen, timeout), `seen` taken when it is
// constructed; says how long Wait took and what the bell read afterwards.
class BellWaiter {
 public:
  BellWaiter(const Doorbell& bell, microseconds timeout)
      : seen_(bell.Snapshot()), thread_([this, &bell, timeout] {
          tid_.store(ThisThread());
          const SteadyClock::time_point start = SteadyClock::now();
          bell.Wait(seen_, timeout);
          waited_ = SteadyClock::now() - start;
          after_ = bell.Snapshot();
          returned_.store(true);
        }) {}

  ~BellWaiter() {
    if (thread_.joinable()) thread_.join();
  }

  // Returns once the thread sleeps on the bell, or has returned already.
  void AwaitAsleep() const {
    while (!returned_.load()) {
      const pid_t tid = tid_.load();
      if (tid != 0 && AsleepInFutex(absl::StrCat("/proc/self/task/", tid))) {
        return;
      }
      std::this_thread::yield();
    }
  }

  void Join() { thread_.join(); }
  pthread_t native_handle() { return thread_.native_handle(); }

  // After Join.
  uint32_t seen() const { return seen_; }
  uint32_t after() const { return after_; }
  SteadyClock::duration waited() const { return waited_; }

 private:
  const uint32_t seen_;
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> returned_{false};
  SteadyClock::duration waited_{};
  uint32_t after_ = 0;
  std::thread thread_;  // last: it reads the members above
};

// --- The ring, on one thread -------------------------------------------------

TEST(ChannelRingTest, PopsEntriesInPushOrderThenReportsEmpty) {
  auto ring = std::make_unique<ChannelRing>();
  EXPECT_TRUE(ring->Empty());
  for (int64_t step = 0; step < 10; ++step) {
    ASSERT_TRUE(ring->Push(Entry(3, step)));
    EXPECT_FALSE(ring->Empty());
  }
  for (int64_t step = 0; step < 10; ++step) {
    ChannelEntry entry{};
    ASSERT_TRUE(ring->Pop(&entry));
    EXPECT_TRUE(IsEntry(entry, 3, step)) << Describe(entry);
  }
  EXPECT_TRUE(ring->Empty());
}

// Head and tail run past the slot array's end: the ring keeps the order
// while it holds its whole capacity across the wrap.
TEST(ChannelRingTest, FullRingAcrossTheEndOfItsSlotsKeepsOrder) {
  auto ring = std::make_unique<ChannelRing>();
  ChannelEntry entry{};
  constexpr int64_t kOffset = kCapacity - 3;
  for (int64_t step = 0; step < kOffset; ++step) {
    ASSERT_TRUE(ring->Push(Entry(0, step)));
    ASSERT_TRUE(ring->Pop(&entry));
  }
  for (int64_t step = 0; step < kCapacity; ++step) {
    ASSERT_TRUE(ring->Push(Entry(1, step))) << "entry " << step;
  }
  EXPECT_FALSE(ring->Push(Entry(2, 0)));
  for (int64_t step = 0; step < kCapacity; ++step) {
    ASSERT_TRUE(ring->Pop(&entry));
    ASSERT_TRUE(IsEntry(entry, 1, step)) << Describe(entry);
  }
  EXPECT_FALSE(ring->Pop(&entry));
}

TEST(ChannelRingTest, SteadyTrafficWrapsManyTimesInOrder) {
  auto ring = std::make_unique<ChannelRing>();
  constexpr int64_t kLag = 100;  // entries the consumer is behind
  constexpr int64_t kEntries = 5 * kCapacity + 7;
  int64_t popped = 0;
  ChannelEntry entry{};
  for (int64_t step = 0; step < kEntries; ++step) {
    ASSERT_TRUE(ring->Push(Entry(0, step)));
    if (step >= kLag) {
      ASSERT_TRUE(ring->Pop(&entry));
      ASSERT_TRUE(IsEntry(entry, 0, popped++)) << Describe(entry);
    }
  }
  while (ring->Pop(&entry)) {
    ASSERT_TRUE(IsEntry(entry, 0, popped++)) << Describe(entry);
  }
  EXPECT_EQ(popped, kEntries);
}

// A full ring refuses the entry rather than overwrite the oldest one, and
// takes entries again as soon as the consumer frees a slot.
TEST(ChannelRingTest, FullRingRefusesPushesAndKeepsWhatItHolds) {
  auto ring = std::make_unique<ChannelRing>();
  for (int64_t step = 0; step < kCapacity; ++step) {
    ASSERT_TRUE(ring->Push(Entry(0, step)));
  }
  EXPECT_FALSE(ring->Push(Entry(9, 0)));
  EXPECT_FALSE(ring->Push(Entry(9, 1)));

  ChannelEntry entry{};
  ASSERT_TRUE(ring->Pop(&entry));
  EXPECT_TRUE(IsEntry(entry, 0, 0)) << Describe(entry);
  EXPECT_TRUE(ring->Push(Entry(0, kCapacity)));
  EXPECT_FALSE(ring->Push(Entry(9, 2)));

  for (int64_t step = 1; step <= kCapacity; ++step) {
    ASSERT_TRUE(ring->Pop(&entry));
    ASSERT_TRUE(IsEntry(entry, 0, step)) << Describe(entry);
  }
  EXPECT_FALSE(ring->Pop(&entry)) << "a refused entry came out";
}

TEST(ChannelRingTest, EmptyRingPopReturnsFalseAndLeavesTheEntryAlone) {
  auto ring = std::make_unique<ChannelRing>();
  const ChannelEntry untouched = Entry(7, 42);
  ChannelEntry entry = untouched;
  EXPECT_FALSE(ring->Pop(&entry));
  EXPECT_TRUE(IsEntry(entry, 7, 42)) << Describe(entry);

  ASSERT_TRUE(ring->Push(Entry(1, 1)));
  ASSERT_TRUE(ring->Pop(&entry));
  entry = untouched;
  EXPECT_FALSE(ring->Pop(&entry)) << "popped twice";
  EXPECT_TRUE(IsEntry(entry, 7, 42)) << Describe(entry);
  EXPECT_TRUE(ring->Empty());
}

// Regression (found by tests/fuzz/trainer_protocol_fuzz): head and tail live
// in memory the trainer maps read-write. A tail written more than kCapacity
// ahead of the head made Pop hand out slots nobody published, up to 2^64 of
// them, kCapacity per drain, for as long as the job ran. Now such a ring is
// Corrupt() and pops nothing; within the capacity it pops as before.
TEST(ChannelRingTest, TailMoreThanCapacityAheadIsCorruptAndPopsNothing) {
  auto ring = std::make_unique<ChannelRing>();
  // The layout is the protocol between the processes: head, then tail, each
  // on its own cache line. A trainer writes raw bytes; so does this test.
  auto* raw = reinterpret_cast<unsigned char*>(ring.get());
  const auto set = [raw](size_t offset, uint64_t value) {
    std::memcpy(raw + offset, &value, sizeof value);
  };
  ASSERT_TRUE(ring->Push(Entry(5, 1)));
  ChannelEntry entry = Entry(7, 42);
  for (uint64_t tail : {uint64_t{kCapacity} + 1, uint64_t{1} << 40,
                        std::numeric_limits<uint64_t>::max()}) {
    set(64, tail);
    EXPECT_EQ(ring->Size(), tail);
    EXPECT_TRUE(ring->Corrupt()) << "tail " << tail;
    EXPECT_FALSE(ring->Pop(&entry)) << "tail " << tail;
    EXPECT_TRUE(IsEntry(entry, 7, 42)) << Describe(entry);
  }
  // A head moved past the tail is the same: tail - head wraps around.
  set(0, 10);
  set(64, 5);
  EXPECT_TRUE(ring->Corrupt());
  EXPECT_FALSE(ring->Pop(&entry));
  // Exactly full is not corrupt.
  set(0, 0);
  set(64, kCapacity);
  EXPECT_FALSE(ring->Corrupt());
  ASSERT_TRUE(ring->Pop(&entry));
  EXPECT_TRUE(IsEntry(entry, 5, 1)) << Describe(entry);
  EXPECT_EQ(ring->Size(), uint64_t{kCapacity} - 1);
}

// The ring validates nothing: whatever a trainer writes reaches the agent
// unchanged, and the agent checks it (ValidateEnqueue) as it checks a
// request from the stream.
TEST(ChannelRingTest, CarriesAnyEntryBitForBit) {
  auto ring = std::make_unique<ChannelRing>();
  const ChannelEntry odd[] = {
      {-1, -1, -1, -1, -1},
      {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
       std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
       0x0123456789abcdef},
      {0, 0, 0, 0, 0},
  };
  for (const ChannelEntry& e : odd) ASSERT_TRUE(ring->Push(e));
  for (const ChannelEntry& want : odd) {
    ChannelEntry got{};
    ASSERT_TRUE(ring->Pop(&got));
    EXPECT_EQ(got.index, want.index);
    EXPECT_EQ(got.flags, want.flags);
    EXPECT_EQ(got.step, want.step);
    EXPECT_EQ(got.value, want.value);
    EXPECT_EQ(got.generation, want.generation);
  }
}

// --- Producers and a consumer in threads -------------------------------------

// What a consumer saw of each producer's entries.
struct Received {
  explicit Received(int producers) : next(producers, 0) {}

  // Checks `e` against producer `from`'s next entry.
  void Take(const ChannelEntry& e, int32_t from) {
    ++total;
    if (e.index != from || e.step != next[from] ||
        !IsEntry(e, e.index, e.step)) {
      if (wrong++ == 0) {
        first_wrong = absl::StrCat("from producer ", from, " expecting step ",
                                   next[from], ": ", Describe(e));
      }
    }
    next[from] = e.step + 1;
  }

  std::vector<int64_t> next;
  int64_t total = 0;
  int64_t wrong = 0;
  std::string first_wrong;
};

// Pushes entries 0..count-1 of `index`, as Client::Enqueue does: a full ring
// rings the consumer's bell and retries; every entry is followed by a ring.
void Produce(ChannelRing& ring, Doorbell& bell, int32_t index, int64_t count,
             std::mutex* turn = nullptr) {
  for (int64_t step = 0; step < count; ++step) {
    const ChannelEntry entry = Entry(index, step);
    {
      std::unique_lock<std::mutex> lock;
      if (turn != nullptr) lock = std::unique_lock<std::mutex>(*turn);
      while (!ring.Push(entry)) {
        bell.Ring();
        std::this_thread::yield();
      }
    }
    bell.Ring();
  }
}

// The consumer's loop, as AgentJob::Loop runs it: take the bell's value
// before looking, drain, sleep on the bell only when nothing was found.
// Returns once every producer is done and the rings are drained.
void Consume(Doorbell& bell, const std::atomic<int>& producers_done,
             int producers, const std::function<bool()>& drain) {
  while (true) {
    const uint32_t seen = bell.Snapshot();
    const bool last_look = producers_done.load() == producers;
    const bool found = drain();
    if (last_look) return;
    if (!found) bell.Wait(seen, kNoWake);
  }
}

// One ring per trainer, one doorbell for the job: the agent's request path.
class JobBellTest : public ::testing::TestWithParam<int> {};

TEST_P(JobBellTest, EveryRequestArrivesOnceInEachTrainersOrder) {
  const int trainers = GetParam();
  constexpr int64_t kPerTrainer = 3 * kCapacity + 17;
  Doorbell job_bell;
  std::vector<std::unique_ptr<TrainerChannel>> channels;
  for (int t = 0; t < trainers; ++t) {
    channels.push_back(std::make_unique<TrainerChannel>());
  }
  std::atomic<int> done{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < trainers; ++t) {
    producers.emplace_back([&, t] {
      Produce(channels[t]->requests, job_bell, t, kPerTrainer);
      done.fetch_add(1);
      job_bell.Ring();
    });
  }
  Received received(trainers);
  Consume(job_bell, done, trainers, [&] {
    bool found = false;
    ChannelEntry entry;
    for (int t = 0; t < trainers; ++t) {
      while (channels[t]->requests.Pop(&entry)) {
        found = true;
        received.Take(entry, t);
      }
    }
    return found;
  });
  for (std::thread& producer : producers) producer.join();

  EXPECT_EQ(received.wrong, 0) << received.first_wrong;
  EXPECT_EQ(received.total, trainers * kPerTrainer);
  for (int t = 0; t < trainers; ++t) {
    EXPECT_EQ(received.next[t], kPerTrainer) << "trainer " << t;
    EXPECT_TRUE(channels[t]->requests.Empty()) << "trainer " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Trainers, JobBellTest, ::testing::Values(1, 2, 4));

// The ring has one producer at a time; threads that share one (a trainer's
// threads enqueueing, the agent's threads completing) take turns under a
// mutex, as Client::Enqueue and ChannelMapping::Complete do.
TEST(ChannelRingThreadsTest, ProducersTakingTurnsEachKeepTheirOrder) {
  constexpr int kProducers = 3;
  constexpr int64_t kPerProducer = 2 * kCapacity + 5;
  auto channel = std::make_unique<TrainerChannel>();
  std::mutex turn;
  std::atomic<int> done{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      Produce(channel->completions, channel->completion_bell, p, kPerProducer,
              &turn);
      done.fetch_add(1);
      channel->completion_bell.Ring();
    });
  }
  Received received(kProducers);
  bool bad_index = false;
  Consume(channel->completion_bell, done, kProducers, [&] {
    bool found = false;
    ChannelEntry entry;
    while (channel->completions.Pop(&entry)) {
      found = true;
      if (entry.index < 0 || entry.index >= kProducers) {
        bad_index = true;
        continue;
      }
      received.Take(entry, entry.index);
    }
    return found;
  });
  for (std::thread& producer : producers) producer.join();

  EXPECT_FALSE(bad_index);
  EXPECT_EQ(received.wrong, 0) << received.first_wrong;
  EXPECT_EQ(received.total, kProducers * kPerProducer);
  for (int p = 0; p < kProducers; ++p) {
    EXPECT_EQ(received.next[p], kPerProducer) << "producer " << p;
  }
}

// --- The doorbell ------------------------------------------------------------

TEST(DoorbellTest, RingWakesAWaiterAsleepOnTheBell) {
  Doorbell bell;
  BellWaiter waiter(bell, kNoWake);
  waiter.AwaitAsleep();
  bell.Ring();
  waiter.Join();
  EXPECT_EQ(waiter.after(), waiter.seen() + 1);
  EXPECT_LT(Millis(waiter.waited()), Millis(kNoWake))
      << "woken by its timeout, not the ring";
}

TEST(DoorbellTest, OneRingWakesEveryWaiter) {
  Doorbell bell;
  constexpr int kWaiters = 3;
  std::vector<std::unique_ptr<BellWaiter>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::make_unique<BellWaiter>(bell, kNoWake));
  }
  for (auto& waiter : waiters) waiter->AwaitAsleep();
  bell.Ring();
  for (int i = 0; i < kWaiters; ++i) {
    waiters[i]->Join();
    EXPECT_LT(Millis(waiters[i]->waited()), Millis(kNoWake)) << "waiter " << i;
  }
}

TEST(DoorbellTest, WaitReturnsAtOnceWhenTheBellMovedSinceTheSnapshot) {
  Doorbell bell;
  const uint32_t seen = bell.Snapshot();
  bell.Ring();
  const SteadyClock::time_point start = SteadyClock::now();
  bell.Wait(seen, kNoWake);
  EXPECT_LT(Millis(SteadyClock::now() - start), Millis(kNoWake));
  EXPECT_EQ(bell.Snapshot(), seen + 1);
}

TEST(DoorbellTest, BoundedWaitTimesOutWhenNobodyRings) {
  Doorbell bell;
  const uint32_t seen = bell.Snapshot();
  constexpr milliseconds kTimeout{20};
  const SteadyClock::time_point start = SteadyClock::now();
  bell.Wait(seen, kTimeout);
  // A lower bound only: the futex's timeout is on the same monotonic clock
  // and never fires early.
  EXPECT_GE(Millis(SteadyClock::now() - start), kTimeout.count());
  EXPECT_EQ(bell.Snapshot(), seen);
}

// A signal the waiting thread handles (Python installs handlers in every
// trainer) does not end the wait: nobody rang, and time is left.
TEST(DoorbellTest, HandledSignalDoesNotEndTheWaitEarly) {
  struct sigaction action = {};
  action.sa_handler = [](int) {};
  ASSERT_EQ(sigaction(SIGUSR1, &action, nullptr), 0);
  Doorbell bell;
  constexpr milliseconds kTimeout{300};
  BellWaiter waiter(bell, kTimeout);
  waiter.AwaitAsleep();
  ASSERT_EQ(pthread_kill(waiter.native_handle(), SIGUSR1), 0);
  waiter.Join();
  EXPECT_EQ(waiter.after(), waiter.seen()) << "nobody rang";
  EXPECT_GE(std::chrono::duration_cast<milliseconds>(waiter.waited()).count(),
            kTimeout.count())
      << "Wait returned early on EINTR";
}

TEST(DoorbellTest, WaitWithoutTimeLeftReturnsAtOnce) {
  Doorbell bell;
  const uint32_t seen = bell.Snapshot();
  for (const microseconds timeout :
       {microseconds(0), microseconds(-1), microseconds::min()}) {
    bell.Wait(seen, timeout);
  }
  EXPECT_EQ(bell.Snapshot(), seen);
}

// Counts up by one per ring, and wraps from 2^32-1 to 0.
TEST(DoorbellTest, EachRingMovesTheBellByOne) {
  Doorbell bell;
  EXPECT_EQ(bell.Snapshot(), 0u);
  bell.Ring();
  bell.Ring();
  EXPECT_EQ(bell.Snapshot(), 2u);
  bell.bell.store(std::numeric_limits<uint32_t>::max());
  bell.Ring();
  EXPECT_EQ(bell.Snapshot(), 0u);
}

// --- Two processes -----------------------------------------------------------

// What the agent (this process) and a trainer (a child) share in the test.
struct SharedChannel {
  TrainerChannel channel;
  // Set by the trainer just before it sleeps on the completion bell.
  std::atomic<uint32_t> trainer_waiting{0};
};

// The trainer's side; its exit status says what it saw.
enum TrainerExit {
  kGotTheCompletion = 0,
  kCannotOpen = 1,
  kRingEmpty = 2,
  kWrongEntry = 3,
  kWokenByTimeout = 4,
};

[[noreturn]] void RunTrainer(const std::string& name) {
  absl::StatusOr<SharedMemory> memory =
      SharedMemory::Open(name, sizeof(SharedChannel));
  if (!memory.ok()) _exit(kCannotOpen);
  auto* shared = reinterpret_cast<SharedChannel*>(memory->data());
  const Doorbell& bell = shared->channel.completion_bell;
  const uint32_t seen = bell.Snapshot();
  shared->trainer_waiting.store(1);
  const SteadyClock::time_point start = SteadyClock::now();
  bell.Wait(seen, kNoWake);
  if (SteadyClock::now() - start >= kNoWake) _exit(kWokenByTimeout);
  ChannelEntry entry{};
  if (!shared->channel.completions.Pop(&entry)) _exit(kRingEmpty);
  _exit(IsEntry(entry, 5, 77) ? kGotTheCompletion : kWrongEntry);
}

// The futexes are shared ones: a trainer that maps the channel at its own
// address is woken by the agent's ring and finds the completion.
TEST(ChannelProcessesTest, CompletionReachesATrainerAsleepInAnotherProcess) {
  const std::string name =
      absl::StrCat("/baton.", getpid(), ".shm_channel_test");
  absl::StatusOr<SharedMemory> memory =
      SharedMemory::Create(name, sizeof(SharedChannel));
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto* shared = new (memory->data()) SharedChannel();

  const pid_t trainer = fork();
  if (trainer == 0) RunTrainer(name);
  ASSERT_GT(trainer, 0);
  const std::string proc = absl::StrCat("/proc/", trainer);
  while (shared->trainer_waiting.load() == 0 || !AsleepInFutex(proc)) {
    int status = 0;
    if (waitpid(trainer, &status, WNOHANG) == trainer) {
      FAIL() << "the trainer exited before it slept, status " << status;
    }
    std::this_thread::yield();
  }
  ASSERT_TRUE(shared->channel.completions.Push(Entry(5, 77)));
  shared->channel.completion_bell.Ring();

  int status = 0;
  ASSERT_EQ(waitpid(trainer, &status, 0), trainer);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), kGotTheCompletion)
      << "1: cannot open, 2: ring empty, 3: wrong entry, 4: woken by timeout";
  EXPECT_TRUE(SharedMemory::Unlink(name).ok());
}

}  // namespace
}  // namespace baton
