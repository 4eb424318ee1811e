#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "agent/trainer_admission.h"

namespace baton::agent {

// The unix socket trainers connect to. gRPC's own unix listener leaves the
// socket's mode to the umask and never shows who connected, so the agent
// listens itself and hands each admitted connection to its gRPC server.
//
// The socket is created 0600 (0660 and owned by the trainer group when
// there is one) before it listens, so no other user can connect in
// between. The thread `baton-accept` accepts, reads each peer's credentials
// (SO_PEERCRED) and hands the connections TrainerAdmission admits to
// `admit`; it closes the others and logs one line per refused pid.
//
// Start and Stop are called from one thread; refused() from any.
class TrainerListener {
 public:
  // Takes ownership of an admitted connection's fd (non-blocking,
  // close-on-exec). Runs on `baton-accept`.
  using AdmitFn = std::function<void(int fd)>;

  // Creates the socket at `path`, replacing a file left there (a stale
  // socket of a killed agent), and starts accepting. UNAVAILABLE naming the
  // path and what to do when it cannot be created or listened on;
  // FAILED_PRECONDITION when it cannot be given to the trainer group.
  static absl::StatusOr<std::unique_ptr<TrainerListener>> Start(
      std::string path, TrainerAdmission admission, AdmitFn admit);

  TrainerListener(const TrainerListener&) = delete;
  TrainerListener& operator=(const TrainerListener&) = delete;
  ~TrainerListener();

  // Stops accepting, joins the thread, closes the socket and removes its
  // file. Connections already admitted stay with the server. Idempotent.
  void Stop();

  const std::string& path() const { return path_; }
  // Connections refused so far (each one's log line is written first).
  int64_t refused() const { return refused_.load(std::memory_order_acquire); }

 private:
  TrainerListener(std::string path, TrainerAdmission admission, AdmitFn admit,
                  int listen_fd, int stop_fd);

  void AcceptLoop();
  // Admits or refuses one accepted connection.
  void Screen(int fd);

  // Constant after construction.
  const std::string path_;
  const TrainerAdmission admission_;
  const AdmitFn admit_;
  const int listen_fd_;
  // An eventfd: written by Stop, polled next to the socket.
  const int stop_fd_;

  std::atomic<int64_t> refused_{0};
  // Pids refused and logged already; touched only by `baton-accept`.
  absl::flat_hash_set<pid_t> logged_pids_;
  std::thread thread_;
  bool stopped_ = false;  // Start/Stop's thread only
};

}  // namespace baton::agent
