#include "common/token_flag.h"

#include <gflags/gflags.h>

#include "common/tls_flags.h"

DEFINE_string(token_file, "",
              "File holding a bearer token the coordinator's --tokens_file "
              "lists (read or admin scope); sent on every call, over TLS "
              "only. With a token, --tls_ca alone is enough");

namespace baton {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientCredentialsFromFlags() {
  return ClientChannelCredentials(TlsFilesFromFlags(), FLAGS_token_file);
}

}  // namespace baton
