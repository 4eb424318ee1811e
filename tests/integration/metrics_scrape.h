#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics_scrape.h"

namespace baton {

// Helpers for tests of the /metrics endpoints, beside common/metrics_scrape.h
// (HttpGet, SampleValue, ParseHistogram).

// The samples of `expected` (series as for SampleValue -> value) that `text`
// lacks or has with another value, one line each ("SERIES: want 2, got 3",
// "SERIES: want 2, absent"); empty when every one matches.
std::string SampleMismatches(
    const std::string& text,
    const std::vector<std::pair<std::string, double>>& expected);

// Runs `promtool check metrics` on `text`. NOT_FOUND when promtool is not
// installed; INVALID_ARGUMENT with promtool's output when it finds problems.
absl::Status CheckWithPromtool(const std::string& text);

}  // namespace baton
