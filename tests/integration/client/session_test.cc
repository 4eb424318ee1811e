// baton::Session against the real product: a coordinator and baton-agent
// processes on loopback, with the test process's threads as the trainers
// (one Session per rank, each attached to its node's agent).
#include "baton/session.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"

namespace baton {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// An upper bound only: nothing below waits this long when baton works.
constexpr auto kWait = std::chrono::seconds(20);

template <typename T>
constexpr v1::DataType kDataType = v1::DATA_TYPE_UNSPECIFIED;
template <>
constexpr v1::DataType kDataType<float> = v1::DATA_TYPE_FLOAT32;
template <>
constexpr v1::DataType kDataType<double> = v1::DATA_TYPE_FLOAT64;
template <>
constexpr v1::DataType kDataType<int32_t> = v1::DATA_TYPE_INT32;
template <>
constexpr v1::DataType kDataType<int64_t> = v1::DATA_TYPE_INT64;
template <>
constexpr v1::DataType kDataType<uint8_t> = v1::DATA_TYPE_UINT8;

// `values` as a Session buffer of `shape` (default: flat).
template <typename T>
Buffer BufferOf(std::vector<T>& values, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  return Buffer{values.data(), kDataType<T>, std::move(shape)};
}

// Waits until the operation finished, without delivering its result.
bool AwaitFinished(const Session& session, const OperationHandle& handle) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(kWait);
  while (!session.Poll(handle)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Sets environment variables (nullopt: unsets) for the test's scope and
// restores the previous values.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(
      const std::map<std::string, std::optional<std::string>>& variables) {
    for (const auto& [name, value] : variables) {
      const char* previous = std::getenv(name.c_str());
      previous_[name] = previous == nullptr
                            ? std::nullopt
                            : std::optional<std::string>(previous);
      Set(name, value);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : previous_) Set(name, value);
  }

 private:
  static void Set(const std::string& name,
                  const std::optional<std::string>& value) {
    if (value.has_value()) {
      setenv(name.c_str(), value->c_str(), /*overwrite=*/1);
    } else {
      unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> previous_;
};

class SessionTest : public ::testing::Test {
 protected:
  // Starts `nodes` agents and job `job` with `local_size` trainers on each:
  // sessions_ in (node, local rank) order. Init returns once the whole job
  // is formed, so every trainer initializes at once.
  // `min_nodes`: BATON_MIN_NODES (0: all of them).
  void StartJob(const std::string& job, int nodes, int local_size,
                const std::vector<std::string>& coordinator_flags = {},
                int min_nodes = 0) {
    ASSERT_TRUE(cluster_.Start(nodes, coordinator_flags).ok());
    std::vector<std::future<absl::StatusOr<std::unique_ptr<Session>>>> inits;
    for (int node = 1; node <= nodes; ++node) {
      for (int local_rank = 0; local_rank < local_size; ++local_rank) {
        ClientOptions options =
            cluster_.TrainerOptions(node, job, local_rank, local_size, nodes);
        options.min_nodes = min_nodes;
        inits.push_back(std::async(
            std::launch::async, [options] { return Session::Init(options); }));
      }
    }
    for (auto& init : inits) {
      absl::StatusOr<std::unique_ptr<Session>> session = init.get();
      ASSERT_TRUE(session.ok()) << session.status();
      sessions_.push_back(std::move(*session));
    }
    for (const auto& session : sessions_) {
      ASSERT_EQ(session->size(), nodes * local_size);
    }
  }

  // Runs `body` for every session at once, each in its own thread, as the
  // ranks of a real job would.
  void OnEveryRank(const std::function<void(size_t, Session&)>& body) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < sessions_.size(); ++i) {
      threads.emplace_back([&, i] { body(i, *sessions_[i]); });
    }
    for (std::thread& thread : threads) thread.join();
  }

  LocalCluster cluster_;
  // Destroyed before the cluster: a session detaches from a live agent.
  std::vector<std::unique_ptr<Session>> sessions_;
};

