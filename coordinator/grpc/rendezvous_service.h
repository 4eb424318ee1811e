#pragma once

#include <grpcpp/grpcpp.h>

#include "baton/v1/rendezvous.grpc.pb.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"

namespace baton::coordinator {

// The gRPC edge of the rendezvous store: each call is posted to the control
// loop, and the store's callback (which runs on the loop, possibly much later
// for a waiting Get) fills the response and finishes the call.
//
// Thread-safe. `loop` and `coordinator` must outlive the server this service
// is registered with.
class RendezvousService final : public v1::RendezvousStore::CallbackService {
 public:
  RendezvousService(ControlLoop* loop, Coordinator* coordinator);

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::StoreSetRequest* request,
                                v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::StoreGetRequest* request,
                                v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const v1::StoreAddRequest* request,
                                v1::StoreAddResponse* response) override;

 private:
  // Constant after construction.
  ControlLoop* const loop_;
  Coordinator* const coordinator_;
};

}  // namespace baton::coordinator
