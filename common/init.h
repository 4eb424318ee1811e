#pragma once

#include <signal.h>

#include "absl/status/status.h"

namespace baton {

// Sets every gflags flag `name` from the environment variable
// `BATON_<NAME>` when that variable exists. Command-line flags parsed
// afterwards win. An invalid value names the variable and the flag.
absl::Status ApplyEnvironmentOverrides();

// Process start for every baton binary: environment overrides, then the
// command line (gflags; `--help` prints every flag with its default), then
// glog to stderr. Exits with code 2 and one line on stderr for a bad flag or
// variable. Ignores SIGPIPE: a peer going away is an error, not a death.
void InitProcess(int* argc, char*** argv, const char* usage);

// Blocks SIGTERM and SIGINT in the calling thread and returns that set. Call
// first in main, before any thread exists: every thread inherits the mask,
// so only the sigwait/sigtimedwait of the main thread receives them.
sigset_t BlockShutdownSignals();

}  // namespace baton