TEST_F(SessionTest, PushPullSumsAndAveragesIntoTheCallersBufferOnSynchronize) {
  ASSERT_NO_FATAL_FAILURE(StartJob("pushpull", 2, 2));
  OnEveryRank([](size_t, Session& session) {
    const int r = session.rank();
    for (int step = 0; step < 3; ++step) {
      // float32 alternates sum and mean on the same name; the sums of these
      // values are exact in every dtype.
      const bool average_f32 = step % 2 == 1;
      std::vector<float> f32(6);
      std::vector<int32_t> i32(5);
      std::vector<double> f64(4);
      for (size_t i = 0; i < f32.size(); ++i) f32[i] = r + 0.5f * i + step;
      for (size_t i = 0; i < i32.size(); ++i) {
        i32[i] = (r + 1) * (static_cast<int32_t>(i) + 1) * 1000 *
                 (i % 2 == 0 ? 1 : -1) * (step + 1);
      }
      for (size_t i = 0; i < f64.size(); ++i) f64[i] = 0.25 * r + i - step;
      const std::vector<float> f32_in = f32;
      const std::vector<int32_t> i32_in = i32;
      const std::vector<double> f64_in = f64;

      auto hf32 =
          session.PushPullAsync("f32", BufferOf(f32, {2, 3}), average_f32);
      auto hi32 = session.PushPullAsync("i32", BufferOf(i32), false);
      auto hf64 = session.PushPullAsync("f64", BufferOf(f64), true);
      ASSERT_TRUE(hf32.ok()) << hf32.status();
      ASSERT_TRUE(hi32.ok()) << hi32.status();
      ASSERT_TRUE(hf64.ok()) << hf64.status();
      for (const OperationHandle* h : {&*hf32, &*hi32, &*hf64}) {
        ASSERT_TRUE(AwaitFinished(session, *h)) << "step " << step;
      }
      // Finished, not yet synchronized: the buffers still hold the input.
      EXPECT_EQ(f32, f32_in);
      EXPECT_EQ(i32, i32_in);
      EXPECT_EQ(f64, f64_in);

      ASSERT_TRUE(session.Synchronize(*hf32).ok());
      ASSERT_TRUE(session.Synchronize(*hi32).ok());
      ASSERT_TRUE(session.Synchronize(*hf64).ok());
      // Ranks 0..3: the rank sum is 6, its mean 1.5.
      std::vector<float> f32_want(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) {
        const float sum = 6 + 4 * (0.5f * i + step);
        f32_want[i] = average_f32 ? sum / 4 : sum;
      }
      std::vector<int32_t> i32_want(i32.size());
      for (size_t i = 0; i < i32.size(); ++i) {
        i32_want[i] = 10 * (static_cast<int32_t>(i) + 1) * 1000 *
                      (i % 2 == 0 ? 1 : -1) * (step + 1);
      }
      std::vector<double> f64_want(f64.size());
      for (size_t i = 0; i < f64.size(); ++i) {
        f64_want[i] = 0.25 * 1.5 + i - step;
      }
      EXPECT_THAT(f32, ElementsAreArray(f32_want)) << "step " << step;
      EXPECT_THAT(i32, ElementsAreArray(i32_want)) << "step " << step;
      EXPECT_THAT(f64, ElementsAreArray(f64_want)) << "step " << step;
    }
  });
}

// Every reduce op through the C++ Session, over the shared-memory channel
// (ranks 0 and 1, whose op travels in the ring entry's flags) and over the
// stream (ranks 2 and 3, EnqueueRequest.reduce_op): rank r holds r - 1 + i.
TEST_F(SessionTest, PushPullTakesEveryReduceOpOverTheRingAndTheStream) {
  ASSERT_TRUE(cluster_.Start(2).ok());
  std::vector<std::future<absl::StatusOr<std::unique_ptr<Session>>>> inits;
  for (int node = 1; node <= 2; ++node) {
    for (int local_rank = 0; local_rank < 2; ++local_rank) {
      ClientOptions options =
          cluster_.TrainerOptions(node, "ops", local_rank, 2, 2);
      options.shm_channel = node == 1;
      inits.push_back(std::async(std::launch::async,
                                 [options] { return Session::Init(options); }));
    }
  }
  for (auto& init : inits) {
    absl::StatusOr<std::unique_ptr<Session>> session = init.get();
    ASSERT_TRUE(session.ok()) << session.status();
    sessions_.push_back(std::move(*session));
  }
  OnEveryRank([](size_t, Session& session) {
    const int32_t r = session.rank();
    struct Case {
      v1::ReduceOp op;
      std::vector<int32_t> want;  // for i = 0, 1, 2
    };
    // Ranks hold -1+i, 0+i, 1+i, 2+i.
    const std::vector<Case> cases = {
        {v1::REDUCE_OP_MIN, {-1, 0, 1}},
        {v1::REDUCE_OP_MAX, {2, 3, 4}},
        {v1::REDUCE_OP_PRODUCT, {0, 0, 24}},
        {v1::REDUCE_OP_BAND, {-1 & 0 & 1 & 2, 0 & 1 & 2 & 3, 1 & 2 & 3 & 4}},
        {v1::REDUCE_OP_BOR, {-1 | 0 | 1 | 2, 0 | 1 | 2 | 3, 1 | 2 | 3 | 4}},
        {v1::REDUCE_OP_BXOR, {-1 ^ 0 ^ 1 ^ 2, 0 ^ 1 ^ 2 ^ 3, 1 ^ 2 ^ 3 ^ 4}},
    };
    for (const auto& c : cases) {
      std::vector<int32_t> data = {r - 1, r, r + 1};
      ASSERT_TRUE(session.PushPull("ops", BufferOf(data), false, c.op).ok())
          << v1::ReduceOp_Name(c.op);
      EXPECT_THAT(data, ElementsAreArray(c.want)) << v1::ReduceOp_Name(c.op);
    }
    // Refused before anything is sent: average with an op other than sum.
    std::vector<float> f = {1.0f};
    const absl::Status both =
        session.PushPull("f", BufferOf(f), true, v1::REDUCE_OP_MAX);
    EXPECT_EQ(both.code(), absl::StatusCode::kInvalidArgument) << both;
    EXPECT_THAT(std::string(both.message()),
                HasSubstr("average applies to a sum only"));
    EXPECT_TRUE(
        session.PushPull("f", BufferOf(f), false, v1::REDUCE_OP_MAX).ok());
    EXPECT_EQ(f[0], 1.0f);
  });
}

