#pragma once

#include <grpcpp/grpcpp.h>

#include "coordinator/session_manager.h"

namespace baton::coordinator {

// What the transport of the call behind `context` verified about the
// caller: with mutual TLS, the DNS names of its client certificate; nothing
// (not verified) without TLS.
PeerIdentity PeerIdentityOf(const grpc::ServerContextBase& context);

}  // namespace baton::coordinator
