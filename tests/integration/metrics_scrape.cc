#include "tests/integration/metrics_scrape.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

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

std::string SampleMismatches(
    const std::string& text,
    const std::vector<std::pair<std::string, double>>& expected) {
  std::string mismatches;
  for (const auto& [series, want] : expected) {
    const std::optional<double> got = SampleValue(text, series);
    if (got == want) continue;
    absl::StrAppend(&mismatches, series, ": want ", want, ", ",
                    got.has_value() ? absl::StrCat("got ", *got) : "absent",
                    "\n");
  }
  return mismatches;
}

absl::Status CheckWithPromtool(const std::string& text) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    return absl::NotFoundError(
        "promtool is not installed (apt-get install prometheus)");
  }
  char dir_pattern[] = "/tmp/baton-promtool.XXXXXX";
  const std::string dir = mkdtemp(dir_pattern);
  const std::string input = dir + "/metrics.txt";
  const std::string output = dir + "/promtool.out";
  std::ofstream(input) << text;
  const int status = std::system(
      absl::StrCat("promtool check metrics < ", input, " > ", output, " 2>&1")
          .c_str());
  std::stringstream report;
  report << std::ifstream(output).rdbuf();
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  if (status != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("promtool check metrics failed:\n", report.str()));
  }
  return absl::OkStatus();
}

}  // namespace baton
