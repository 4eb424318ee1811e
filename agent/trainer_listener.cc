#include "agent/trainer_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/thread_name.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

// Refused pids remembered for logging once each; past this many the memory
// starts over (a pid is logged again at worst).
constexpr size_t kLoggedPidsLimit = 1024;
// How long the accept loop rests when the process is out of descriptors or
// memory, before it tries again (Stop ends the rest at once).
constexpr int kOutOfResourcesRestMs = 100;

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerListener>> TrainerListener::Start(
    std::string path, TrainerAdmission admission, AdmitFn admit) {
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket path \"", path, "\" must be 1..",
                     sizeof(address.sun_path) - 1, " characters (--socket)"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const auto cannot_serve = [&path](const std::string& why) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve trainers on unix socket ", path, " (", why,
        "): check that its directory exists and is writable (--socket)"));
  };
  // A stale socket file from a killed agent would make the bind fail.
  unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return cannot_serve(absl::StrCat("socket: ", ErrnoText()));
  const auto fail = [fd, &path](absl::Status status) {
    close(fd);
    unlink(path.c_str());
    return status;
  };
  const mode_t mode = admission.group.has_value() ? 0660 : 0600;
  // On the socket before bind(): the file is created with at most these
  // bits, so it is never open to others, whatever the umask.
  if (fchmod(fd, mode) != 0) {
    const std::string why = absl::StrCat("fchmod: ", ErrnoText());
    close(fd);
    return cannot_serve(why);
  }
  if (bind(fd, reinterpret_cast<const struct sockaddr*>(&address),
           sizeof(address)) != 0) {
    const std::string why = absl::StrCat("bind: ", ErrnoText());
    close(fd);
    return cannot_serve(why);
  }
  // All before listen(): until then a connect is refused.
  if (admission.group.has_value() &&
      lchown(path.c_str(), static_cast<uid_t>(-1), *admission.group) != 0) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "cannot give the trainer socket ", path, " to group ",
        GroupText(*admission.group), " (--trainer_group): ", ErrnoText(),
        ": run the agent as root or as a member of that group")));
  }
  // The umask may have taken the group's bits away.
  if (chmod(path.c_str(), mode) != 0) {
    return fail(cannot_serve(absl::StrCat("chmod: ", ErrnoText())));
  }
  // What was set must be this socket's file, not one that replaced it (in
  // a directory others can write to), nor one on a file system that
  // ignores modes.
  struct stat st = {};
  if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) ||
      st.st_uid != geteuid() || (st.st_mode & 07777) != mode ||
      (admission.group.has_value() && st.st_gid != *admission.group)) {
    close(fd);
    return absl::UnavailableError(absl::StrFormat(
        "the trainer socket %s is not the socket the agent just created "
        "with mode %04o (found mode %06o, uid %d, gid %d): give it a "
        "directory that only the agent can write to, on a file system that "
        "keeps modes (--socket)",
        path, mode, st.st_mode, st.st_uid, st.st_gid));
  }
  if (listen(fd, SOMAXCONN) != 0) {
    return fail(cannot_serve(absl::StrCat("listen: ", ErrnoText())));
  }
  const int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    return fail(cannot_serve(absl::StrCat("eventfd: ", ErrnoText())));
  }
  return std::unique_ptr<TrainerListener>(new TrainerListener(
      std::move(path), std::move(admission), std::move(admit), fd, stop_fd));
}

TrainerListener::TrainerListener(std::string path, TrainerAdmission admission,
                                 AdmitFn admit, int listen_fd, int stop_fd)
    : path_(std::move(path)),
      admission_(std::move(admission)),
      admit_(std::move(admit)),
      listen_fd_(listen_fd),
      stop_fd_(stop_fd) {
  thread_ = std::thread([this] {
    SetThreadName("baton-accept");
    AcceptLoop();
  });
}

TrainerListener::~TrainerListener() { Stop(); }

void TrainerListener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof(one)) != sizeof(one)) {
    // Only a full counter fails, and then the loop sees it readable anyway.
    PLOG(WARNING) << "waking the trainer socket's accept thread";
  }
  thread_.join();
  close(listen_fd_);
  close(stop_fd_);
  unlink(path_.c_str());
}

void TrainerListener::AcceptLoop() {
  struct pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (true) {
    // Unbounded, but cancellable: Stop makes stop_fd_ readable.
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      PLOG(ERROR) << "polling the trainer socket " << path_
                  << " failed; no more trainers can attach";
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & (POLLERR | POLLNVAL)) != 0) {
      LOG(ERROR) << "the trainer socket " << path_
                 << " failed; no more trainers can attach";
      return;
    }
    while (true) {
      const int fd =
          accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        Screen(fd);
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // Out of descriptors or memory: the connection waits in the backlog.
      PLOG(WARNING) << "accepting a trainer on " << path_ << " failed";
      struct pollfd stop = {stop_fd_, POLLIN, 0};
      if (poll(&stop, 1, kOutOfResourcesRestMs) > 0) return;
      break;
    }
  }
}

void TrainerListener::Screen(int fd) {
  const absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);
  if (peer.ok() && Admits(admission_, *peer)) {
    admit_(fd);
    return;
  }
  if (!peer.ok()) {
    LOG(WARNING) << "closed a connection on the trainer socket " << path_
                 << ": " << peer.status().message();
  } else {
    if (logged_pids_.size() >= kLoggedPidsLimit) logged_pids_.clear();
    if (logged_pids_.insert(peer->pid).second) {
      LOG(WARNING) << DescribeRefusal(admission_, *peer, path_);
    }
  }
  // Counted after the log line and before the close: whoever sees the
  // connection closed sees the count, and whoever sees the count the line.
  refused_.fetch_add(1, std::memory_order_release);
  close(fd);
}

}  // namespace baton::agent