// A caller that keeps its data in the tensor's shared memory (Regions):
// the input region is only read (it keeps the local values), the result
// region receives the mean, and Synchronize has nothing to copy.
TEST_F(SessionTest, PushPullFromAndIntoTheSharedRegionsCopiesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartJob("regions", 2, 2));
  OnEveryRank([](size_t, Session& session) {
    const absl::StatusOr<HostRegions> missing = session.Regions("w");
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound)
        << missing.status();
    EXPECT_THAT(missing.status().message(), HasSubstr("not declared"));
    ASSERT_TRUE(session
                    .DeclareTensor("w", v1::DATA_TYPE_FLOAT32, {3, 5},
                                   v1::COLLECTIVE_OP_PUSH_PULL)
                    .ok());
    const absl::StatusOr<HostRegions> regions = session.Regions("w");
    ASSERT_TRUE(regions.ok()) << regions.status();
    ASSERT_EQ(regions->size_bytes, 15 * 4);
    auto* input = reinterpret_cast<float*>(regions->input);
    const auto* result = reinterpret_cast<const float*>(regions->output);
    const int r = session.rank();
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i < 15; ++i) input[i] = r + i + step;
      Buffer buffer{regions->input, v1::DATA_TYPE_FLOAT32, {3, 5}};
      auto handle = session.PushPullAsync(
          "w", buffer, const_cast<uint8_t*>(regions->output), true);
      ASSERT_TRUE(handle.ok()) << handle.status();
      ASSERT_TRUE(session.Synchronize(*handle).ok());
      for (int i = 0; i < 15; ++i) {
        // Ranks 0..3: the mean of r is 1.5.
        EXPECT_EQ(result[i], 1.5f + i + step) << "step " << step << " " << i;
        EXPECT_EQ(input[i], static_cast<float>(r + i + step))
            << "the input region was written";
      }
    }
  });
}

TEST_F(SessionTest, BroadcastGivesEveryRankTheRootsExactBytes) {
  ASSERT_NO_FATAL_FAILURE(StartJob("broadcast", 2, 2));
  // Different on every rank and root, and not all valid numbers.
  const auto fill = [](std::vector<uint8_t>& bytes, int rank, int salt) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>(rank * 67 + salt * 13 + i * 7);
    }
  };
  const auto bytes_of = [](const auto& values) {
    const auto* begin = reinterpret_cast<const uint8_t*>(values.data());
    return std::vector<uint8_t>(begin,
                                begin + values.size() * sizeof(values[0]));
  };
  OnEveryRank([&](size_t, Session& session) {
    const int r = session.rank();
    // Root 3, then root 0, on the same name.
    for (int root : {3, 0}) {
      std::vector<uint8_t> bytes(37);
      fill(bytes, r, root);
      ASSERT_TRUE(session.Broadcast("bytes", BufferOf(bytes), root).ok());
      std::vector<uint8_t> want(bytes.size());
      fill(want, root, root);
      EXPECT_EQ(bytes, want) << "root " << root;
    }

    // Parameters: float32 [3,4], a NaN among them, and int64 [5], from
    // root 2 and then root 1.
    for (int root : {2, 1}) {
      std::vector<uint8_t> w_bytes(12 * sizeof(float));
      std::vector<uint8_t> b_bytes(5 * sizeof(int64_t));
      fill(w_bytes, r, root);
      fill(b_bytes, r, root + 100);
      std::vector<float> w(12);
      std::vector<int64_t> b(5);
      std::memcpy(w.data(), w_bytes.data(), w_bytes.size());
      std::memcpy(b.data(), b_bytes.data(), b_bytes.size());
      w[0] = std::numeric_limits<float>::quiet_NaN();
      absl::Status status = session.BroadcastParameters(
          {{"w", BufferOf(w, {3, 4})}, {"b", BufferOf(b)}}, root);
      ASSERT_TRUE(status.ok()) << status;
      std::vector<uint8_t> w_want(w_bytes.size());
      std::vector<uint8_t> b_want(b_bytes.size());
      fill(w_want, root, root);
      fill(b_want, root, root + 100);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(w_want.data(), &nan, sizeof(nan));
      EXPECT_EQ(bytes_of(w), w_want) << "root " << root;
      EXPECT_EQ(bytes_of(b), b_want) << "root " << root;
    }
    // The parameters are the tensors "Parameter.<name>".
    EXPECT_TRUE(session
                    .DeclareTensor("Parameter.w", v1::DATA_TYPE_FLOAT32, {3, 4},
                                   v1::COLLECTIVE_OP_BROADCAST)
                    .ok());
  });
}

