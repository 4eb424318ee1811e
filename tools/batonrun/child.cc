#include "tools/batonrun/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton::batonrun {

bool Spawn(Child& child, const std::vector<std::string>& argv,
           const std::vector<std::string>& env, bool capture, bool merge_stderr,
           const std::string& stderr_path) {
  std::vector<std::string> args = argv;
  std::vector<char*> c_argv;
  for (auto& a : args) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  // The given variables replace inherited ones of the same name: with a
  // name twice, getenv and Python's os.environ read the first one.
  std::vector<std::string> envs;
  const auto name_of = [](const std::string& entry) {
    return entry.substr(0, entry.find('='));
  };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = name_of(entry);
    const bool replaced = std::any_of(
        env.begin(), env.end(),
        [&](const std::string& given) { return name_of(given) == name; });
    if (!replaced) envs.push_back(entry);
  }
  for (const std::string& given : env) {
    if (given.find('=') != std::string::npos) envs.push_back(given);
  }
  std::vector<char*> c_env;
  for (auto& e : envs) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  int out[2] = {-1, -1};
  if (capture && pipe2(out, O_CLOEXEC) != 0) return false;
  int err_fd = -1;
  if (!stderr_path.empty()) {
    err_fd = open(stderr_path.c_str(),
                  O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (capture) {
      dup2(out[1], STDOUT_FILENO);
      if (merge_stderr) dup2(out[1], STDERR_FILENO);
    }
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    execvpe(c_argv[0], c_argv.data(), c_env.data());
    std::fprintf(stderr, "batonrun: cannot execute %s: %s\n", c_argv[0],
                 std::strerror(errno));
    _exit(127);
  }
  if (capture) close(out[1]);
  if (err_fd >= 0) close(err_fd);
  child.pid = pid;
  child.stdout_fd = capture ? out[0] : -1;
  child.done = false;
  child.status = 0;
  return true;
}

std::string ReadReadyLine(int fd, const std::string& prefix,
                          std::chrono::milliseconds timeout,
                          const std::function<bool()>& interrupted) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string buffer;
  while (std::chrono::steady_clock::now() < deadline) {
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
    }
    if (interrupted && interrupted()) return "";
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char chunk[512];
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) return "";
    buffer.append(chunk, static_cast<size_t>(n));
  }
  return "";
}

void Stop(const std::vector<Child*>& children,
          std::chrono::milliseconds grace) {
  for (Child* c : children) {
    // Never started (Spawn failed): kill(-1, ...) would signal every
    // process of this user.
    if (c->pid <= 0) c->done = true;
    if (!c->done) kill(c->pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    bool left = false;
    for (Child* c : children) {
      if (c->done) continue;
      int status = 0;
      if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
        c->done = true;
        c->status = status;
      } else {
        left = true;
      }
    }
    if (!left) return;
    if (std::chrono::steady_clock::now() > deadline) {
      for (Child* c : children) {
        if (!c->done) kill(c->pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string Describe(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

bool Failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace baton::batonrun
