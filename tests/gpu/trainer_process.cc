#include "tests/gpu/trainer_process.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/transport/nccl/gpu_api.h"
#include "common/status_macros.h"
#include "tests/gpu/line_pipe.h"

extern char** environ;

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// main's argv[0] (SetTrainerProgram).
std::string* g_program = nullptr;

// How to start this binary again the way this process was started: the
// executable to exec and the argv up to and including the program. Run
// through the dynamic loader ("ld-linux-x86-64.so.2 --library-path DIR
// PROGRAM ..."), /proc/self/exe is the loader and the command line before
// the program is the loader's.
struct SelfCommand {
  std::string executable;
  std::vector<std::string> argv;
};

absl::StatusOr<SelfCommand> FindSelfCommand() {
  if (g_program == nullptr) {
    return absl::FailedPreconditionError(
        "SetTrainerProgram was not called: cannot start trainers");
  }
  char executable[PATH_MAX];
  const ssize_t length =
      ::readlink("/proc/self/exe", executable, sizeof executable - 1);
  if (length < 0) {
    return absl::InternalError(
        absl::StrCat("readlink /proc/self/exe: ", std::strerror(errno)));
  }
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
  std::vector<std::string> args = absl::StrSplit(cmdline, '\0');
  if (!args.empty() && args.back().empty()) args.pop_back();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != *g_program) continue;
    args.resize(i + 1);
    return SelfCommand{std::string(executable, static_cast<size_t>(length)),
                       std::move(args)};
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot start trainers: argv[0] \"", *g_program,
      "\" is not in /proc/self/cmdline (\"", absl::StrJoin(args, " "), "\")"));
}

