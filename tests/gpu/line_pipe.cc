#include "tests/gpu/line_pipe.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace baton::agent {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

bool WriteLine(int fd, absl::string_view line) {
  const std::string text =
      absl::StrCat(absl::StrReplaceAll(line, {{"\n", " "}, {"\r", " "}}), "\n");
  absl::string_view left = text;
  while (!left.empty()) {
    const ssize_t written = ::write(fd, left.data(), left.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    left.remove_prefix(static_cast<size_t>(written));
  }
  return true;
}

absl::StatusOr<std::string> ReadLine(int fd, std::string& buffered,
                                     milliseconds timeout) {
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  for (;;) {
    const size_t end = buffered.find('\n');
    if (end != std::string::npos) {
      std::string line = buffered.substr(0, end);
      buffered.erase(0, end + 1);
      return line;
    }
    int wait_ms = -1;
    if (timeout.count() >= 0) {
      const auto left = std::chrono::duration_cast<milliseconds>(
          deadline - SteadyClock::now());
      if (left.count() <= 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("no answer within ", timeout.count(), " ms"));
      }
      wait_ms = static_cast<int>(left.count()) + 1;
    }
    pollfd ready = {fd, POLLIN, 0};
    const int polled = ::poll(&ready, 1, wait_ms);
    if (polled < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (polled <= 0) continue;
    char chunk[4096];
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
    }
    if (got == 0) return absl::OutOfRangeError("end of stream");
    buffered.append(chunk, static_cast<size_t>(got));
  }
}

}  // namespace baton::agent
