// Reading a Prometheus /metrics endpoint: an HTTP GET of its text, the value
// of one series, and a histogram's buckets. For tests and benchmarks that
// look at a running coordinator or agent from outside.

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton {

// A blocking HTTP GET of `url` ("http://HOST:PORT/PATH", HOST an IPv4
// address or a host name): the body of a 200 response. UNAVAILABLE when it
// cannot connect or the exchange exceeds `timeout`; INTERNAL for another
// status (the status line is in the message).
absl::StatusOr<std::string> HttpGet(const std::string& url,
                                    absl::Duration timeout = absl::Seconds(10));

// The value of the sample `series` (the name with its labels exactly as
// exposed, `name{a="x",b="y"}`) in the text format `text`, or nullopt.
std::optional<double> SampleValue(const std::string& text,
                                  const std::string& series);

// One histogram's cumulative buckets as scraped: counts[i] observations of
// at most bounds[i] (ascending, the last +Inf).
struct ScrapedHistogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;

  // Observations in all (the +Inf bucket).
  uint64_t total() const { return counts.empty() ? 0 : counts.back(); }

  // What was observed between `earlier` (a scrape of the same histogram)
  // and this one. INVALID_ARGUMENT if the buckets differ or a count went
  // down (the process restarted between the scrapes).
  absl::StatusOr<ScrapedHistogram> Since(const ScrapedHistogram& earlier) const;

  // The `q` quantile (0 < q < 1), interpolated linearly inside its bucket
  // as Prometheus' histogram_quantile does: an estimate, exact only at the
  // bounds. The last finite bound if it falls in +Inf; nullopt when empty.
  std::optional<double> Quantile(double q) const;

  // The fraction of observations of at most `bound`, which must be one of
  // the bounds; nullopt when empty or `bound` is not a bound.
  std::optional<double> FractionAtMost(double bound) const;
};

// The `name` histogram's buckets (its `name_bucket{...le="X"}` series, with
// no label but `le`) in the text format `text`. NOT_FOUND when it has none,
// INVALID_ARGUMENT when they are malformed.
absl::StatusOr<ScrapedHistogram> ParseHistogram(const std::string& text,
                                                const std::string& name);

}  // namespace baton
