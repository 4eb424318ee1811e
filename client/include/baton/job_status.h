#pragma once

// A job's status as the coordinator reports it, for trainers that print it
// at the end of a run (format it with baton/status_format.h, as batonctl
// does).

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "baton/v1/status.pb.h"

namespace baton {

// Asks the coordinator at `address` for `job`'s status; when
// min_global_step >= 0, polls (every 100 ms, up to `wait`) until the job's
// global step reaches it. Agents report steps every report_interval_ms, so
// the last steps of a job show up a moment after they ran. When `wait`
// passes first, returns the last status received. The error of a failed
// call names the coordinator and the job.
//
// TLS and the bearer token come from the environment, as batonrun and the
// agents pass them on: BATON_TLS_CERT, BATON_TLS_KEY, BATON_TLS_CA and
// BATON_TOKEN_FILE (ClientCredentialsFromEnvironment in
// common/client_credentials.h); INVALID_ARGUMENT when they are unusable.
absl::StatusOr<v1::JobStatus> FetchJobStatus(
    const std::string& address, const std::string& job,
    int64_t min_global_step = -1,
    std::chrono::milliseconds wait = std::chrono::seconds(3));

}  // namespace baton
