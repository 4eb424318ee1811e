#include "baton/job_status.h"

#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/v1/status.grpc.pb.h"
#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"

namespace baton {

absl::StatusOr<v1::JobStatus> FetchJobStatus(const std::string& address,
                                             const std::string& job,
                                             int64_t min_global_step,
                                             std::chrono::milliseconds wait) {
  auto stub = v1::Status::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  v1::GetJobRequest request;
  request.set_job(job);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(2));
    v1::JobStatus status;
    const grpc::Status rpc = stub->GetJob(&context, request, &status);
    if (!rpc.ok()) {
      const absl::Status error = FromGrpcStatus(rpc);
      return absl::Status(
          error.code(),
          absl::StrCat("asking the coordinator at ", address, " for job \"",
                       job, "\": ", error.message(),
                       " (is BATON_COORDINATOR that coordinator's address?)"));
    }
    if (status.global_step() >= min_global_step ||
        std::chrono::steady_clock::now() >= deadline) {
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string FormatJobStatus(const v1::JobStatus& status) {
  std::string text = absl::StrFormat(
      "job %s as the coordinator reports it: %s, generation %d, world size "
      "%d, global step %d\n",
      status.job(), v1::JobState_Name(status.state()), status.generation(),
      status.world_size(), status.global_step());
  for (const v1::MemberStatus& m : status.members()) {
    absl::StrAppendFormat(
        &text, "  node %-4s node rank %d, ranks %d..%d, %.1f KB/s pushed\n",
        m.node_name(), m.node_rank(), m.rank_offset(),
        m.rank_offset() + m.local_size() - 1,
        m.throughput_bytes_per_second() / 1e3);
  }
  return text;
}

}  // namespace baton
