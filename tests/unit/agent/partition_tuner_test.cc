// PartitionTuner on synthetic links: what it settles at, how it resists
// noise, when it changes its mind, and its bounds. Samples are computed, not
// measured, and the noise comes from a seeded generator, so every run sees
// the same sequences.
#include "agent/scheduler/partition_tuner.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Options = PartitionTuner::Options;
using Proposal = PartitionTuner::Proposal;
using Sample = PartitionTuner::Sample;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;
// Bytes per second of a 1 Gbit/s link.
constexpr double kGigabit = 1e9 / 8;

struct Link {
  absl::Duration latency;
  double bytes_per_second = 0;
};

absl::Duration TimeOn(const Link& link, int64_t bytes) {
  return link.latency +
         absl::Seconds(static_cast<double>(bytes) / link.bytes_per_second);
}

// Partition-like sizes, one size group each.
const std::vector<int64_t>& Sizes() {
  static const auto* sizes =
      new std::vector<int64_t>{4 * kKiB, 16 * kKiB, 64 * kKiB, 256 * kKiB};
  return *sizes;
}

// `count` exact samples of `link`, cycling through `sizes`.
std::vector<Sample> Exact(const Link& link, size_t count,
                          const std::vector<int64_t>& sizes = Sizes()) {
  std::vector<Sample> samples;
  for (size_t i = 0; i < count; ++i) {
    const int64_t bytes = sizes[i % sizes.size()];
    samples.push_back({bytes, TimeOn(link, bytes)});
  }
  return samples;
}

// `count` samples of `link` as a loaded machine measures them: each one
// +-10% off, and one in twenty preempted and 10x slower.
std::vector<Sample> Noisy(const Link& link, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // From the engine's bits (specified by the standard), not a distribution
  // (whose algorithm is the library's), so every platform sees these values.
  const auto uniform = [&rng] {
    return static_cast<double>(rng() >> 11) * 0x1.0p-53;
  };
  std::vector<Sample> samples = Exact(link, count);
  for (Sample& sample : samples) {
    double factor = 0.9 + 0.2 * uniform();
    if (uniform() < 0.05) factor *= 10;
    sample.took = sample.took * factor;
  }
  return samples;
}

void AddAll(PartitionTuner& tuner, const std::vector<Sample>& samples) {
  for (const Sample& sample : samples) tuner.Add(sample);
}

// Plays one node's scheduler alone (the minimum over one node is its own
// proposal): adds the samples, and after every `round` of them applies what
// the tuner proposes. Returns the partition sizes applied, each change once.
std::vector<int64_t> Schedule(PartitionTuner& tuner,
                              const std::vector<Sample>& samples,
                              size_t round = 8) {
  std::vector<int64_t> changes;
  for (size_t i = 0; i < samples.size(); ++i) {
    tuner.Add(samples[i]);
    if ((i + 1) % round != 0) continue;
    const Proposal proposal = tuner.Propose();
    if (proposal.partition_bytes != tuner.applied().partition_bytes) {
      changes.push_back(proposal.partition_bytes);
    }
    tuner.SetApplied(proposal);
  }
  return changes;
}

// Small bounds, so that the rule rather than the minimum decides.
Options SmallBounds() {
  Options options;
  options.min_partition_bytes = 4 * kKiB;
  return options;
}

// The rule's partition size before rounding: latency * bandwidth * 9 for
// f = 0.1.
double Least(const Link& link) {
  return absl::ToDoubleSeconds(link.latency) * link.bytes_per_second * 9;
}

TEST(PartitionTunerTest, GigabitLinkWith200usSettlesAt256KiB) {
  const Link link{absl::Microseconds(200), kGigabit};
  // 225,000 bytes: above 128 KiB, below 256 KiB.
  ASSERT_GT(Least(link), 128 * kKiB);
  ASSERT_LT(Least(link), 256 * kKiB);
  PartitionTuner tuner(SmallBounds());
  EXPECT_THAT(Schedule(tuner, Exact(link, 256)), ElementsAre(256 * kKiB));

  const std::optional<PartitionTuner::Fit> fit = tuner.fit();
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(absl::ToDoubleMicroseconds(fit->latency), 200, 0.01);
  EXPECT_NEAR(fit->bytes_per_second / kGigabit, 1, 1e-6);
  EXPECT_EQ(fit->samples, 128u);
  EXPECT_LT(fit->residual, 1e-6);
  // One channel: the partition running and one spare.
  const Proposal proposal = tuner.Propose();
  EXPECT_EQ(proposal.partition_bytes, 256 * kKiB);
  EXPECT_EQ(proposal.credit_bytes, 2 * 256 * kKiB);
}

