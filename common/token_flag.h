#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/statusor.h"
#include "common/client_credentials.h"

namespace baton {

// --token_file (BATON_TOKEN_FILE), for the clients of the coordinator's
// Status and Admin services (batonctl, batonrun): ClientChannelCredentials
// of the --tls_* flags and the token.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientCredentialsFromFlags();

}  // namespace baton