TEST_F(SessionTest, MisuseIsRefusedNamingTheTensorAndWhatToDo) {
  ASSERT_NO_FATAL_FAILURE(StartJob("misuse", 1, 1));
  Session& session = *sessions_[0];
  std::vector<float> g = {1, 2, 3, 4};
  auto first = session.PushPullAsync("g", BufferOf(g), false);
  ASSERT_TRUE(first.ok()) << first.status();

  auto second = session.PushPullAsync("g", BufferOf(g), false);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr("\"g\" already has an operation in flight"),
                    HasSubstr("step 0"), HasSubstr("synchronize it")));
  ASSERT_TRUE(session.Synchronize(*first).ok());
  EXPECT_EQ(g, (std::vector<float>{1, 2, 3, 4}));
  // Synchronizing again returns the same status and copies nothing.
  g[0] = 42;
  EXPECT_TRUE(session.Synchronize(*first).ok());
  EXPECT_EQ(g[0], 42);

  auto null_data = session.PushPullAsync(
      "n", Buffer{nullptr, v1::DATA_TYPE_FLOAT32, {4}}, false);
  EXPECT_EQ(null_data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(null_data.status().message(),
              AllOf(HasSubstr("\"n\""), HasSubstr("data is null")));
  for (int32_t root : {1, -1}) {
    auto bad_root = session.BroadcastAsync("p", BufferOf(g), root);
    EXPECT_EQ(bad_root.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        bad_root.status().message(),
        AllOf(HasSubstr("\"p\""), HasSubstr(absl::StrCat("root rank ", root)),
              HasSubstr("ranks 0..0")));
  }
  auto no_dtype = session.PushPullAsync(
      "u", Buffer{g.data(), v1::DATA_TYPE_UNSPECIFIED, {4}}, false);
  EXPECT_EQ(no_dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_dtype.status().message(), HasSubstr("unsupported dtype"));
  EXPECT_EQ(session.Synchronize(nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  // None of that disturbed "g": its next step runs.
  g = {5, 6, 7, 8};
  EXPECT_TRUE(session.PushPull("g", BufferOf(g), true).ok());
  EXPECT_EQ(g, (std::vector<float>{5, 6, 7, 8}));
}

// A name may change its dtype, shape and collective between operations, as
// in Horovod and BytePS: each change declares it anew (its next version) on
// every rank, with its steps from 0. Only a change while an operation of the
// name is in flight is refused, and that refusal changes nothing.
TEST_F(SessionTest, ANameIsDeclaredAnewOnceNothingOfItIsInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartJob("names", 2, 1));
  OnEveryRank([](size_t, Session& session) {
    // The job's rank, not the session's index: nodes get their ranks in the
    // order they join, and the broadcast below is from rank 1.
    const int rank = session.rank();
    const float r = static_cast<float>(rank);
    std::vector<float> x = {r, r + 1, r + 2, r + 3};
    ASSERT_TRUE(session.PushPull("x", BufferOf(x, {2, 2}), false).ok());
    EXPECT_EQ(x, (std::vector<float>{1, 3, 5, 7}));

    std::vector<int64_t> as_int = {10 * static_cast<int64_t>(rank + 1), 1, 2};
    ASSERT_TRUE(session.PushPull("x", BufferOf(as_int), false).ok());
    EXPECT_EQ(as_int, (std::vector<int64_t>{30, 2, 4}));

    std::vector<float> y = {r, r};
    auto in_flight = session.PushPullAsync("x", BufferOf(y), false);
    ASSERT_TRUE(in_flight.ok()) << in_flight.status();
    const absl::Status anew = session.DeclareTensor(
        "x", v1::DATA_TYPE_FLOAT64, {2}, v1::COLLECTIVE_OP_PUSH_PULL);
    EXPECT_EQ(anew.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(anew.message(),
                AllOf(HasSubstr("tensor \"x\" is declared anew as "
                                "DATA_TYPE_FLOAT64[2]"),
                      HasSubstr("DATA_TYPE_FLOAT32[2] COLLECTIVE_OP_PUSH_PULL "
                                "(step 0) is in flight"),
                      HasSubstr("synchronize that one first")));
    std::vector<float> three(3);
    auto started = session.PushPullAsync("x", BufferOf(three), false);
    EXPECT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(session.Synchronize(*in_flight).ok());
    EXPECT_EQ(y, (std::vector<float>{1, 1}));

    std::vector<double> root = {r * 2, r * 3, 4};
    ASSERT_TRUE(session.Broadcast("x", BufferOf(root), 1).ok());
    EXPECT_EQ(root, (std::vector<double>{2, 3, 4}));

    // Back to the first spec: one more version, steps from 0 again.
    for (int step = 0; step < 3; ++step) {
      x = {r, 1, 1, static_cast<float>(step)};
      ASSERT_TRUE(session.PushPull("x", BufferOf(x, {2, 2}), false).ok());
      EXPECT_EQ(x, (std::vector<float>{1, 2, 2, 2.0f * step}));
    }
    // Declaring a name alike again changes nothing.
    EXPECT_TRUE(session
                    .DeclareTensor("x", v1::DATA_TYPE_FLOAT32, {2, 2},
                                   v1::COLLECTIVE_OP_PUSH_PULL)
                    .ok());
  });
}

TEST_F(SessionTest, SynchronizeTimesOutWhileARankLagsThenDelivers) {
  ASSERT_NO_FATAL_FAILURE(StartJob("lag", 2, 1));
  Session& early = *sessions_[0];
  Session& late = *sessions_[1];
  std::vector<int64_t> a = {1, 2, 3};
  std::vector<int64_t> b = {10, 20, 30};
  auto early_handle = early.PushPullAsync("g", BufferOf(a), false);
  ASSERT_TRUE(early_handle.ok()) << early_handle.status();

  const auto start = std::chrono::steady_clock::now();  // the wait's clock
  absl::Status status =
      early.Synchronize(*early_handle, std::chrono::milliseconds(200));
  const absl::Duration waited =
      absl::FromChrono(std::chrono::steady_clock::now() - start);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  // A wait that ran out, told apart from an outcome without a second look.
  EXPECT_TRUE(StillInFlight(status));
  EXPECT_FALSE(StillInFlight(absl::DeadlineExceededError("an outcome")));
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"g\" step 0"),
                    HasSubstr("did not complete within 200 ms"),
                    HasSubstr("still in flight")));
  EXPECT_GE(waited, absl::Milliseconds(200));
  EXPECT_LT(waited, absl::Seconds(5));
  EXPECT_FALSE(early.Poll(*early_handle));
  EXPECT_EQ(a, (std::vector<int64_t>{1, 2, 3}));
  // Still in flight: the name takes no second operation.
  EXPECT_EQ(early.PushPullAsync("g", BufferOf(a), false).status().code(),
            absl::StatusCode::kFailedPrecondition);

  auto late_handle = late.PushPullAsync("g", BufferOf(b), false);
  ASSERT_TRUE(late_handle.ok()) << late_handle.status();
  EXPECT_TRUE(late.Synchronize(*late_handle, kWait).ok());
  EXPECT_TRUE(early.Synchronize(*early_handle, kWait).ok());
  EXPECT_EQ(a, (std::vector<int64_t>{11, 22, 33}));
  EXPECT_EQ(b, (std::vector<int64_t>{11, 22, 33}));
}

