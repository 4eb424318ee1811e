#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "baton/v1/status.grpc.pb.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_page_builder.h"

namespace baton::coordinator {

// The gRPC edge of the status API: each call is answered on the control
// loop, which owns the job state it reads.
//
// Thread-safe. `loop` and `coordinator` must outlive the server this service
// is registered with.
class StatusService final : public v1::Status::CallbackService {
 public:
  StatusService(ControlLoop* loop, Coordinator* coordinator);

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* GetTensors(grpc::CallbackServerContext* context,
                                       const v1::GetJobRequest* request,
                                       v1::TensorsStatus* response) override;
  grpc::ServerUnaryReactor* GetTimeline(grpc::CallbackServerContext* context,
                                        const v1::GetTimelineRequest* request,
                                        v1::Timeline* response) override;

 private:
  // Finishes the call on the control loop with what `compute` (a
  // StatusOr<Response>() run there) returns.
  template <typename Response, typename Compute>
  grpc::ServerUnaryReactor* AnswerOnLoop(grpc::CallbackServerContext* context,
                                         Response* response, Compute compute);

  // Posts the page's next chunk to the loop; the last one finishes the call.
  void BuildPage(std::shared_ptr<JobPageBuilder> builder,
                 v1::JobStatus* response, grpc::ServerUnaryReactor* reactor);

  // Constant after construction.
  ControlLoop* const loop_;
  Coordinator* const coordinator_;
};

}  // namespace baton::coordinator
