#include "baton/status_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/grpc_util.h"

namespace baton {

StatusClient::StatusClient(
    std::string address, absl::Duration timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials)
    : address_(std::move(address)),
      timeout_(timeout),
      stub_(v1::Status::NewStub(grpc::CreateChannel(
          address_, credentials != nullptr
                        ? std::move(credentials)
                        : grpc::InsecureChannelCredentials()))) {}

template <typename Request, typename Response, typename Rpc>
absl::StatusOr<Response> StatusClient::Call(const char* method,
                                            const std::string& job,
                                            const Request& request, Rpc rpc) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  Response response;
  const grpc::Status status = (stub_.get()->*rpc)(&context, request, &response);
  if (!status.ok()) {
    return DescribeRpcError(address_, method, job, timeout_, status);
  }
  return response;
}

absl::StatusOr<v1::ListJobsResponse> StatusClient::ListJobs() {
  return Call<v1::ListJobsRequest, v1::ListJobsResponse>(
      "Status/ListJobs", "", v1::ListJobsRequest(),
      &v1::Status::Stub::ListJobs);
}

absl::StatusOr<v1::JobStatus> StatusClient::GetJob(const std::string& job) {
  v1::GetJobRequest request;
  request.set_job(job);
  return Call<v1::GetJobRequest, v1::JobStatus>("Status/GetJob", job, request,
                                                &v1::Status::Stub::GetJob);
}

absl::StatusOr<v1::TensorsStatus> StatusClient::GetTensors(
    const std::string& job) {
  v1::GetJobRequest request;
  request.set_job(job);
  return Call<v1::GetJobRequest, v1::TensorsStatus>(
      "Status/GetTensors", job, request, &v1::Status::Stub::GetTensors);
}

absl::StatusOr<v1::Timeline> StatusClient::GetTimeline(
    const v1::GetTimelineRequest& request) {
  return Call<v1::GetTimelineRequest, v1::Timeline>(
      "Status/GetTimeline", request.job(), request,
      &v1::Status::Stub::GetTimeline);
}

absl::Status DescribeRpcError(const std::string& address, const char* method,
                              const std::string& job, absl::Duration timeout,
                              const grpc::Status& rpc) {
  const absl::Status error = FromGrpcStatus(rpc);
  // gRPC's messages may span lines; the error is one.
  const std::string message =
      absl::StrReplaceAll(error.message(), {{"\n", " "}, {"\r", ""}});
  switch (error.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: {
      const std::string why =
          error.code() == absl::StatusCode::kUnavailable
              ? absl::StrCat("UNAVAILABLE: ", message)
              : absl::StrCat("no answer within ", absl::FormatDuration(timeout),
                             ", --timeout_ms");
      // A TLS handshake refused either way (plaintext to a TLS coordinator,
      // a certificate it does not trust) reads "Socket closed" here.
      const bool handshake = absl::StrContains(message, "Socket closed") ||
                             absl::StrContains(message, "Handshake") ||
                             absl::StrContains(message, "handshake");
      return absl::Status(
          error.code(),
          absl::StrCat(
              "cannot reach the coordinator at ", address, " (", method, ": ",
              why,
              "): check that baton-coordinator runs there and that "
              "--coordinator or BATON_COORDINATOR names its address",
              handshake
                  ? "; if it runs with TLS, give --tls_cert, --tls_key and "
                    "--tls_ca (a certificate its CA signed, and that CA), or "
                    "--tls_ca and --token_file (a token it lists)"
                  : ""));
    }
    case absl::StatusCode::kNotFound:
      return absl::Status(
          error.code(),
          absl::StrCat(message, " (coordinator ", address,
                       "): batonctl jobs lists the jobs it knows"));
    case absl::StatusCode::kUnimplemented:
      return absl::Status(
          error.code(),
          absl::StrCat("the server at ", address,
                       " does not implement baton.v1.", method,
                       " (UNIMPLEMENTED: ", message,
                       "): check that --coordinator or BATON_COORDINATOR "
                       "names a baton-coordinator, and upgrade it if it is "
                       "older than this batonctl"));
    default:
      return absl::Status(
          error.code(),
          absl::StrCat(method, job.empty() ? "" : " of job \"" + job + "\"",
                       " at the coordinator ", address, " failed: ",
                       absl::StatusCodeToString(error.code()), ": ", message));
  }
}

}  // namespace baton
