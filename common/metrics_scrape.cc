#include "common/metrics_scrape.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace baton {

absl::StatusOr<std::string> HttpGet(const std::string& url,
                                    absl::Duration timeout) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" is not an http:// URL"));
  }
  const size_t slash = rest.find('/');
  const std::string authority(rest.substr(0, slash));
  const std::string path(slash == absl::string_view::npos ? "/"
                                                          : rest.substr(slash));
  const size_t colon = authority.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" has no port"));
  }
  const std::string host = authority.substr(0, colon);
  const std::string port = authority.substr(colon + 1);

  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* address = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &address) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", authority));
  }
  const int fd = socket(address->ai_family, address->ai_socktype, 0);
  if (fd < 0) {
    freeaddrinfo(address);
    return absl::UnavailableError("cannot create a socket");
  }
  timeval limit{};
  limit.tv_sec = absl::ToInt64Seconds(timeout);
  limit.tv_usec = absl::ToInt64Microseconds(timeout) % 1000000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  const bool connected =
      connect(fd, address->ai_addr, address->ai_addrlen) == 0;
  freeaddrinfo(address);
  if (!connected) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", url));
  }
  // HTTP/1.0 without Accept-Encoding: a plain body, then the server closes.
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", authority, "\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot send to ", url));
  }
  std::string response;
  char buffer[65536];
  ssize_t n = 0;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (n < 0) {
    return absl::UnavailableError(absl::StrCat("no complete response from ",
                                               url, " within ",
                                               absl::FormatDuration(timeout)));
  }
  const size_t body = response.find("\r\n\r\n");
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (body == std::string::npos || !absl::StartsWith(status_line, "HTTP/1.") ||
      !absl::StrContains(status_line, " 200 ")) {
    return absl::InternalError(
        absl::StrCat("GET ", url, " answered \"", status_line, "\""));
  }
  return response.substr(body + 4);
}

std::optional<double> SampleValue(const std::string& text,
                                  const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series) ||
        !absl::ConsumePrefix(&line, " ")) {
      continue;
    }
    // A timestamp may follow the value.
    double value = 0;
    if (absl::SimpleAtod(line.substr(0, line.find(' ')), &value)) return value;
  }
  return std::nullopt;
}

absl::StatusOr<ScrapedHistogram> ParseHistogram(const std::string& text,
                                                const std::string& name) {
  const std::string prefix = absl::StrCat(name, "_bucket{le=\"");
  ScrapedHistogram histogram;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    const size_t end = line.find("\"} ");
    double bound = 0;
    double count = 0;
    const absl::string_view le = line.substr(0, end);
    const bool parsed =
        end != absl::string_view::npos &&
        (le == "+Inf" ? (bound = std::numeric_limits<double>::infinity(), true)
                      : absl::SimpleAtod(le, &bound)) &&
        absl::SimpleAtod(
            line.substr(end + 3, line.find(' ', end + 3) - (end + 3)),
            &count) &&
        count >= 0 && std::isfinite(count);
    if (!parsed ||
        (!histogram.bounds.empty() && (bound <= histogram.bounds.back() ||
                                       count < histogram.counts.back()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed bucket of histogram ", name, ": \"", line,
          "\" (buckets must have ascending bounds and cumulative counts)"));
    }
    histogram.bounds.push_back(bound);
    histogram.counts.push_back(static_cast<uint64_t>(count));
  }
  if (histogram.bounds.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no histogram ", name, " in the scraped text"));
  }
  if (!std::isinf(histogram.bounds.back())) {
    return absl::InvalidArgumentError(
        absl::StrCat("histogram ", name, " has no +Inf bucket"));
  }
  return histogram;
}

absl::StatusOr<ScrapedHistogram> ScrapedHistogram::Since(
    const ScrapedHistogram& earlier) const {
  if (earlier.bounds != bounds) {
    return absl::InvalidArgumentError(
        "the two scrapes have different buckets: not the same histogram");
  }
  ScrapedHistogram delta;
  delta.bounds = bounds;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < earlier.counts[i]) {
      return absl::InvalidArgumentError(
          "a bucket's count went down between the scrapes: the process "
          "restarted in between");
    }
    delta.counts.push_back(counts[i] - earlier.counts[i]);
  }
  return delta;
}

std::optional<double> ScrapedHistogram::Quantile(double q) const {
  if (total() == 0) return std::nullopt;
  const double rank = q * static_cast<double>(total());
  size_t i = 0;
  while (i + 1 < counts.size() && static_cast<double>(counts[i]) < rank) ++i;
  if (std::isinf(bounds[i])) {
    return bounds.size() > 1 ? bounds[bounds.size() - 2] : 0.0;
  }
  const double lower = i == 0 ? 0.0 : bounds[i - 1];
  const double below = i == 0 ? 0.0 : static_cast<double>(counts[i - 1]);
  const double in_bucket = static_cast<double>(counts[i]) - below;
  if (in_bucket <= 0) return bounds[i];
  return lower + (bounds[i] - lower) * (rank - below) / in_bucket;
}

std::optional<double> ScrapedHistogram::FractionAtMost(double bound) const {
  if (total() == 0) return std::nullopt;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] == bound) {
      return static_cast<double>(counts[i]) / static_cast<double>(total());
    }
  }
  return std::nullopt;
}

}  // namespace baton
