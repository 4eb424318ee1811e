#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace baton {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Turns on the services every baton server offers operators: gRPC server
// reflection and the standard grpc.health.v1 health service (Kubernetes'
// native gRPC probes). Call before constructing the ServerBuilder.
void EnableStandardServices();

// Keepalive and message-size settings shared by every baton server.
void ApplyServerDefaults(grpc::ServerBuilder& builder, int max_message_bytes);

}  // namespace baton
