#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::agent {

// The rendezvous key-value store data planes bootstrap through (gloo's
// addresses, NCCL's unique id). Production: the coordinator's
// RendezvousStore service, scoped to one (job, generation). Tests: an
// in-memory map.
//
// Thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Sets key to value (overwrites).
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;

  // The values of `keys`, in order, waiting up to `timeout` for missing ones.
  // DEADLINE_EXCEEDED names the keys still missing; ABORTED when the scope
  // (generation) ended while waiting.
  virtual absl::StatusOr<std::vector<std::string>> Get(
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout) = 0;
};

}  // namespace baton::agent