TEST_F(SessionTest, KilledAgentFailsEveryOperationInFlightNamingTheCause) {
  // The coordinator hears of the kill when the agent's stream resets; at
  // the latest after 1 s of silence instead of 6.
  ASSERT_NO_FATAL_FAILURE(
      StartJob("kill", 2, 2,
               {"--heartbeat_interval_ms=200", "--liveness_timeout_ms=1000"}));
  std::vector<std::vector<float>> data(sessions_.size(),
                                       std::vector<float>(1024, 1.0f));
  OnEveryRank([&](size_t i, Session& session) {
    EXPECT_TRUE(session.PushPull("g", BufferOf(data[i]), false).ok());
  });
  // Step 1: every rank but the last one (node 2, local rank 1) enqueues,
  // so nothing can complete before node 2's agent dies.
  std::vector<OperationHandle> in_flight;
  for (size_t i = 0; i + 1 < sessions_.size(); ++i) {
    auto handle = sessions_[i]->PushPullAsync("g", BufferOf(data[i]), false);
    ASSERT_TRUE(handle.ok()) << handle.status();
    in_flight.push_back(*handle);
  }
  const absl::Time killed = absl::Now();
  cluster_.agent(2).Kill();

  std::vector<absl::Status> outcomes(sessions_.size());
  std::vector<absl::Duration> took(sessions_.size());
  OnEveryRank([&](size_t i, Session& session) {
    if (i < in_flight.size()) {
      outcomes[i] = session.Synchronize(in_flight[i], kWait);
    } else {
      // The rank that had not enqueued yet does so after the kill.
      auto handle = session.PushPullAsync("g", BufferOf(data[i]), false);
      outcomes[i] =
          handle.ok() ? session.Synchronize(*handle, kWait) : handle.status();
    }
    took[i] = absl::Now() - killed;
  });
  for (size_t i = 0; i < sessions_.size(); ++i) {
    const bool killed_node = i >= 2;
    SCOPED_TRACE(absl::StrCat("trainer ", i, " on node ", killed_node ? 2 : 1,
                              ": ", outcomes[i].ToString()));
    // Survivors hear which node was lost; the dead agent's trainers that
    // their agent is gone.
    if (killed_node) {
      EXPECT_EQ(outcomes[i].code(), absl::StatusCode::kUnavailable);
      EXPECT_THAT(outcomes[i].message(),
                  AllOf(HasSubstr(absl::StrCat("the session with the baton "
                                               "agent on ",
                                               cluster_.socket(2))),
                        HasSubstr("restart the trainer")));
    } else {
      EXPECT_EQ(outcomes[i].code(), absl::StatusCode::kAborted);
      EXPECT_THAT(outcomes[i].message(), HasSubstr("node n2"));
    }
    // At most the liveness timeout (1 s) and a few ticks, with margin.
    EXPECT_LT(took[i], absl::Seconds(5));
    EXPECT_EQ(data[i], std::vector<float>(1024, 1.0f * 4));
  }
}

