#include "coordinator/grpc/status_service.h"

#include <utility>

#include "common/grpc_util.h"

namespace baton {

// `request` and `response` stay valid until the reactor is finished, so the
// posted tasks may keep pointers to them.

StatusService::StatusService(ControlLoop* loop, Coordinator* coordinator)
    : loop_(loop), coordinator_(coordinator) {}

grpc::ServerUnaryReactor* StatusService::ListJobs(
    grpc::CallbackServerContext* context,
    const v1::ListJobsRequest* /*request*/, v1::ListJobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_->Post([coordinator = coordinator_, response, reactor]() {
    *response = coordinator->ListJobs();
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StatusService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::JobStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_->Post([coordinator = coordinator_, request, response, reactor]() {
    absl::StatusOr<v1::JobStatus> job = coordinator->GetJob(request->job());
    if (!job.ok()) {
      reactor->Finish(ToGrpcStatus(job.status()));
      return;
    }
    *response = *std::move(job);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace baton
