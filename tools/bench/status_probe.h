// StatusProbe: the load generator's operator, asking the coordinator for
// the job's whole status (every page of Status.GetJob) at a fixed interval
// while the agents heartbeat and report, and timing each answer.

#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "baton/status_client.h"
#include "baton/v1/status.pb.h"

namespace baton::bench {

// One whole fetch of a job's status.
struct JobFetch {
  absl::Status status;
  // The pages joined (as StatusClient::GetJob joins them).
  v1::JobStatus job;
  // Each page's round trip, in order, and the fetch's from the first
  // request to the last answer.
  std::vector<absl::Duration> pages;
  absl::Duration total;
  int64_t bytes = 0;
};

// Fetches every page of `job`, `page_size` at a time (0: the coordinator's
// default), timing each. A membership that changes between pages fails the
// fetch (ABORTED) instead of starting again, so the timings are one pass.
JobFetch FetchJob(StatusClient& client, const std::string& job,
                  int32_t page_size);

// Fetches the job every `interval` on its own thread until Stop. Thread-safe.
class StatusProbe {
 public:
  StatusProbe(StatusClient* client, std::string job, int32_t page_size,
              absl::Duration interval);
  ~StatusProbe() { Stop(); }

  void Stop();

  struct Summary {
    int fetches = 0;
    int failures = 0;
    std::string first_failure;
    // Sorted, in milliseconds.
    std::vector<double> fetch_ms;
    std::vector<double> page_ms;
    int pages_per_fetch = 0;
    int64_t bytes_per_fetch = 0;
    int members = 0;
  };
  Summary Take() const;

 private:
  void Run();

  StatusClient* const client_;
  const std::string job_;
  const int32_t page_size_;
  const absl::Duration interval_;
  absl::Notification stop_;

  mutable absl::Mutex mu_;
  Summary summary_ ABSL_GUARDED_BY(mu_);
  // Last member: started after the fields it reads.
  std::thread thread_;
};

}  // namespace baton::bench