TEST_F(SessionTest, AFencedSessionRunsNothingInTheGenerationAfterAReform) {
  // 3 nodes, 2 enough: node 3's loss re-forms the job with the survivors.
  ASSERT_NO_FATAL_FAILURE(
      StartJob("fence", 3, 1,
               {"--heartbeat_interval_ms=200", "--liveness_timeout_ms=1000"},
               /*min_nodes=*/2));
  std::vector<std::vector<int64_t>> data(sessions_.size(),
                                         std::vector<int64_t>(16, 1));
  const int64_t first = sessions_[0]->generation();
  OnEveryRank([&](size_t i, Session& session) {
    EXPECT_EQ(session.generation(), first);
    session.FenceGeneration(first);
    EXPECT_TRUE(session.PushPull("g", BufferOf(data[i]), false).ok());
  });
  cluster_.agent(3).Kill();
  sessions_.pop_back();  // its agent is gone

  OnEveryRank([&](size_t i, Session& session) {
    absl::StatusOr<int64_t> next = session.WaitForGeneration(first, kWait);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_GT(*next, first);
    EXPECT_EQ(session.size(), 2);
    // Started after the re-form, fenced to the generation before: it fails
    // at once instead of running in the new one.
    absl::Status fenced = session.PushPull("g", BufferOf(data[i]), false);
    EXPECT_EQ(fenced.code(), absl::StatusCode::kAborted) << fenced;
    EXPECT_THAT(fenced.message(),
                HasSubstr(absl::StrCat("enqueued for generation ", first)));
    // Synchronized in the new generation (the ranks agree on the step
    // floor, as baton.torch.elastic does), it runs there.
    session.FenceGeneration(*next);
    std::vector<int64_t> step(2, 0);
    step[static_cast<size_t>(session.rank())] = session.NextStep();
    ASSERT_TRUE(session
                    .PushPull(absl::StrCat("baton.agree.", *next),
                              BufferOf(step), false)
                    .ok());
    session.SetStepFloor(std::max(step[0], step[1]) + 5);
    std::fill(data[i].begin(), data[i].end(), int64_t{1});
    absl::Status status = session.PushPull("g", BufferOf(data[i]), false);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(data[i], std::vector<int64_t>(16, 2));
  });
}

TEST_F(SessionTest,
       BelowMinNodesTheSurvivorsHearWhyOnceTheReformTimeoutPassed) {
  // 2 nodes, both needed: after node 2's loss the coordinator waits 2 s for
  // a replacement, then fails the job; a survivor waiting for the next
  // generation hears why instead of waiting on.
  ASSERT_NO_FATAL_FAILURE(
      StartJob("below", 2, 1,
               {"--heartbeat_interval_ms=200", "--liveness_timeout_ms=1000",
                "--reform_timeout_ms=2000"},
               /*min_nodes=*/2));
  const int64_t first = sessions_[0]->generation();
  cluster_.agent(2).Kill();
  sessions_.pop_back();
  const absl::Time killed = absl::Now();
  absl::StatusOr<int64_t> next = sessions_[0]->WaitForGeneration(first, kWait);
  const absl::Duration took = absl::Now() - killed;
  ASSERT_FALSE(next.ok()) << "generation " << *next;
  EXPECT_NE(next.status().code(), absl::StatusCode::kDeadlineExceeded)
      << next.status();
  EXPECT_THAT(next.status().message(),
              AllOf(HasSubstr("failed"), HasSubstr("node n2")));
  // The reform timeout, not kWait.
  EXPECT_LT(took, absl::Seconds(10));
}