TEST(PartitionTunerTest, HundredMegabitLinkWith50usSettlesAt8KiB) {
  const Link link{absl::Microseconds(50), kGigabit / 10};
  // 5,625 bytes.
  PartitionTuner tuner(SmallBounds());
  EXPECT_THAT(Schedule(tuner, Exact(link, 256)), ElementsAre(8 * kKiB));
  const Proposal proposal = tuner.Propose();
  EXPECT_EQ(proposal.partition_bytes, 8 * kKiB);
  EXPECT_EQ(proposal.credit_bytes, 16 * kKiB);
  EXPECT_NEAR(absl::ToDoubleMicroseconds(tuner.fit()->latency), 50, 0.01);
}

TEST(PartitionTunerTest, LatencyFreeLinkChoosesTheMinimum) {
  const Link link{absl::ZeroDuration(), 10 * kGigabit};
  PartitionTuner small(SmallBounds());
  EXPECT_THAT(Schedule(small, Exact(link, 256)), ElementsAre(4 * kKiB));
  EXPECT_EQ(small.fit()->latency, absl::ZeroDuration());

  PartitionTuner defaults((Options()));
  EXPECT_THAT(Schedule(defaults, Exact(link, 256)), ElementsAre(256 * kKiB));
}

TEST(PartitionTunerTest, JitterAndOutliersDoNotMoveTheChoice) {
  // 185,625 bytes, halfway (in ratio) between 128 KiB and 256 KiB, and the
  // 225,000 of 200 us, 16% short of 256 KiB.
  for (double latency_us : {165.0, 200.0}) {
    for (uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat(latency_us, " us, seed ", seed));
      const Link link{absl::Microseconds(latency_us), kGigabit};
      PartitionTuner tuner(SmallBounds());
      // Twenty windows: the first change decides, and nothing after it
      // changes the value in use.
      EXPECT_THAT(Schedule(tuner, Noisy(link, 20 * 128, seed)),
                  ElementsAre(256 * kKiB));

      const std::optional<PartitionTuner::Fit> fit = tuner.fit();
      ASSERT_TRUE(fit.has_value());
      EXPECT_NEAR(absl::ToDoubleMicroseconds(fit->latency), latency_us,
                  latency_us * 0.1);
      EXPECT_NEAR(fit->bytes_per_second / kGigabit, 1, 0.1);
      // The line misses a typical sample by its jitter, not by the
      // outliers.
      EXPECT_GT(fit->residual, 0.01);
      EXPECT_LT(fit->residual, 0.1);
    }
  }
}

TEST(PartitionTunerTest, SameSamplesGiveTheSameFitsAndProposals) {
  const std::vector<Sample> samples =
      Noisy({absl::Microseconds(300), kGigabit}, 600, /*seed=*/7);
  PartitionTuner a(SmallBounds()), b(SmallBounds());
  for (const Sample& sample : samples) {
    a.Add(sample);
    b.Add(sample);
    const std::optional<PartitionTuner::Fit> fa = a.fit(), fb = b.fit();
    ASSERT_EQ(fa.has_value(), fb.has_value());
    if (fa.has_value()) {
      EXPECT_EQ(fa->latency, fb->latency);
      EXPECT_EQ(fa->bytes_per_second, fb->bytes_per_second);
      EXPECT_EQ(fa->residual, fb->residual);
    }
    EXPECT_EQ(a.Propose().partition_bytes, b.Propose().partition_bytes);
    EXPECT_EQ(a.Propose().credit_bytes, b.Propose().credit_bytes);
  }
}

TEST(PartitionTunerTest, OneSizeGivesNoFitAndKeepsTheInitialValues) {
  const Link link{absl::Microseconds(200), kGigabit};
  const Options options = SmallBounds();
  const auto initial = [&](const PartitionTuner& tuner) {
    const Proposal proposal = tuner.Propose();
    EXPECT_EQ(proposal.partition_bytes, options.initial_partition_bytes);
    EXPECT_EQ(proposal.credit_bytes, options.initial_credit_bytes);
  };

  PartitionTuner one_size(options);
  AddAll(one_size, Exact(link, 500, {kMiB}));
  EXPECT_FALSE(one_size.fit().has_value());
  initial(one_size);

  // Two sizes of one size group are one point.
  PartitionTuner one_group(options);
  AddAll(one_group, Exact(link, 500, {kMiB, kMiB + kMiB / 2}));
  EXPECT_FALSE(one_group.fit().has_value());
  initial(one_group);

  // Two groups, but sizes less than 2x apart: the slope would be noise.
  PartitionTuner close(options);
  AddAll(close, Exact(link, 500, {900 * kKiB, 1200 * kKiB}));
  EXPECT_FALSE(close.fit().has_value());
  initial(close);
}

