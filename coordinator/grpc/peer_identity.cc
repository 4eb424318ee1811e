#include "coordinator/grpc/peer_identity.h"

#include <memory>

#include "common/tls.h"

namespace baton::coordinator {

PeerIdentity PeerIdentityOf(const grpc::ServerContextBase& context) {
  PeerIdentity identity;
  if (const std::shared_ptr<const grpc::AuthContext> auth =
          context.auth_context()) {
    identity.verified = auth->IsPeerAuthenticated();
    identity.dns_names = PeerDnsNames(*auth);
  }
  return identity;
}

}  // namespace baton::coordinator
