// How the default number of data communicators and gloo's segment size were
// chosen. Not a regression test: run it by hand with
//   gloo_transport_test --gtest_also_run_disabled_tests
//       --gtest_filter='GlooBenchmark.*'
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "agent/transport/gloo/gloo_transport.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/gloo_cluster.h"

namespace baton::agent {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kOpTimeout{10000};

// 64 MiB of float32 between 2 nodes on loopback: one allreduce on one
// communicator (gloo segment 1 MiB and 4 MiB) against 4 MiB partitions spread
// over 1, 2 and 4 communicators, one thread per communicator.
TEST(GlooBenchmark, DISABLED_Allreduce64MiB) {
  constexpr int kNodes = 2;
  constexpr size_t kBytes = size_t{64} << 20;
  constexpr size_t kCount = kBytes / sizeof(float);
  constexpr size_t kPartitionCount = (size_t{4} << 20) / sizeof(float);
  constexpr int kRepeats = 7;
  struct Config {
    std::string name;
    size_t segment;
    int communicators;
    bool partitioned;
  };
  const std::vector<Config> configs = {
      {"1 allreduce, 1 communicator, segment 1 MiB", size_t{1} << 20, 1, false},
      {"1 allreduce, 1 communicator, segment 4 MiB", size_t{4} << 20, 1, false},
      {"16 x 4 MiB, 1 communicator, segment 1 MiB", size_t{1} << 20, 1, true},
      {"16 x 4 MiB, 2 communicators, segment 1 MiB", size_t{1} << 20, 2, true},
      {"16 x 4 MiB, 4 communicators, segment 1 MiB", size_t{1} << 20, 4, true},
      {"16 x 4 MiB, 2 communicators, segment 4 MiB", size_t{4} << 20, 2, true},
      {"16 x 4 MiB, 4 communicators, segment 4 MiB", size_t{4} << 20, 4, true},
  };
  for (const Config& config : configs) {
    GlooTransport::Options options;
    options.max_segment_bytes = config.segment;
    Cluster cluster(kNodes, DataTransport::kGloo, options);
    ASSERT_TRUE(cluster.Connect(config.communicators));
    std::vector<std::vector<float>> data(kNodes,
                                         std::vector<float>(kCount, 1.0f));
    std::vector<double> times_ms;
    for (int repeat = 0; repeat < kRepeats; ++repeat) {
      const auto start = SteadyClock::now();
      std::vector<std::thread> threads;
      for (int rank = 0; rank < kNodes; ++rank) {
        for (int c = 0; c < config.communicators; ++c) {
          threads.emplace_back([&, rank, c] {
            Communicator& communicator = *cluster.communicators[rank][c];
            const CollectiveOptions collective{kOpTimeout, 0};
            if (!config.partitioned) {
              ASSERT_TRUE(communicator
                              .Allreduce(data[rank].data(), kCount,
                                         v1::DATA_TYPE_FLOAT32, collective)
                              .ok());
              return;
            }
            for (size_t p = c; p * kPartitionCount < kCount;
                 p += config.communicators) {
              ASSERT_TRUE(
                  communicator
                      .Allreduce(data[rank].data() + p * kPartitionCount,
                                 kPartitionCount, v1::DATA_TYPE_FLOAT32,
                                 collective)
                      .ok());
            }
          });
        }
      }
      for (std::thread& thread : threads) thread.join();
      times_ms.push_back(
          std::chrono::duration<double, std::milli>(SteadyClock::now() - start)
              .count());
    }
    std::sort(times_ms.begin(), times_ms.end());
    std::printf("%-48s median %7.1f ms  min %7.1f ms  (%.2f GB/s)\n",
                config.name.c_str(), times_ms[kRepeats / 2], times_ms[0],
                kBytes / times_ms[kRepeats / 2] / 1e6);
  }
}

}  // namespace
}  // namespace baton::agent
