#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton {

// Helpers for tests of the /metrics endpoints.

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
