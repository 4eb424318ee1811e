#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/device_memory.h"
#include "tests/gpu/ipc_trainer.h"

// The test's side of a trainer in another process (ipc_trainer.h says what
// a trainer does and how the two talk).
//
// The trainer is this test binary started again (posix_spawn, exec'd
// fresh: CUDA is not fork-safe) with kTrainerFlag, the same way this
// process was started: through the dynamic loader and its --library-path
// when tools/gpu/check.sh ran it so.

namespace baton::agent {

// Remembers main's argv[0], which TrainerProcess needs to start the
// trainers the way this process was started. Call before the tests run.
void SetTrainerProgram(const char* argv0);

// The test's side of one trainer process. Not thread-safe.
class TrainerProcess {
 public:
  // Starts a trainer holding tensors of `elements` float32 elements. It
  // answers AwaitReady once it has made its CUDA context and allocation.
  static absl::StatusOr<std::unique_ptr<TrainerProcess>> Start(
      const std::vector<int64_t>& elements);
  // Kills a trainer that did not Quit (after giving it 10 s to go on its
  // own: its command pipe is closed).
  ~TrainerProcess();

  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;

  // Waits for the trainer's handles. FAILED_PRECONDITION when this machine
  // cannot share CUDA memory between processes (the trainer said
  // "unsupported": CUDA IPC not supported, or the GPU is in
  // exclusive-process mode); DEADLINE_EXCEEDED when it did not answer in
  // time; UNAVAILABLE with its error otherwise.
  absl::Status AwaitReady(std::chrono::milliseconds timeout);

  // What the agent gets from the trainer's Declare for tensor `tensor`
  // (after AwaitReady).
  DeviceBufferSpec Spec(int tensor) const;

  // `write` and `check` (ipc_trainer.h). Errors: the trainer's, as UNAVAILABLE
  // (a check's names the first wrong element); DEADLINE_EXCEEDED when it
  // does not answer within `timeout`.
  absl::Status Write(int tensor, int64_t multiplier,
                     std::chrono::milliseconds timeout);
  absl::Status Check(int tensor, int64_t multiplier,
                     std::chrono::milliseconds timeout);

  // Asks the trainer to free its memory and exit; OK when it did and exited
  // with 0 within `timeout`.
  absl::Status Quit(std::chrono::milliseconds timeout);

  pid_t pid() const { return pid_; }

 private:
  TrainerProcess(pid_t pid, int commands, int replies,
                 std::vector<int64_t> elements);

  // Sends `command` and waits for its reply.
  absl::Status Command(const std::string& command,
                       std::chrono::milliseconds timeout);
  // The next reply line, or why there is none (naming the trainer, and its
  // exit status when it exited).
  absl::StatusOr<std::string> ReadReply(std::chrono::milliseconds timeout);
  // Reaps the trainer if it exited within `timeout`; true when it did.
  bool Reap(std::chrono::milliseconds timeout);
  // "trainer (pid 1234)", and how it ended when it did.
  std::string Describe();

  const pid_t pid_;
  int commands_;
  const int replies_;
  const std::vector<int64_t> elements_;
  const std::vector<int64_t> offsets_;
  std::string buffered_;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::string memory_handle_;
  std::string event_handle_;
  std::string pci_bus_id_;
};

}  // namespace baton::agent
