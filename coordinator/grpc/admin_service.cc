#include "coordinator/grpc/admin_service.h"

#include <glog/logging.h>

#include <string>
#include <utility>

#include "common/grpc_util.h"

namespace baton::coordinator {

AdminService::AdminService(ControlLoop* loop, Coordinator* coordinator,
                           const CallAuthorizer* authorizer)
    : loop_(loop), coordinator_(coordinator), authorizer_(authorizer) {}

grpc::ServerUnaryReactor* AdminService::CancelJob(
    grpc::CallbackServerContext* context, const v1::CancelJobRequest* request,
    v1::CancelJobResponse* response) {
  std::string who;
  if (authorizer_ != nullptr) {
    if (const std::shared_ptr<const grpc::AuthContext> auth =
            context->auth_context()) {
      who = authorizer_->AdminName(*auth);
    }
  }
  if (who.empty()) who = "an admin";
  LOG(INFO) << who << " (" << context->peer() << ") cancels job \""
            << request->job() << "\"";
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // `request` and `response` stay valid until the reactor is finished.
  loop_->Post([coordinator = coordinator_, request, response, reactor,
               who = std::move(who)] {
    absl::StatusOr<std::string> reason =
        coordinator->CancelJob(request->job(), who, request->reason());
    if (!reason.ok()) {
      reactor->Finish(ToGrpcStatus(reason.status()));
      return;
    }
    response->set_state_reason(*std::move(reason));
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace baton::coordinator
