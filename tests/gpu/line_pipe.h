#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// One text line per message over a pipe, between a GPU test and the
// trainer processes it starts (trainer_process.h, ipc_trainer.h).

namespace baton::agent {

// Writes `line` (newlines in it become spaces) and a '\n'; false with errno
// set on failure.
bool WriteLine(int fd, absl::string_view line);

// The next line from `fd` without its '\n', reading through `buffered`
// (which keeps what was read past it). DEADLINE_EXCEEDED after `timeout`
// (negative: wait as long as it takes); OUT_OF_RANGE at the end of the
// stream (the writer closed its end, or exited).
absl::StatusOr<std::string> ReadLine(int fd, std::string& buffered,
                                     std::chrono::milliseconds timeout);

}  // namespace baton::agent
