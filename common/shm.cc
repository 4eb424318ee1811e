#include "common/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace baton {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Maps fd; closes it either way.
absl::StatusOr<uint8_t*> MapFd(int fd, const std::string& name, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping shared memory ", name, " (", bytes,
                     " bytes) failed: ", ErrnoText(err)));
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

absl::Status ValidateShmName(const std::string& name) {
  if (name.size() < 2 || name.size() > 251 || name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory name \"", name,
                     "\" must be \"/\" followed by 1..250 characters"));
  }
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != ':' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("shared memory name \"", name,
                       "\" has a character outside [A-Za-z0-9._:-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SharedMemory> SharedMemory::Create(const std::string& name,
                                                  size_t bytes,
                                                  std::optional<gid_t> group) {
  BATON_RETURN_IF_ERROR(ValidateShmName(name));
  const size_t mapped = bytes == 0 ? 1 : bytes;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("shared memory ", name, " already exists"));
    }
    return absl::UnavailableError(absl::StrCat("creating shared memory ", name,
                                               " failed: ", ErrnoText(err)));
  }
  // Before anything is written into it; nobody outside the group can open
  // it meanwhile (0600 until then).
  if (group.has_value() && (fchown(fd, static_cast<uid_t>(-1), *group) != 0 ||
                            fchmod(fd, 0660) != 0)) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::FailedPreconditionError(absl::StrCat(
        "giving shared memory ", name, " to group ", *group,
        " failed: ", ErrnoText(err),
        ": the agent must run as root or as a member of --trainer_group"));
  }
  // posix_fallocate reserves the pages now, so a full /dev/shm is an error
  // here rather than a SIGBUS in whoever touches the bytes first.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(mapped));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", mapped, " bytes of shared memory for ", name, ": ",
        ErrnoText(err),
        "; /dev/shm is too small: grow it (docker --shm-size, or a "
        "Kubernetes emptyDir with medium: Memory on /dev/shm)"));
  }
  auto data = MapFd(fd, name, mapped);
  if (!data.ok()) {
    shm_unlink(name.c_str());
    return data.status();
  }
  return SharedMemory(name, *data, mapped);
}

absl::StatusOr<SharedMemory> SharedMemory::Open(const std::string& name,
                                                size_t bytes) {
  BATON_RETURN_IF_ERROR(ValidateShmName(name));
  const size_t mapped = bytes == 0 ? 1 : bytes;
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    return absl::NotFoundError(absl::StrCat(
        "opening shared memory ", name, " failed: ", ErrnoText(err),
        err == ENOENT ? " (the agent removed it or restarted)" : ""));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < mapped) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", name, " holds ", st.st_size,
                     " bytes, not the ", mapped, " announced"));
  }
  BATON_ASSIGN_OR_RETURN(uint8_t * data, MapFd(fd, name, mapped));
  return SharedMemory(name, data, mapped);
}

absl::Status SharedMemory::Unlink(const std::string& name) {
  if (shm_unlink(name.c_str()) != 0) {
    const int err = errno;
    return absl::NotFoundError(absl::StrCat("removing shared memory ", name,
                                            " failed: ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

int SharedMemory::RemoveOrphans(int own_pid) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (struct dirent* entry = readdir(dir)) {
    const std::string file = entry->d_name;
    if (file.rfind("baton.", 0) != 0) continue;
    const std::vector<std::string> parts = absl::StrSplit(file, '.');
    int pid = 0;
    if (parts.size() < 3 || !absl::SimpleAtoi(parts[1], &pid) || pid <= 0) {
      continue;
    }
    if (pid != own_pid && (kill(pid, 0) == 0 || errno == EPERM)) continue;
    if (shm_unlink(("/" + file).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SharedMemory::~SharedMemory() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace baton
