#include "tests/integration/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace baton {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ProgramRun RunToEnd(const std::string& binary,
                    const std::vector<std::string>& args,
                    absl::Duration timeout) {
  char path[] = "/tmp/baton-run-to-end.XXXXXX";
  close(mkstemp(path));
  ChildProcess process;
  ChildProcess::Options options;
  options.argv = {binary};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.stderr_path = path;
  EXPECT_TRUE(process.Start(options).ok());
  ProgramRun run;
  run.exit = process.Wait(timeout);
  run.out = process.stdout_text();
  run.err = ReadFile(path);
  unlink(path);
  return run;
}

namespace {

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

// Reads stdout lines until one starts with `prefix` (its remainder goes to
// `rest`, the bytes after that line to `leftover`), or fails at `deadline` or
// when the pipe closes (the process died).
absl::Status ReadReadyLine(int fd, absl::string_view prefix,
                           const std::string& name, absl::Time deadline,
                           std::string* rest, std::string* leftover) {
  std::string buffer;
  for (;;) {
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (absl::StartsWith(line, prefix)) {
        *rest = line.substr(prefix.size());
        *leftover = buffer;
        return absl::OkStatus();
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, " printed no \"", prefix, "\" line in time"));
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
          name, " closed its stdout before printing \"", prefix,
          "\" (it exited; see its stderr); it printed: \"", buffer, "\""));
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

ChildProcess::~ChildProcess() {
  if (running()) Kill();
}

absl::Status ChildProcess::Start(const Options& options) {
  if (running()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " is already running"));
  }
  name_ = options.argv.empty() ? "child" : options.argv[0];
  if (const size_t slash = name_.rfind('/'); slash != std::string::npos) {
    name_ = name_.substr(slash + 1);
  }
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls are allowed.
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
  env_strings.insert(env_strings.end(), options.env.begin(), options.env.end());
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  // Where the copy of the child's stderr goes.
  int sink_fd = STDERR_FILENO;
  if (!options.stderr_path.empty()) {
    sink_fd = open(options.stderr_path.c_str(),
                   O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (sink_fd < 0) {
      return absl::InternalError(
          absl::StrCat("open ", options.stderr_path, ": ", strerror(errno)));
    }
  }
  const auto close_sink = [sink_fd] {
    if (sink_fd != STDERR_FILENO) close(sink_fd);
  };
  int out[2];
  int err[2];
  // Carries errno from a failed execve; closed by a successful one.
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
    // The child must not outlive a test that crashed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    // The test process may block signals in its threads; the child sets up
    // its own.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
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
  ready_line_.clear();
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
        absl::StrCat("cannot execute ", options.argv[0], ": ",
                     strerror(exec_errno), "; build its target"));
  }

  std::string leftover;
  if (!options.ready_prefix.empty()) {
    const absl::Status status =
        ReadReadyLine(out[0], options.ready_prefix, name_,
                      absl::Now() + options.timeout, &ready_line_, &leftover);
    if (!status.ok()) {
      close(out[0]);
      const ProcessExit exit = Kill();
      return absl::Status(status.code(),
                          absl::StrCat(status.message(), " (", name_, " ",
                                       exit.ToString(), ")"));
    }
  }
  // The rest of stdout is kept for stdout_text().
  {
    std::lock_guard<std::mutex> lock(stdout_mu_);
    stdout_text_ = leftover;
  }
  stdout_reader_ = std::thread([this, fd = out[0]] {
    char chunk[4096];
    for (;;) {
      const ssize_t r = read(fd, chunk, sizeof(chunk));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      std::lock_guard<std::mutex> lock(stdout_mu_);
      stdout_text_.append(chunk, static_cast<size_t>(r));
    }
    close(fd);
  });
  return absl::OkStatus();
}

std::string ChildProcess::stdout_text() const {
  std::lock_guard<std::mutex> lock(stdout_mu_);
  return stdout_text_;
}

ProcessExit ChildProcess::Terminate(absl::Duration timeout) {
  return SignalAndWait(SIGTERM, timeout);
}

ProcessExit ChildProcess::Kill() {
  return SignalAndWait(SIGKILL, absl::Seconds(10));
}

ProcessExit ChildProcess::Wait(absl::Duration timeout) {
  return SignalAndWait(0, timeout);
}

ProcessExit ChildProcess::SignalAndWait(int signal, absl::Duration timeout) {
  if (!running()) return ProcessExit{};
  const absl::Time start = absl::Now();
  if (signal != 0) kill(pid_, signal);
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
  if (stdout_reader_.joinable()) stdout_reader_.join();
  exit.sanitizer_reports = sanitizer_reports_;
  if (sanitizer_reports_ > 0) {
    ADD_FAILURE() << name_ << " (pid " << pid_ << ") printed "
                  << sanitizer_reports_
                  << " sanitizer report(s) on its stderr; the first: "
                  << first_sanitizer_report_;
  }
  pid_ = -1;
  return exit;
}

}  // namespace baton
