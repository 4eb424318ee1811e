#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/status.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton {

// A client of the coordinator's read-only Status service (batonctl, and
// trainers printing their job at the end of a run). Every call has a
// deadline of `timeout`; a failed call returns one line that names the
// coordinator's address and says what to check (see DescribeRpcError).
//
// Not thread-safe: one call at a time.
class StatusClient {
 public:
  // `credentials`: how to reach the coordinator (mutual TLS: see
  // ChannelCredentials in common/tls.h); null for plaintext.
  StatusClient(std::string address, absl::Duration timeout,
               std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  // Every job with the first page of its members, as Status.ListJobs
  // answers it: a job with more has a next_page_token (GetJob fetches it
  // whole).
  absl::StatusOr<v1::ListJobsResponse> ListJobs();
  // The whole job: every page of its members (page_size() at a time)
  // joined, the job's other fields from the last page. When the job's
  // membership changes between pages (ABORTED), starts again from the first
  // page, at most kMembershipRetries times.
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job);
  // One page, as Status.GetJob answers it.
  absl::StatusOr<v1::JobStatus> GetJobPage(const v1::GetJobRequest& request);
  absl::StatusOr<v1::TensorsStatus> GetTensors(const std::string& job);
  absl::StatusOr<v1::Timeline> GetTimeline(
      const v1::GetTimelineRequest& request);

  const std::string& address() const { return address_; }
  // Members per GetJob page; 0 (the default) leaves it to the coordinator.
  void set_page_size(int32_t page_size) { page_size_ = page_size; }
  int32_t page_size() const { return page_size_; }

  static constexpr int kMembershipRetries = 3;

 private:
  // Runs `rpc` (a Status stub method) with the deadline.
  template <typename Request, typename Response, typename Rpc>
  absl::StatusOr<Response> Call(const char* method, const std::string& job,
                                const Request& request, Rpc rpc);

  const std::string address_;
  const absl::Duration timeout_;
  std::unique_ptr<v1::Status::Stub> stub_;
  int32_t page_size_ = 0;
};

// The error of `method` (service and method, for example "Status/GetJob"
// or "Admin/CancelJob") of job `job` ("" for none)
// on the coordinator at `address` that ended with `rpc`, as one line: an
// unreachable coordinator names the address and what to check, an unknown
// job says how to list the known ones, a server without the method says to
// check the address or upgrade the coordinator.
absl::Status DescribeRpcError(const std::string& address, const char* method,
                              const std::string& job, absl::Duration timeout,
                              const grpc::Status& rpc);

}  // namespace baton
