#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace baton {

// The whole file at `path` ("" when it cannot be read): a child's stderr
// file, a log.
std::string ReadFile(const std::string& path);

// How a child process ended.
struct ProcessExit {
  // True when it exited (exit_code is valid), false when a signal killed it.
  bool exited = false;
  int exit_code = -1;
  int signal = 0;
  // From the signal that asked it to stop (or the start of the wait) to its
  // end.
  absl::Duration elapsed;
  // True when it did not end in time and was killed with SIGKILL.
  bool timed_out = false;
  // Sanitizer reports it printed on its stderr (the test has failed).
  int sanitizer_reports = 0;

  bool ok() const { return exited && exit_code == 0 && sanitizer_reports == 0; }
  // For test messages: "exit 0 after 1.2s", "killed by signal 9 after 3s".
  std::string ToString() const;
};

// A real process (a baton binary or a test trainer) for integration tests.
// Its stderr goes to the test's stderr, or to a file, copied there by a
// thread that also looks for sanitizer reports (ThreadSanitizer,
// AddressSanitizer, LeakSanitizer, UBSan): when the process ends with any,
// the current test fails. Its stdout is kept (stdout_text()). The child is
// killed when the test process dies.
//
// Not thread-safe: use from one thread.
class ChildProcess {
 public:
  struct Options {
    // argv[0] is the binary's path.
    std::vector<std::string> argv;
    // Added to the test's environment ("NAME=value").
    std::vector<std::string> env;
    // When set, Start waits up to `timeout` for a stdout line starting with
    // it; ready_line() is the rest of that line.
    std::string ready_prefix;
    absl::Duration timeout = absl::Seconds(10);
    // Where stderr goes (appended); empty: the test's stderr.
    std::string stderr_path;
  };

  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Kills the process if it is still running.
  ~ChildProcess();

  absl::Status Start(const Options& options);

  // SIGTERM, then waits up to `timeout` (SIGKILL after it, timed_out set).
  ProcessExit Terminate(absl::Duration timeout = absl::Seconds(10));
  // SIGKILL (a crash), and reaps the process.
  ProcessExit Kill();
  // Waits up to `timeout` for the process to end by itself (SIGKILL after
  // it, timed_out set).
  ProcessExit Wait(absl::Duration timeout);

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& ready_line() const { return ready_line_; }
  // Everything printed on stdout after the ready line so far; complete once
  // the process was reaped. Thread-safe.
  std::string stdout_text() const;

 private:
  // signal 0: only wait.
  ProcessExit SignalAndWait(int signal, absl::Duration timeout);

  std::string name_;
  pid_t pid_ = -1;
  std::string ready_line_;

  // Copy the running process's stderr and stdout; joined when the process
  // is reaped. Written by those threads; read after joining them.
  std::thread stderr_copier_;
  std::thread stdout_reader_;
  int sanitizer_reports_ = 0;
  std::string first_sanitizer_report_;
  mutable std::mutex stdout_mu_;
  std::string stdout_text_;  // guarded by stdout_mu_
};

// A program run to its end: how it ended, its stdout and its stderr.
struct ProgramRun {
  ProcessExit exit;
  std::string out;
  std::string err;
};

// Runs `binary` with `args` to its end (killed after `timeout`).
ProgramRun RunToEnd(const std::string& binary,
                    const std::vector<std::string>& args,
                    absl::Duration timeout = absl::Seconds(30));

}  // namespace baton