TEST_F(SessionTest, TheStepFloorRaisesEveryNameButBatonsOwn) {
  ASSERT_NO_FATAL_FAILURE(StartJob("floor", 1, 1));
  Session& session = *sessions_[0];
  std::vector<float> value(4, 1.0f);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(session.PushPull("a", BufferOf(value), false).ok());
  }
  ASSERT_TRUE(session.PushPull("baton.own", BufferOf(value), false).ok());
  EXPECT_EQ(session.NextStep(),
            3);  // "a" did steps 0..2; baton.own is not counted
  session.SetStepFloor(10);
  EXPECT_EQ(session.NextStep(), 10);
  // A floor never lowers a step.
  session.SetStepFloor(4);
  EXPECT_EQ(session.NextStep(), 10);
  // "a" and a new name "b" go on at 10, baton.own at its own step 1.
  for (const std::string name : {"a", "b", "baton.own"}) {
    for (int i = 0; i < 2; ++i) {
      absl::Status status = session.PushPull(name, BufferOf(value), false);
      EXPECT_TRUE(status.ok()) << name << ": " << status;
    }
  }
  EXPECT_EQ(session.NextStep(), 12);
}

TEST_F(SessionTest, ShutdownDrainsOperationsInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartJob("drain", 2, 2));
  OnEveryRank([](size_t, Session& session) {
    const int rank = session.rank();
    std::vector<float> a(64, static_cast<float>(rank));
    std::vector<int64_t> b(8, int64_t{1} << (8 * rank));
    auto ha = session.PushPullAsync("a", BufferOf(a), true);
    auto hb = session.PushPullAsync("b", BufferOf(b), false);
    ASSERT_TRUE(ha.ok() && hb.ok());
    // Returns once every rank's operations ran.
    EXPECT_TRUE(session.Shutdown().ok());
    EXPECT_TRUE(session.Poll(*ha));
    EXPECT_TRUE(session.Poll(*hb));
    // The results are still delivered by Synchronize.
    EXPECT_TRUE(session.Synchronize(*ha).ok());
    EXPECT_TRUE(session.Synchronize(*hb).ok());
    EXPECT_EQ(a, std::vector<float>(64, 1.5f));
    EXPECT_EQ(b, std::vector<int64_t>(8, 0x01010101));
    auto after = session.PushPullAsync("a", BufferOf(a), true);
    EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(after.status().message(), HasSubstr("shut down"));
    EXPECT_EQ(session.rank(), rank);
    EXPECT_EQ(session.size(), 4);
  });
}

TEST_F(SessionTest, ShutdownAbandonsWhatCannotDrainAndSaysHowMuch) {
  ASSERT_NO_FATAL_FAILURE(StartJob("abandon", 2, 2));
  // Trainers 0..2 enqueue "g" and "h"; trainer 3 never does, so nothing
  // can drain. Trainer 0 shuts down; 1 (its node) and 2 (the other node)
  // wait.
  const size_t leaver = 0;
  const size_t waiting = sessions_.size() - 1;
  std::vector<std::vector<float>> g(waiting, std::vector<float>(16, 1.0f));
  std::vector<std::vector<float>> h(waiting, std::vector<float>(4, 2.0f));
  std::vector<OperationHandle> hg;
  std::vector<OperationHandle> hh;
  for (size_t i = 0; i < waiting; ++i) {
    auto started_g = sessions_[i]->PushPullAsync("g", BufferOf(g[i]), false);
    auto started_h = sessions_[i]->PushPullAsync("h", BufferOf(h[i]), false);
    ASSERT_TRUE(started_g.ok() && started_h.ok());
    hg.push_back(*started_g);
    hh.push_back(*started_h);
  }

  Session& session = *sessions_[leaver];
  const int32_t rank = session.rank();
  // The steady clock Shutdown's deadline uses: the wall clock can be slewed
  // (it once measured 499.986 ms here).
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = session.Shutdown(std::chrono::milliseconds(500));
  const absl::Duration took =
      absl::FromChrono(std::chrono::steady_clock::now() - start);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("2 operation(s) still in flight after 500 ms"),
                    HasSubstr("tensor \"g\" step 0")));
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(2));

  // The abandoned operations are finished, failed, and wrote nothing.
  EXPECT_TRUE(session.Poll(hg[leaver]));
  EXPECT_TRUE(session.Poll(hh[leaver]));
  absl::Status abandoned = session.Synchronize(hg[leaver]);
  EXPECT_EQ(abandoned.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(abandoned.message(), HasSubstr("abandoned"));
  EXPECT_EQ(session.Synchronize(hh[leaver]).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(g[leaver], std::vector<float>(16, 1.0f));
  EXPECT_EQ(h[leaver], std::vector<float>(4, 2.0f));

  absl::Status again = session.Shutdown();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("shut down"));
  EXPECT_EQ(
      session.PushPullAsync("g", BufferOf(g[leaver]), false).status().code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session.rank(), rank);
  EXPECT_EQ(session.size(), 4);

  // A trainer that left with work unfinished fails the job: the others'
  // operations fail naming it, instead of waiting for it.
  for (size_t i = leaver + 1; i < waiting; ++i) {
    for (const OperationHandle& handle : {hg[i], hh[i]}) {
      absl::Status failed = sessions_[i]->Synchronize(handle, kWait);
      EXPECT_EQ(failed.code(), absl::StatusCode::kAborted) << failed;
      EXPECT_THAT(failed.message(), AllOf(HasSubstr("trainer local rank 0"),
                                          HasSubstr("on node n1")));
    }
    EXPECT_EQ(g[i], std::vector<float>(16, 1.0f));
  }
}