// A pipe whose ends are close-on-exec and numbered 10 or more, so that
// posix_spawn's dup2 onto 3 and 4 never meets one of them.
absl::Status MakePipe(int ends[2]) {
  int low[2];
  if (::pipe2(low, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  for (int i = 0; i < 2; ++i) {
    ends[i] = ::fcntl(low[i], F_DUPFD_CLOEXEC, 10);
    ::close(low[i]);
  }
  if (ends[0] < 0 || ends[1] < 0) {
    if (ends[0] >= 0) ::close(ends[0]);
    if (ends[1] >= 0) ::close(ends[1]);
    return absl::InternalError(
        absl::StrCat("fcntl(F_DUPFD_CLOEXEC): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool IsHex(absl::string_view text) {
  for (char c : text) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

void SetTrainerProgram(const char* argv0) {
  delete g_program;
  g_program = new std::string(argv0);
}

absl::StatusOr<std::unique_ptr<TrainerProcess>> TrainerProcess::Start(
    const std::vector<int64_t>& elements) {
  BATON_ASSIGN_OR_RETURN(SelfCommand self, FindSelfCommand());
  self.argv.push_back(absl::StrCat(kTrainerFlag, absl::StrJoin(elements, ",")));
  std::vector<char*> argv;
  for (std::string& arg : self.argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int commands[2];
  int replies[2];
  BATON_RETURN_IF_ERROR(MakePipe(commands));
  if (absl::Status status = MakePipe(replies); !status.ok()) {
    ::close(commands[0]);
    ::close(commands[1]);
    return status;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, commands[0], kTrainerCommandFd);
  posix_spawn_file_actions_adddup2(&actions, replies[1], kTrainerReplyFd);
  // Nothing else of this process (gloo's sockets, CUDA's and NCCL's files).
  posix_spawn_file_actions_addclosefrom_np(&actions, kTrainerReplyFd + 1);
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, self.executable.c_str(), &actions,
                                  nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(commands[0]);
  ::close(replies[1]);
  if (error != 0) {
    ::close(commands[1]);
    ::close(replies[0]);
    return absl::InternalError(absl::StrCat(
        "cannot start a trainer: posix_spawn ", self.executable, " (",
        absl::StrJoin(self.argv, " "), "): ", std::strerror(error)));
  }
  return std::unique_ptr<TrainerProcess>(
      new TrainerProcess(pid, commands[1], replies[0], elements));
}

TrainerProcess::TrainerProcess(pid_t pid, int commands, int replies,
                               std::vector<int64_t> elements)
    : pid_(pid),
      commands_(commands),
      replies_(replies),
      elements_(std::move(elements)),
      offsets_(TensorOffsets(elements_)) {}

TrainerProcess::~TrainerProcess() {
  // Without commands the trainer frees its memory and exits.
  if (commands_ >= 0) ::close(commands_);
  if (!Reap(milliseconds(10000))) {
    std::fprintf(stderr, "%s did not exit; killing it\n", Describe().c_str());
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &wait_status_, 0);
  }
  ::close(replies_);
}

absl::Status TrainerProcess::AwaitReady(milliseconds timeout) {
  BATON_ASSIGN_OR_RETURN(const std::string line, ReadReply(timeout));
  const std::pair<std::string, std::string> head =
      absl::StrSplit(line, absl::MaxSplits(' ', 1));
  if (head.first == "unsupported") {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(), " cannot share CUDA memory: ", head.second));
  }
  if (head.first == "error") {
    return absl::UnavailableError(
        absl::StrCat(Describe(), " failed to start: ", head.second));
  }
  const std::vector<std::string> words = absl::StrSplit(line, ' ');
  const size_t hex_size = 2 * gpu::kCudaIpcHandleBytes;
  if (words.size() != 4 || words[0] != "ready" || words[1].size() != hex_size ||
      words[2].size() != hex_size || !IsHex(words[1]) || !IsHex(words[2])) {
    return absl::InternalError(
        absl::StrCat(Describe(), " said \"", line,
                     "\", expected \"ready <memory handle> <event handle> "
                     "<PCI bus id>\" with 128 hex digits per handle"));
  }
  memory_handle_ = absl::HexStringToBytes(words[1]);
  event_handle_ = absl::HexStringToBytes(words[2]);
  pci_bus_id_ = words[3];
  return absl::OkStatus();
}

DeviceBufferSpec TrainerProcess::Spec(int tensor) const {
  DeviceBufferSpec spec;
  spec.pci_bus_id = pci_bus_id_;
  spec.memory_handle = memory_handle_;
  spec.offset = offsets_[tensor];
  spec.bytes = elements_[tensor] * static_cast<int64_t>(sizeof(float));
  spec.event_handle = event_handle_;
  return spec;
}

absl::Status TrainerProcess::Write(int tensor, int64_t multiplier,
                                   milliseconds timeout) {
  return Command(absl::StrCat("write ", tensor, " ", multiplier), timeout);
}

absl::Status TrainerProcess::Check(int tensor, int64_t multiplier,
                                   milliseconds timeout) {
  return Command(absl::StrCat("check ", tensor, " ", multiplier), timeout);
}

absl::Status TrainerProcess::Quit(milliseconds timeout) {
  const absl::Status quit = Command("quit", timeout);
  ::close(commands_);
  commands_ = -1;
  if (!Reap(timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        Describe(), " did not exit within ", timeout.count(), " ms of quit"));
  }
  if (!quit.ok()) return quit;
  if (!WIFEXITED(wait_status_) || WEXITSTATUS(wait_status_) != 0) {
    return absl::UnavailableError(
        absl::StrCat(Describe(), " after freeing its memory"));
  }
  return absl::OkStatus();
}

absl::Status TrainerProcess::Command(const std::string& command,
                                     milliseconds timeout) {
  if (commands_ < 0 || !WriteLine(commands_, command)) {
    const std::string why =
        commands_ < 0 ? "it was told to quit" : std::strerror(errno);
    Reap(milliseconds(1000));
    return absl::UnavailableError(absl::StrCat(
        "cannot send \"", command, "\" to ", Describe(), ": ", why));
  }
  BATON_ASSIGN_OR_RETURN(const std::string line, ReadReply(timeout));
  if (line == "ok") return absl::OkStatus();
  if (absl::StartsWith(line, "error ")) {
    return absl::UnavailableError(
        absl::StrCat(Describe(), " on \"", command,
                     "\": ", absl::StripPrefix(line, "error ")));
  }
  return absl::InternalError(absl::StrCat(Describe(), " answered \"", line,
                                          "\" to \"", command, "\""));
}

absl::StatusOr<std::string> TrainerProcess::ReadReply(milliseconds timeout) {
  absl::StatusOr<std::string> line = ReadLine(replies_, buffered_, timeout);
  if (line.ok()) return line;
  if (absl::IsOutOfRange(line.status())) {
    Reap(milliseconds(2000));
    return absl::UnavailableError(
        absl::StrCat(Describe(), " closed its reply pipe without answering"));
  }
  return absl::Status(line.status().code(),
                      absl::StrCat(Describe(), ": ", line.status().message()));
}

bool TrainerProcess::Reap(milliseconds timeout) {
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  while (!reaped_) {
    const pid_t waited = ::waitpid(pid_, &wait_status_, WNOHANG);
    if (waited == pid_) {
      reaped_ = true;
    } else if (waited < 0 && errno != EINTR) {
      // Not our child any more (reaped elsewhere): nothing to wait for.
      reaped_ = true;
      wait_status_ = -1;
    } else if (SteadyClock::now() >= deadline) {
      return false;
    } else {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  return true;
}

std::string TrainerProcess::Describe() {
  std::string description = absl::StrCat("trainer (pid ", pid_, ")");
  if (!reaped_) return description;
  if (wait_status_ == -1) {
    absl::StrAppend(&description, ", which is gone");
  } else if (WIFEXITED(wait_status_)) {
    absl::StrAppend(&description, ", which exited with ",
                    WEXITSTATUS(wait_status_));
  } else if (WIFSIGNALED(wait_status_)) {
    absl::StrAppend(&description, ", which was killed by signal ",
                    WTERMSIG(wait_status_), " (",
                    ::strsignal(WTERMSIG(wait_status_)), ")");
  }
  return description;
}

}  // namespace baton::agent
