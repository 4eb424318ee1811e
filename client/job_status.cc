#include "baton/job_status.h"

#include <memory>
#include <thread>
#include <utility>

#include "baton/status_client.h"
#include "common/client_credentials.h"

namespace baton {

absl::StatusOr<v1::JobStatus> FetchJobStatus(const std::string& address,
                                             const std::string& job,
                                             int64_t min_global_step,
                                             std::chrono::milliseconds wait) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ClientCredentialsFromEnvironment();
  if (!credentials.ok()) return credentials.status();
  StatusClient client(address, absl::Seconds(2), *std::move(credentials));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    absl::StatusOr<v1::JobStatus> status = client.GetJob(job);
    if (!status.ok() || status->global_step() >= min_global_step ||
        std::chrono::steady_clock::now() >= deadline) {
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace baton