TEST(PartitionTunerTest, FitNeedsMinSamplesInSizesOfThree) {
  const Link link{absl::Microseconds(200), kGigabit};
  PartitionTuner tuner(SmallBounds());
  const std::vector<Sample> samples = Exact(link, 16, {4 * kKiB, kMiB});
  AddAll(tuner, {samples.begin(), samples.end() - 1});
  EXPECT_FALSE(tuner.fit().has_value());
  tuner.Add(samples.back());
  ASSERT_TRUE(tuner.fit().has_value());
  EXPECT_EQ(tuner.fit()->samples, 16u);

  // Two samples of a size are no point: one could be an outlier.
  PartitionTuner sparse(SmallBounds());
  AddAll(sparse, Exact(link, 30, {4 * kKiB}));
  AddAll(sparse, Exact(link, 2, {kMiB}));
  EXPECT_FALSE(sparse.fit().has_value());
}

TEST(PartitionTunerTest, FirstChangeWaitsForBothHalvesOfTheWindow) {
  const Link link{absl::Microseconds(200), kGigabit};
  PartitionTuner tuner(SmallBounds());
  const std::vector<Sample> samples = Exact(link, 32, {4 * kKiB, kMiB});
  // 16 samples fit, but each half of them (8) is too few to confirm it.
  AddAll(tuner, {samples.begin(), samples.begin() + 16});
  ASSERT_TRUE(tuner.fit().has_value());
  EXPECT_EQ(tuner.Propose().partition_bytes, 4 * kMiB);
  AddAll(tuner, {samples.begin() + 16, samples.end() - 1});
  EXPECT_EQ(tuner.Propose().partition_bytes, 4 * kMiB);
  tuner.Add(samples.back());
  EXPECT_EQ(tuner.Propose().partition_bytes, 256 * kKiB);
  // Proposing is not applying: nothing changed the values in use.
  EXPECT_EQ(tuner.applied().partition_bytes, 4 * kMiB);
}

TEST(PartitionTunerTest, FasterLinkMovesTheChoiceOnlyOnceTheWindowHasRefilled) {
  const Link slow{absl::Microseconds(50), kGigabit / 10};
  const Link fast{absl::Microseconds(200), kGigabit};
  PartitionTuner tuner(SmallBounds());
  EXPECT_THAT(Schedule(tuner, Exact(slow, 128)), ElementsAre(8 * kKiB));

  // For half a window the older half is the slow link's alone; it holds the
  // choice, whatever the mixed window in between fits (32 KiB at times).
  const std::vector<Sample> faster = Exact(fast, 128);
  EXPECT_THAT(Schedule(tuner, {faster.begin(), faster.begin() + 64}, 1),
              ElementsAre());
  EXPECT_EQ(tuner.Propose().partition_bytes, 8 * kKiB);
  // Within the next half the new link holds most of both halves: one change,
  // straight to its value.
  EXPECT_THAT(Schedule(tuner, {faster.begin() + 64, faster.end()}, 1),
              ElementsAre(256 * kKiB));
  EXPECT_NEAR(absl::ToDoubleMicroseconds(tuner.fit()->latency), 200, 0.01);
}

TEST(PartitionTunerTest, OnePowerOfTwoIsNotEnoughToChange) {
  PartitionTuner tuner(SmallBounds());
  // 225,000 bytes: 256 KiB.
  EXPECT_THAT(Schedule(tuner, Exact({absl::Microseconds(200), kGigabit}, 256)),
              ElementsAre(256 * kKiB));
  const int64_t credit = tuner.applied().credit_bytes;

  // 450,000 bytes: 512 KiB would be best, but that is only 2x.
  EXPECT_THAT(Schedule(tuner, Exact({absl::Microseconds(400), kGigabit}, 512)),
              ElementsAre());
  EXPECT_EQ(tuner.applied().partition_bytes, 256 * kKiB);
  EXPECT_EQ(tuner.applied().credit_bytes, credit);

  // 900,000 bytes: 1 MiB, 4x away, changes.
  EXPECT_THAT(Schedule(tuner, Exact({absl::Microseconds(800), kGigabit}, 512)),
              ElementsAre(kMiB));
  EXPECT_EQ(tuner.applied().credit_bytes, 2 * kMiB);
}

