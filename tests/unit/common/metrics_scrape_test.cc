#include "common/metrics_scrape.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace baton {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

constexpr double kInf = std::numeric_limits<double>::infinity();

// As prometheus-cpp exposes a histogram.
constexpr char kScrape[] =
    "# HELP h_seconds what\n"
    "# TYPE h_seconds histogram\n"
    "h_seconds_count 100\n"
    "h_seconds_sum 1.5\n"
    "h_seconds_bucket{le=\"0.01\"} 50\n"
    "h_seconds_bucket{le=\"0.1\"} 90\n"
    "h_seconds_bucket{le=\"+Inf\"} 100\n"
    "other_bucket{le=\"0.01\"} 7\n";

TEST(ParseHistogramTest, ReadsTheBucketsOfTheNamedHistogramOnly) {
  absl::StatusOr<ScrapedHistogram> h = ParseHistogram(kScrape, "h_seconds");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(h->bounds, ElementsAre(0.01, 0.1, kInf));
  EXPECT_THAT(h->counts, ElementsAre(50, 90, 100));
  EXPECT_EQ(h->total(), 100u);
}

TEST(ParseHistogramTest, RefusesWhatIsMissingOrMalformed) {
  EXPECT_EQ(ParseHistogram(kScrape, "absent").status().code(),
            absl::StatusCode::kNotFound);
  const absl::StatusOr<ScrapedHistogram> descending =
      ParseHistogram("h_bucket{le=\"1\"} 5\nh_bucket{le=\"0.5\"} 6\n", "h");
  EXPECT_EQ(descending.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(descending.status().message(), HasSubstr("ascending bounds"));
  EXPECT_EQ(ParseHistogram("h_bucket{le=\"1\"} 5\n", "h").status().code(),
            absl::StatusCode::kInvalidArgument);  // No +Inf.
  EXPECT_EQ(
      ParseHistogram("h_bucket{le=\"1\"} x\nh_bucket{le=\"+Inf\"} 1\n", "h")
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ScrapedHistogramTest, QuantilesInterpolateInsideTheirBucket) {
  const ScrapedHistogram h = *ParseHistogram(kScrape, "h_seconds");
  // 50 of 100 at most 10 ms: the median is the bucket's top.
  EXPECT_THAT(h.Quantile(0.5), Optional(DoubleNear(0.01, 1e-12)));
  // The 70th observation is half-way through the (10 ms, 100 ms] bucket.
  EXPECT_THAT(h.Quantile(0.7), Optional(DoubleNear(0.055, 1e-12)));
  // In +Inf: the last finite bound.
  EXPECT_THAT(h.Quantile(0.99), Optional(DoubleNear(0.1, 1e-12)));
  EXPECT_THAT(h.FractionAtMost(0.1), Optional(DoubleNear(0.9, 1e-12)));
  EXPECT_EQ(h.FractionAtMost(0.2), std::nullopt);
  EXPECT_EQ(ScrapedHistogram{}.Quantile(0.5), std::nullopt);
}

TEST(ScrapedHistogramTest, SinceIsWhatWasObservedBetweenTwoScrapes) {
  const ScrapedHistogram before = *ParseHistogram(kScrape, "h_seconds");
  const ScrapedHistogram after = *ParseHistogram(
      "h_seconds_bucket{le=\"0.01\"} 60\n"
      "h_seconds_bucket{le=\"0.1\"} 100\n"
      "h_seconds_bucket{le=\"+Inf\"} 120\n",
      "h_seconds");
  absl::StatusOr<ScrapedHistogram> delta = after.Since(before);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_THAT(delta->counts, ElementsAre(10, 10, 20));
  // Backwards: the process restarted in between.
  EXPECT_EQ(before.Since(after).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
