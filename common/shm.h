#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace baton {

// A POSIX shared-memory object mapped read-write into this process. The
// agent creates one per declared tensor; trainers open it by name. The
// mapping stays valid after the name is removed, until the object is
// destroyed.
//
// Move-only; not thread-safe (the bytes it maps are the caller's business).
class SharedMemory {
 public:
  // Creates `name` ("/baton.<...>", see ValidateShmName) with `bytes` bytes,
  // zero-filled, and maps it. Readable and writable by this user only
  // (0600), or with `group` also by that group's members (0660, owned by
  // it; FAILED_PRECONDITION when this process may not give it to `group`).
  // ALREADY_EXISTS when the name is taken; RESOURCE_EXHAUSTED when /dev/shm
  // cannot hold it (the message says how much was asked and how to grow it).
  static absl::StatusOr<SharedMemory> Create(
      const std::string& name, size_t bytes,
      std::optional<gid_t> group = std::nullopt);
  // Opens and maps an existing object, which must hold at least `bytes`.
  static absl::StatusOr<SharedMemory> Open(const std::string& name,
                                           size_t bytes);
  // Removes a name; NOT_FOUND when it does not exist.
  static absl::Status Unlink(const std::string& name);

  // Removes every "/baton.<pid>.*" object whose creating process (pid) no
  // longer runs, and every one of `own_pid`: what an agent killed with
  // SIGKILL left behind. Call at process start, before this process
  // creates any: an object under its own pid then belongs to a predecessor
  // that had the same pid (a restarted container, where the agent is
  // pid 1). Returns how many it removed.
  static int RemoveOrphans(int own_pid);

  SharedMemory() = default;
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  SharedMemory(std::string name, uint8_t* data, size_t size)
      : name_(std::move(name)), data_(data), size_(size) {}

  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Names are "/" followed by 1..250 characters of [A-Za-z0-9._:-].
absl::Status ValidateShmName(const std::string& name);

}  // namespace baton
