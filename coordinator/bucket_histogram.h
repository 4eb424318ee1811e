#pragma once

// Durations counted in fixed buckets: the values of a Prometheus histogram,
// kept without Prometheus (the coordinator core does not link it).

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"

namespace baton::coordinator {

// `kBoundsOf` holds the buckets' upper bounds in seconds, ascending; +Inf
// follows implicitly. Cumulative since it was made. Not thread-safe.
template <const auto& kBoundsOf>
struct BucketHistogram {
  static constexpr const auto& kBounds = kBoundsOf;

  // cumulative[i]: observations of at most kBounds[i] seconds.
  std::array<uint64_t, kBoundsOf.size()> cumulative = {};
  // Every observation, also those above the last bound.
  uint64_t count = 0;
  double sum_seconds = 0;

  void Observe(absl::Duration took) {
    const double seconds = absl::ToDoubleSeconds(took);
    for (size_t i = 0; i < kBounds.size(); ++i) {
      if (seconds <= kBounds[i]) ++cumulative[i];
    }
    ++count;
    sum_seconds += seconds;
  }
};

// Re-forms the coordinator seals at once take 0 s; one that waits for a
// replacement takes up to --reform_timeout_ms (60 s by default).
inline constexpr std::array<double, 12> kReformSecondsBounds = {
    0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
using ReformHistogram = BucketHistogram<kReformSecondsBounds>;

// An agent's message waits for the control loop, then is handled: well
// under a millisecond on an idle coordinator, seconds on a saturated one.
inline constexpr std::array<double, 14> kMessageSecondsBounds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025,  0.05,    0.1,    0.25,  0.5,    1,     5};
using MessageHistogram = BucketHistogram<kMessageSecondsBounds>;

}  // namespace baton::coordinator
