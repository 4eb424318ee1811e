#include "coordinator/grpc/rendezvous_service.h"

#include <string>
#include <utility>
#include <vector>

#include "common/grpc_util.h"
#include "coordinator/grpc/peer_identity.h"

namespace baton::coordinator {

// `request` and `response` stay valid until the reactor is finished, so the
// posted tasks may keep pointers to them.

RendezvousService::RendezvousService(ControlLoop* loop,
                                     Coordinator* coordinator)
    : loop_(loop), coordinator_(coordinator) {}

grpc::ServerUnaryReactor* RendezvousService::Set(
    grpc::CallbackServerContext* context, const v1::StoreSetRequest* request,
    v1::StoreSetResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_->Post([coordinator = coordinator_, request, reactor,
               caller = PeerIdentityOf(*context)]() {
    coordinator->StoreSet(*request, caller, [reactor](absl::Status status) {
      reactor->Finish(ToGrpcStatus(status));
    });
  });
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Get(
    grpc::CallbackServerContext* context, const v1::StoreGetRequest* request,
    v1::StoreGetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_->Post([coordinator = coordinator_, request, response, reactor,
               caller = PeerIdentityOf(*context)]() {
    coordinator->StoreGet(
        *request, caller,
        [response, reactor](absl::StatusOr<std::vector<std::string>> values) {
          if (!values.ok()) {
            reactor->Finish(ToGrpcStatus(values.status()));
            return;
          }
          for (std::string& value : *values) {
            response->add_values(std::move(value));
          }
          reactor->Finish(grpc::Status::OK);
        });
  });
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Add(
    grpc::CallbackServerContext* context, const v1::StoreAddRequest* request,
    v1::StoreAddResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_->Post([coordinator = coordinator_, request, response, reactor,
               caller = PeerIdentityOf(*context)]() {
    coordinator->StoreAdd(*request, caller,
                          [response, reactor](absl::StatusOr<int64_t> sum) {
                            if (!sum.ok()) {
                              reactor->Finish(ToGrpcStatus(sum.status()));
                              return;
                            }
                            response->set_value(*sum);
                            reactor->Finish(grpc::Status::OK);
                          });
  });
  return reactor;
}

}  // namespace baton::coordinator
