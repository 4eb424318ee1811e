#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tests/integration/child_process.h"

namespace baton {

// A real baton-coordinator process (build/bin/baton-coordinator) for
// integration tests, listening on 127.0.0.1. Its stderr goes to the test's
// stderr, or to a file given with set_stderr_path, copied there by a thread
// that also looks for sanitizer reports (ThreadSanitizer, AddressSanitizer,
// LeakSanitizer, UBSan): when the process ends with any, the current test
// fails. The child is killed when the test process dies.
//
// Not thread-safe: use from the test's thread.
class CoordinatorProcess {
 public:
  CoordinatorProcess() = default;
  CoordinatorProcess(const CoordinatorProcess&) = delete;
  CoordinatorProcess& operator=(const CoordinatorProcess&) = delete;

  // Starts the coordinator with `flags` (each "--name=value") on `port` (0:
  // a free one; a previous port() to restart in place) and waits up to
  // `timeout` for its "listening on" line.
  absl::Status Start(const std::vector<std::string>& flags = {}, int port = 0,
                     absl::Duration timeout = absl::Seconds(10));

  // Where the coordinator's stderr goes from the next Start on (appended);
  // empty: the test's stderr.
  void set_stderr_path(std::string path) { stderr_path_ = std::move(path); }

  // SIGTERM, then waits up to `timeout` (SIGKILL after it, timed_out set).
  ProcessExit Terminate(absl::Duration timeout = absl::Seconds(10));
  // SIGKILL (a crash), and reaps the process.
  ProcessExit Kill();

  bool running() const { return process_.running(); }
  pid_t pid() const { return process_.pid(); }
  // Everything printed on stdout after the "listening on" line so far
  // (ChildProcess::stdout_text).
  std::string stdout_text() const { return process_.stdout_text(); }
  // "127.0.0.1:PORT" as printed by the coordinator; valid after Start.
  const std::string& address() const { return address_; }
  int port() const { return port_; }

  // The coordinator binary this harness starts.
  static std::string BinaryPath();

 private:
  ChildProcess process_;
  std::string address_;
  int port_ = 0;
  std::string stderr_path_;
};

}  // namespace baton
