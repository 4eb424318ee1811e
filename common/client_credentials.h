#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tls.h"

namespace baton {

// What a client of the coordinator's Status and Admin services (batonctl,
// batonrun, a trainer printing its job) presents: mutual TLS (`tls`
// enabled), or TLS that only verifies the coordinator (`tls` ca_only) with a
// bearer token, or both; plaintext when neither is given.
//
// `token_file` ("" for none) holds one token; surrounding whitespace is
// trimmed. It is sent on every call as "authorization: Bearer <token>"
// (docs/operations.md, "Tokens"). Errors, one line naming the flag (or
// environment variable) in `token_name` and the file: the TLS files fail
// CheckTlsFiles (ca_only is accepted only with a token); the token file is
// unreadable or empty; a token without TLS (gRPC sends none in plaintext).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientChannelCredentials(const TlsFiles& tls, const std::string& token_file,
                         const char* token_name = "--token_file");

// The token in `path` (trimmed); `name` is the flag or variable that gave
// it, for the error.
absl::StatusOr<std::string> ReadBearerToken(const std::string& path,
                                            const char* name);

// ClientChannelCredentials from the environment, for the client library
// (which has no flags): BATON_TLS_CERT, BATON_TLS_KEY, BATON_TLS_CA,
// BATON_TLS_REFRESH_S and BATON_TOKEN_FILE, read as the binaries read their
// flags.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientCredentialsFromEnvironment();

}  // namespace baton
