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
  request.set_page_size(page_size_);
  for (int attempt = 0;; ++attempt) {
    request.clear_page_token();
    google::protobuf::RepeatedPtrField<v1::MemberStatus> members;
    absl::StatusOr<v1::JobStatus> page;
    // Each page holds at least one member, so a job has at most
    // total_members pages; a coordinator that kept answering would be
    // stopped there.
    for (int64_t pages = 0;; ++pages) {
      page = GetJobPage(request);
      if (!page.ok()) break;
      for (v1::MemberStatus& m : *page->mutable_members()) {
        members.Add(std::move(m));
      }
      if (page->next_page_token().empty()) break;
      if (page->next_page_token() == request.page_token() ||
          pages > page->total_members()) {
        return absl::InternalError(absl::StrCat(
            "Status/GetJob of job \"", job, "\" at the coordinator ", address_,
            " kept answering with more pages (", pages + 1, " pages, ",
            members.size(), " members of ", page->total_members(),
            "): report this as a bug"));
      }
      request.set_page_token(page->next_page_token());
    }
    if (page.ok()) {
      page->mutable_members()->Swap(&members);
      page->clear_next_page_token();
      return page;
    }
    if (page.status().code() != absl::StatusCode::kAborted ||
        attempt + 1 >= kMembershipRetries) {
      return page.status();
    }
  }
}

absl::StatusOr<v1::JobStatus> StatusClient::GetJobPage(
    const v1::GetJobRequest& request) {
  return Call<v1::GetJobRequest, v1::JobStatus>(
      "Status/GetJob", request.job(), request, &v1::Status::Stub::GetJob);
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
