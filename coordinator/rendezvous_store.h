#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/rendezvous.pb.h"

namespace baton::coordinator {

// The rendezvous key-value store agents bootstrap gloo and NCCL through. Each
// job has at most one open scope: its current sealed generation. Keys of
// older generations are dropped when a newer one opens, so generations never
// see each other's keys.
//
// Errors: a request for an older generation (or one that was aborted) gets
// ABORTED; a job or generation with no open scope FAILED_PRECONDITION; bad
// keys, values or timeouts INVALID_ARGUMENT; a full scope RESOURCE_EXHAUSTED.
//
// Not thread-safe: owned by the coordinator's control loop. Callbacks run on
// the caller's thread, inside the call that resolves them.
class RendezvousStore {
 public:
  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr int kMaxKeysPerGet = 1024;
  static constexpr int64_t kMaxWaitMs = 600000;
  static constexpr size_t kMaxKeysPerScope = 100000;
  static constexpr size_t kMaxBytesPerScope = size_t{64} << 20;

  using GetCallback =
      std::function<void(absl::StatusOr<std::vector<std::string>> values)>;

  // Out of line: Scope is complete only in the .cc.
  RendezvousStore();
  // Answers the Gets still waiting with UNAVAILABLE, so no RPC is left
  // hanging at shutdown.
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // Opens (job, generation), dropping older keys and failing every waiting
  // Get of the job with ABORTED.
  void OpenGeneration(const std::string& job, int64_t generation);

  // Closes the job's open scope: waiting Gets get ABORTED with `why`'s
  // message, later requests for that generation too. Aborting a generation
  // newer than the open one closes both; an older one is ignored.
  void AbortGeneration(const std::string& job, int64_t generation,
                       const absl::Status& why);

  // Forgets the job; waiting Gets get `why`.
  void RemoveJob(const std::string& job, const absl::Status& why);

  absl::Status Set(const v1::StoreSetRequest& request);
  absl::StatusOr<int64_t> Add(const v1::StoreAddRequest& request);

  // Calls `done` exactly once: at once when every key exists (or the request
  // is invalid, or wait_timeout_ms is 0 and some key is missing:
  // DEADLINE_EXCEEDED), otherwise when the last key is set, when the wait
  // expires (checked by Tick; DEADLINE_EXCEEDED naming the missing keys), or
  // when the scope ends (ABORTED).
  void Get(const v1::StoreGetRequest& request, absl::Time now,
           GetCallback done);

  // Expires waits whose deadline is at or before `now`.
  void Tick(absl::Time now);

  // Gets still waiting, over all jobs (for tests and status).
  size_t WaitingGets() const;

 private:
  struct Scope;  // defined in the .cc
  absl::flat_hash_map<std::string, std::unique_ptr<Scope>> jobs_;
};

}  // namespace baton::coordinator
