#include "coordinator/grpc/status_service.h"

#include <memory>
#include <utility>

#include "common/grpc_util.h"

namespace baton::coordinator {

// `request` and `response` stay valid until the reactor is finished, so the
// posted tasks may keep pointers to them.

StatusService::StatusService(ControlLoop* loop, Coordinator* coordinator)
    : loop_(loop), coordinator_(coordinator) {}

template <typename Response, typename Compute>
grpc::ServerUnaryReactor* StatusService::AnswerOnLoop(
    grpc::CallbackServerContext* context, Response* response, Compute compute) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_->Post([compute = std::move(compute), response, reactor]() {
    absl::StatusOr<Response> answer = compute();
    if (!answer.ok()) {
      reactor->Finish(ToGrpcStatus(answer.status()));
      return;
    }
    *response = *std::move(answer);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StatusService::ListJobs(
    grpc::CallbackServerContext* context, const v1::ListJobsRequest* request,
    v1::ListJobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_->Post([coordinator = coordinator_, request, response, reactor]() {
    *response = coordinator->ListJobs(*request);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* StatusService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::JobStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  BuildPage(std::make_shared<JobPageBuilder>(*request), response, reactor);
  return reactor;
}

void StatusService::BuildPage(std::shared_ptr<JobPageBuilder> builder,
                              v1::JobStatus* response,
                              grpc::ServerUnaryReactor* reactor) {
  // One chunk per task: the agents' messages posted meanwhile run between.
  loop_->Post([this, builder = std::move(builder), response, reactor]() {
    if (!builder->Step(*coordinator_)) {
      BuildPage(builder, response, reactor);
      return;
    }
    absl::StatusOr<v1::JobStatus> page = builder->Take();
    if (!page.ok()) {
      reactor->Finish(ToGrpcStatus(page.status()));
      return;
    }
    *response = *std::move(page);
    reactor->Finish(grpc::Status::OK);
  });
}

grpc::ServerUnaryReactor* StatusService::GetTensors(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::TensorsStatus* response) {
  return AnswerOnLoop(context, response, [coordinator = coordinator_, request] {
    return coordinator->GetTensors(request->job());
  });
}

grpc::ServerUnaryReactor* StatusService::GetTimeline(
    grpc::CallbackServerContext* context, const v1::GetTimelineRequest* request,
    v1::Timeline* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The reactor finishes when the agents answered (or at the deadline),
  // from a later turn of the control loop.
  loop_->Post([coordinator = coordinator_, request, response, reactor]() {
    coordinator->GetTimeline(
        *request, [response, reactor](absl::StatusOr<v1::Timeline> timeline) {
          if (!timeline.ok()) {
            reactor->Finish(ToGrpcStatus(timeline.status()));
            return;
          }
          *response = *std::move(timeline);
          reactor->Finish(grpc::Status::OK);
        });
  });
  return reactor;
}

}  // namespace baton::coordinator