TEST(PartitionTunerTest, CreditScalesWithChannels) {
  const Link link{absl::Microseconds(200), kGigabit};
  for (int channels : {1, 2, 4, 8}) {
    SCOPED_TRACE(channels);
    Options options = SmallBounds();
    options.channels = channels;
    PartitionTuner tuner(options);
    AddAll(tuner, Exact(link, 128));
    // Every channel busy plus one spare: a partition takes over 10 times as
    // long as a round, so up to 10 channels return one partition per round.
    EXPECT_EQ(tuner.Propose().partition_bytes, 256 * kKiB);
    EXPECT_EQ(tuner.Propose().credit_bytes, (channels + 1) * 256 * kKiB);
  }
}

TEST(PartitionTunerTest, LatencyBoundPartitionsGetMoreSpares) {
  const Link link{absl::Microseconds(200), kGigabit};
  Options options = SmallBounds();
  options.max_partition_bytes = 16 * kKiB;
  options.channels = 4;
  PartitionTuner tuner(options);
  AddAll(tuner, Exact(link, 128));
  // A 16 KiB partition takes 331 us, so during a 200 us round 4 channels
  // return 2.4 partitions: 3 spares.
  EXPECT_EQ(tuner.Propose().partition_bytes, 16 * kKiB);
  EXPECT_EQ(tuner.Propose().credit_bytes, (4 + 3) * 16 * kKiB);
}

TEST(PartitionTunerTest, ValuesAreMultiplesOf8WithinTheBounds) {
  Options options;
  options.min_partition_bytes = 24 * kKiB;     // not a power of two
  options.max_partition_bytes = 3 * kMiB + 8;  // nor this
  options.channels = 3;
  for (double latency_us : {0.0, 1.0, 10.0, 50.0, 200.0, 1000.0, 20000.0}) {
    for (double gigabits : {0.01, 0.1, 1.0, 10.0, 100.0}) {
      SCOPED_TRACE(absl::StrCat(latency_us, " us, ", gigabits, " Gbit/s"));
      const Link link{absl::Microseconds(latency_us), gigabits * kGigabit};
      PartitionTuner tuner(options);
      AddAll(tuner, Exact(link, 128));
      const Proposal proposal = tuner.Propose();
      const int64_t p = proposal.partition_bytes;
      EXPECT_EQ(p % 8, 0);
      EXPECT_GE(p, options.min_partition_bytes);
      EXPECT_LE(p, options.max_partition_bytes);
      EXPECT_EQ(proposal.credit_bytes % 8, 0);
      EXPECT_GE(proposal.credit_bytes, (options.channels + 1) * p);
      EXPECT_LE(proposal.credit_bytes, 2 * options.channels * p);
      // The smallest power of two the rule allows, or a bound.
      const double least = Least(link);
      if (p != options.min_partition_bytes &&
          p != options.max_partition_bytes) {
        EXPECT_EQ(p & (p - 1), 0);
        EXPECT_GE(static_cast<double>(p), least * (1 - 1e-6));
        EXPECT_LT(static_cast<double>(p / 2), least * (1 + 1e-6));
      } else if (p == options.max_partition_bytes) {
        EXPECT_GT(least, static_cast<double>(options.max_partition_bytes / 2));
      } else {
        EXPECT_LE(least, 32.0 * kKiB);
      }
    }
  }

  // A value in use outside the bounds is replaced, however close.
  PartitionTuner tuner(options);
  tuner.SetApplied({16 * kKiB, 64 * kKiB});
  AddAll(tuner, Exact({absl::ZeroDuration(), kGigabit}, 128));
  EXPECT_EQ(tuner.Propose().partition_bytes, 24 * kKiB);
}

TEST(PartitionTunerTest, CreditIsNeverBelowThePartition) {
  Options options = SmallBounds();
  options.initial_credit_bytes = kMiB;  // below the 4 MiB partition
  PartitionTuner tuner(options);
  EXPECT_EQ(tuner.Propose().credit_bytes, 4 * kMiB);

  // With a fit, a credit short of a spare is raised to one; one within 2x
  // above the need stays.
  AddAll(tuner, Exact({absl::Microseconds(200), kGigabit}, 128));
  tuner.SetApplied({256 * kKiB, 8 * kKiB});
  EXPECT_EQ(tuner.Propose().partition_bytes, 256 * kKiB);
  EXPECT_EQ(tuner.Propose().credit_bytes, 2 * 256 * kKiB);
  tuner.SetApplied({256 * kKiB, 4 * 256 * kKiB});
  EXPECT_EQ(tuner.Propose().credit_bytes, 4 * 256 * kKiB);
  tuner.SetApplied({256 * kKiB, 5 * 256 * kKiB});
  EXPECT_EQ(tuner.Propose().credit_bytes, 2 * 256 * kKiB);
}