TEST_F(SessionTest, InitFromTheEnvironmentChecksTheLaunchersRankAndSize) {
  ASSERT_TRUE(cluster_.Start(1).ok());
  const auto launch = [&](const std::string& job, const char* rank,
                          const char* world_size) {
    ScopedEnvironment environment({
        {"BATON_AGENT_SOCKET", cluster_.socket(1)},
        {"BATON_JOB", job},
        {"BATON_NODES", "1"},
        {"LOCAL_RANK", "0"},
        {"LOCAL_WORLD_SIZE", "1"},
        {"RANK", rank == nullptr ? std::optional<std::string>()
                                 : std::optional<std::string>(rank)},
        {"WORLD_SIZE", std::string(world_size)},
        {"BATON_MIN_NODES", std::nullopt},
        {"BATON_PARTITION_BYTES", std::nullopt},
        {"BATON_SCHEDULING", std::nullopt},
        {"BATON_SHM_CHANNEL", std::nullopt},
    });
    return Session::Init();
  };

  auto wrong_rank = launch("wrong-rank", "1", "1");
  EXPECT_EQ(wrong_rank.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_rank.status().message(),
              AllOf(HasSubstr("set RANK=1"), HasSubstr("assigned 0"),
                    HasSubstr("unset RANK")));
  auto wrong_size = launch("wrong-size", "0", "2");
  EXPECT_EQ(wrong_size.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_size.status().message(),
              AllOf(HasSubstr("set WORLD_SIZE=2"), HasSubstr("assigned 1")));
  auto not_a_number = launch("nan-rank", "first", "1");
  EXPECT_EQ(not_a_number.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_a_number.status().message(), HasSubstr("RANK=\"first\""));

  auto consistent = launch("consistent", "0", "1");
  ASSERT_TRUE(consistent.ok()) << consistent.status();
  EXPECT_EQ((*consistent)->rank(), 0);
  EXPECT_EQ((*consistent)->size(), 1);
  EXPECT_TRUE((*consistent)->Shutdown().ok());
  auto without_rank = launch("no-rank", nullptr, "1");
  ASSERT_TRUE(without_rank.ok()) << without_rank.status();
  EXPECT_TRUE((*without_rank)->Shutdown().ok());
}

// A job name used again right after its previous job ended: the agents
// replace the ended job while it may not be reaped yet (they once
// dereferenced the replaced job there and crashed).
TEST_F(SessionTest, AJobNameRunsAgainAndAgainOnTheSameAgents) {
  ASSERT_TRUE(cluster_.Start(2).ok());
  for (int run = 0; run < 6; ++run) {
    std::vector<std::future<absl::Status>> ranks;
    for (int node = 1; node <= 2; ++node) {
      const ClientOptions options =
          cluster_.TrainerOptions(node, "again", 0, 1, 2);
      ranks.push_back(std::async(std::launch::async, [options, run] {
        absl::StatusOr<std::unique_ptr<Session>> session =
            Session::Init(options);
        if (!session.ok()) return session.status();
        std::vector<float> value = {1.0f};
        absl::Status status =
            (*session)->PushPull("x", BufferOf(value), /*average=*/false);
        if (status.ok() && value[0] != 2.0f) {
          status = absl::InternalError(
              absl::StrCat("run ", run, ": got ", value[0], " instead of 2"));
        }
        absl::Status shutdown = (*session)->Shutdown();
        return status.ok() ? shutdown : status;
      }));
    }
    for (auto& rank : ranks) {
      absl::Status status = rank.get();
      ASSERT_TRUE(status.ok()) << "run " << run << ": " << status;
    }
  }
  for (int node = 1; node <= 2; ++node) {
    const ProcessExit exit = cluster_.agent(node).Terminate();
    EXPECT_TRUE(exit.ok()) << "agent " << node << ": " << exit.ToString();
  }
}

}  // namespace
}  // namespace baton
