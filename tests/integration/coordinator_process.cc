#include "tests/integration/coordinator_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

#ifndef BATON_COORDINATOR_BIN
#error "BATON_COORDINATOR_BIN must name the baton-coordinator binary"
#endif

namespace baton {
namespace {

constexpr absl::string_view kListening = "baton-coordinator listening on ";

ProcessExit FromWaitStatus(int status, absl::Duration elapsed) {
  ProcessExit exit;
  exit.elapsed = elapsed;
  if (WIFEXITED(status)) {
    exit.exited = true;
    exit.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
  }
  return exit;
}

// Reads stdout lines until the "listening on" line, or fails at `deadline`
// or when the pipe closes (the process died).
absl::Status ReadListeningLine(int fd, absl::Time deadline,
                               std::string* address) {
  std::string buffer;
  for (;;) {
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (absl::string_view(line).substr(0, kListening.size()) == kListening) {
        *address = line.substr(kListening.size());
        return absl::OkStatus();
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "baton-coordinator printed no \"listening on\" line in time");
    }
    pollfd pfd{fd, POLLIN, 0};
    const int ready =
        poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    }
    if (ready <= 0) continue;
    char chunk[512];
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "baton-coordinator closed its stdout before listening (it exited; "
          "see its stderr); it printed: \"",
          buffer, "\""));
    }
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

// The first line of each kind of sanitizer report.
constexpr absl::string_view kSanitizerReportMarkers[] = {
    "WARNING: ThreadSanitizer:",
    "ERROR: AddressSanitizer:",
    "ERROR: LeakSanitizer:",
    ": runtime error: ",
};

bool IsSanitizerReport(absl::string_view line) {
  for (absl::string_view marker : kSanitizerReportMarkers) {
    if (absl::StrContains(line, marker)) return true;
  }
  return false;
}

// Writes all of `data` to `fd`; gives up on an error other than EINTR.
void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Copies `from` to `to` until end of file, counting the sanitizer reports
// that go by. `first_report` gets the first report's SUMMARY line (where the
// sanitizer prints one), or else its first line.
void CopyStderr(int from, int to, int* reports, std::string* first_report) {
  std::string line;
  bool have_summary = false;
  const auto scan = [&] {
    if (IsSanitizerReport(line)) {
      if (++*reports == 1) *first_report = line;
    } else if (*reports > 0 && !have_summary &&
               absl::StartsWith(line, "SUMMARY: ")) {
      have_summary = true;
      *first_report = line;
    }
  };
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(from, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    WriteAll(to, chunk, static_cast<size_t>(n));
    for (const char c : absl::string_view(chunk, static_cast<size_t>(n))) {
      if (c != '\n') {
        line.push_back(c);
        continue;
      }
      scan();
      line.clear();
    }
  }
  scan();
}

}  // namespace

std::string ProcessExit::ToString() const {
  std::string out = exited ? absl::StrCat("exit ", exit_code)
                           : absl::StrCat("killed by signal ", signal);
  absl::StrAppend(&out, " after ", absl::FormatDuration(elapsed));
  if (timed_out) absl::StrAppend(&out, " (did not stop in time)");
  if (sanitizer_reports > 0) {
    absl::StrAppend(&out, "; it printed ", sanitizer_reports,
                    " sanitizer report(s)");
  }
  return out;
}

CoordinatorProcess::~CoordinatorProcess() {
  if (running()) Kill();
}

std::string CoordinatorProcess::BinaryPath() { return BATON_COORDINATOR_BIN; }

absl::Status CoordinatorProcess::Start(const std::vector<std::string>& flags,
                                       int port, absl::Duration timeout) {
  if (running()) {
    return absl::FailedPreconditionError("the coordinator is already running");
  }
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls are allowed.
  const std::string binary = BinaryPath();
  std::vector<std::string> args = {binary, "--listen",
                                   absl::StrCat("127.0.0.1:", port)};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  // Where the copy of the child's stderr goes.
  int sink_fd = STDERR_FILENO;
  if (!stderr_path_.empty()) {
    sink_fd = open(stderr_path_.c_str(),
                   O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (sink_fd < 0) {
      return absl::InternalError(
          absl::StrCat("open ", stderr_path_, ": ", strerror(errno)));
    }
  }
  const auto close_sink = [sink_fd] {
    if (sink_fd != STDERR_FILENO) close(sink_fd);
  };
  int out[2];
  int err[2];
  // Carries errno from a failed execv; closed by a successful one.
  int exec_error[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    close_sink();
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    close_sink();
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(exec_error, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    close_sink();
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    close(exec_error[0]);
    close(exec_error[1]);
    close_sink();
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    // The coordinator must not outlive a test that crashed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    // The test process may block signals in its threads; the coordinator
    // sets up its own.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    const int exec_errno = errno;
    if (write(exec_error[1], &exec_errno, sizeof(exec_errno))) _exit(127);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  close(exec_error[1]);
  pid_ = pid;
  sanitizer_reports_ = 0;
  first_sanitizer_report_.clear();
  // Ends when the child's stderr closes, that is when the child is gone.
  stderr_copier_ = std::thread([this, from = err[0], to = sink_fd] {
    CopyStderr(from, to, &sanitizer_reports_, &first_sanitizer_report_);
    close(from);
    if (to != STDERR_FILENO) close(to);
  });

  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_error[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(exec_error[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    close(out[0]);
    Kill();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute ", binary, ": ", strerror(exec_errno),
                     "; build the baton-coordinator target"));
  }

  std::string address;
  const absl::Status status =
      ReadListeningLine(out[0], absl::Now() + timeout, &address);
  // Nothing else is printed to stdout; a later write fails with EPIPE (the
  // coordinator ignores SIGPIPE).
  close(out[0]);
  if (!status.ok()) {
    const ProcessExit exit = Kill();
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), " (", binary, " ",
                                     exit.ToString(), ")"));
  }
  int bound_port = 0;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(address).substr(colon + 1),
                        &bound_port) ||
      bound_port <= 0) {
    Kill();
    return absl::InternalError(absl::StrCat(
        "cannot parse the coordinator's address \"", address, "\""));
  }
  address_ = address;
  port_ = bound_port;
  return absl::OkStatus();
}

ProcessExit CoordinatorProcess::Terminate(absl::Duration timeout) {
  return SignalAndWait(SIGTERM, timeout);
}

ProcessExit CoordinatorProcess::Kill() {
  return SignalAndWait(SIGKILL, absl::Seconds(10));
}

ProcessExit CoordinatorProcess::SignalAndWait(int signal,
                                              absl::Duration timeout) {
  if (!running()) return ProcessExit{};
  const absl::Time start = absl::Now();
  kill(pid_, signal);
  bool timed_out = false;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (done < 0 && errno != EINTR) break;
    if (!timed_out && absl::Now() - start > timeout) {
      timed_out = true;
      kill(pid_, SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  ProcessExit exit = FromWaitStatus(status, absl::Now() - start);
  exit.timed_out = timed_out;
  if (stderr_copier_.joinable()) stderr_copier_.join();
  exit.sanitizer_reports = sanitizer_reports_;
  if (sanitizer_reports_ > 0) {
    ADD_FAILURE() << "baton-coordinator (pid " << pid_ << ") printed "
                  << sanitizer_reports_
                  << " sanitizer report(s) on its stderr; the first: "
                  << first_sanitizer_report_;
  }
  pid_ = -1;
  return exit;
}

}  // namespace baton