TEST(PartitionTunerTest, TimeThatDoesNotGrowWithSizeGivesNoFit) {
  PartitionTuner tuner(SmallBounds());
  tuner.SetApplied({kMiB, 3 * kMiB});
  for (int i = 0; i < 64; ++i) {
    tuner.Add({16 * kKiB, absl::Microseconds(500)});
    tuner.Add({kMiB, absl::Microseconds(400)});
  }
  EXPECT_FALSE(tuner.fit().has_value());
  EXPECT_EQ(tuner.Propose().partition_bytes, kMiB);
  EXPECT_EQ(tuner.Propose().credit_bytes, 3 * kMiB);
}

TEST(PartitionTunerTest, NegativeInterceptIsClampedToZeroLatency) {
  const Link link{absl::Microseconds(-20), kGigabit};
  PartitionTuner tuner(SmallBounds());
  // From 64 KiB (524 us) on, so that every time is positive.
  AddAll(tuner, Exact(link, 128, {64 * kKiB, 256 * kKiB, kMiB}));
  const std::optional<PartitionTuner::Fit> fit = tuner.fit();
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->latency, absl::ZeroDuration());
  EXPECT_NEAR(fit->bytes_per_second / kGigabit, 1, 0.05);
  EXPECT_EQ(tuner.Propose().partition_bytes, 4 * kKiB);
}

TEST(PartitionTunerTest, IgnoresSamplesWithoutBytesOrTime) {
  const Link link{absl::Microseconds(200), kGigabit};
  PartitionTuner tuner(SmallBounds());
  for (const Sample& sample : Exact(link, 64)) {
    tuner.Add(sample);
    tuner.Add({0, absl::Milliseconds(1)});
    tuner.Add({kMiB, absl::ZeroDuration()});
  }
  ASSERT_TRUE(tuner.fit().has_value());
  EXPECT_EQ(tuner.fit()->samples, 64u);
  EXPECT_NEAR(absl::ToDoubleMicroseconds(tuner.fit()->latency), 200, 0.01);
}

TEST(PartitionTunerTest, WorkersAddFromSeveralThreads) {
  const Link link{absl::Microseconds(200), kGigabit};
  Options options = SmallBounds();
  options.channels = 4;
  PartitionTuner tuner(options);
  std::atomic<bool> reading{false};
  std::atomic<int> adding{4};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (!reading.load()) std::this_thread::yield();
      AddAll(tuner, Exact(link, 2000));
      adding.fetch_sub(1);
    });
  }
  // The scheduler reads while they add: only the values in use or the
  // link's.
  reading.store(true);
  do {
    const Proposal proposal = tuner.Propose();
    EXPECT_TRUE(proposal.partition_bytes == 4 * kMiB ||
                proposal.partition_bytes == 256 * kKiB)
        << proposal.partition_bytes;
  } while (adding.load() > 0);
  for (std::thread& worker : workers) worker.join();

  // Whatever the interleaving, the window holds the last 128 exact samples
  // of the one link.
  const std::optional<PartitionTuner::Fit> fit = tuner.fit();
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->samples, 128u);
  EXPECT_NEAR(absl::ToDoubleMicroseconds(fit->latency), 200, 0.01);
  EXPECT_EQ(tuner.Propose().partition_bytes, 256 * kKiB);
  EXPECT_EQ(tuner.Propose().credit_bytes, 5 * 256 * kKiB);
}

TEST(PartitionTunerTest, ValidateRejectsUnusableOptions) {
  EXPECT_TRUE(PartitionTuner::Validate(Options()).ok());
  const auto message = [](auto change) {
    Options options;
    change(options);
    const absl::Status status = PartitionTuner::Validate(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_THAT(message([](Options& o) { o.channels = 0; }),
              HasSubstr("channels is 0"));
  EXPECT_THAT(
      message([](Options& o) { o.min_partition_bytes = 1000 * 1000 + 4; }),
      HasSubstr("multiples of 8"));
  EXPECT_THAT(message([](Options& o) { o.max_partition_bytes = 128 << 10; }),
              HasSubstr("min <= max"));
  EXPECT_THAT(message([](Options& o) { o.initial_partition_bytes = 12; }),
              HasSubstr("initial values are partition 12"));
  EXPECT_THAT(message([](Options& o) { o.window = 24; }),
              HasSubstr("window is 24 and min_samples 16"));
  EXPECT_THAT(message([](Options& o) { o.min_samples = 5; }),
              HasSubstr("min_samples must be at least 6"));
  EXPECT_THAT(message([](Options& o) { o.overhead_fraction = 1; }),
              HasSubstr("overhead_fraction is 1"));
}

}  // namespace
}  // namespace baton::agent
