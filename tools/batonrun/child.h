#pragma once

// A process batonrun started (the embedded coordinator, an agent, a
// trainer), and how batonrun starts, waits for and stops one. Every child
// gets PR_SET_PDEATHSIG (SIGKILL): none outlives batonrun, even when
// batonrun itself is killed. Children are reaped by pid, by their owner;
// nothing here reaps a child it was not given.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace baton::batonrun {

struct Child {
  std::string name;  // "rank 3", "agent n1", "coordinator"
  pid_t pid = -1;
  int stdout_fd = -1;  // read end, when captured
  bool done = false;   // reaped
  int status = 0;      // waitpid's status, once done
};

// Starts argv with extra environment: `env` entries ("NAME=value")
// replace inherited variables of the same name, and a bare "NAME" removes
// an inherited one. stdout goes to a pipe (its read end in
// child.stdout_fd) when `capture`; stderr to `stderr_path` (appended) when
// set, else into the stdout pipe when `merge_stderr`, else inherited.
// False (errno set) when the pipe or the fork failed; a command that
// cannot be executed exits 127 after saying so on its stderr.
bool Spawn(Child& child, const std::vector<std::string>& argv,
           const std::vector<std::string>& env, bool capture, bool merge_stderr,
           const std::string& stderr_path);

// Reads `fd` until a line starts with `prefix`; returns the rest of it, or
// "" when the pipe closed, `timeout` passed or `interrupted` (asked every
// 100 ms when given) returned true.
std::string ReadReadyLine(int fd, const std::string& prefix,
                          std::chrono::milliseconds timeout,
                          const std::function<bool()>& interrupted = nullptr);

// Stops the given children that are not done: SIGTERM, then SIGKILL to
// those still running after `grace`; returns once every one is reaped
// (marked done, with its status).
void Stop(const std::vector<Child*>& children, std::chrono::milliseconds grace);

// How a process ended, from waitpid's status: "exited with code 3", "was
// killed by signal 9 (Killed)".
std::string Describe(int status);

// Whether waitpid's status is anything but exit code 0.
bool Failed(int status);

}  // namespace baton::batonrun
