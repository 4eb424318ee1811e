#pragma once

#include <grpcpp/grpcpp.h>

#include "baton/v1/admin.grpc.pb.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"
#include "coordinator/grpc/call_authorizer.h"

namespace baton::coordinator {

// The gRPC edge of the admin API: each call is answered on the control
// loop. With TLS on, CallAuthorizer admits only admin tokens here, and the
// token holder's name goes into the reason ("cancelled by NAME: ...");
// without TLS the service is open, like every other, and the reason says
// "cancelled by an admin".
//
// Thread-safe. `loop`, `coordinator` and `authorizer` (null without TLS)
// must outlive the server this service is registered with.
class AdminService final : public v1::Admin::CallbackService {
 public:
  AdminService(ControlLoop* loop, Coordinator* coordinator,
               const CallAuthorizer* authorizer);

  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;

 private:
  // Constant after construction.
  ControlLoop* const loop_;
  Coordinator* const coordinator_;
  const CallAuthorizer* const authorizer_;
};

}  // namespace baton::coordinator
