#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/token_table.h"

namespace baton::coordinator {

// The bearer token a call presented, as the coordinator sees it.
enum class PresentedToken {
  kNone,     // no "authorization" metadata
  kUnknown,  // not "Bearer <token>", or a token the tokens file lacks
  kRead,
  kAdmin,
};

// Who may call `method` (the call's ":path", "/package.Service/Method")
// with TLS on: the method table of docs/operations.md, "Tokens", as a pure
// function.
//   /baton.v1.Coordinator/AgentSession, /baton.v1.RendezvousStore/*: a
//     verified client certificate (a node's); a token is not enough.
//   /baton.v1.Status/*, server reflection: a verified client certificate or
//     a token of scope read or admin.
//   /baton.v1.Admin/*: a token of scope admin.
//   /grpc.health.v1.Health/*: anyone (probes).
//   anything else: nobody (PERMISSION_DENIED).
// A token the coordinator does not know is refused (UNAUTHENTICATED) on
// every method but health, even beside a certificate. Missing credentials
// are UNAUTHENTICATED, insufficient ones PERMISSION_DENIED. `token_name`
// (the holder of a known token) appears in the message; tokens never do.
absl::Status AuthorizeCall(absl::string_view method, bool verified_certificate,
                           PresentedToken token, absl::string_view token_name);

// The coordinator's gRPC AuthMetadataProcessor with TLS on (gRPC aborts the
// process if one is set on plaintext credentials): runs AuthorizeCall on
// every call before it reaches a service, reading the certificate from the
// connection's AuthContext and the token from "authorization: Bearer ...",
// which it consumes so that no handler sees it. Each refusal is logged with
// the method and the credentials presented (the certificate's common name,
// the token holder's name, never a token), at most once per kLogInterval
// for the same method and credentials, with a count of those not logged.
// (gRPC 1.51 does not tell a processor the peer's address.)
//
// The tokens file is read again when its modification time changes, at
// most every `refresh` (--tls_refresh_s): a file that no longer parses is
// logged and the tokens already loaded stay in force.
//
// Thread-safe: Process runs inline on gRPC's threads (IsBlocking false):
// it waits on nothing but a stat of the tokens file at most every
// `refresh`, and reading the (small) file when it changed.
class CallAuthorizer final : public grpc::AuthMetadataProcessor {
 public:
  static constexpr absl::Duration kLogInterval = absl::Seconds(10);

  // `tokens_path` "" (no --tokens_file): no token is accepted; `tokens`
  // is then empty. Otherwise `tokens` is the table loaded from it.
  CallAuthorizer(std::string tokens_path,
                 std::shared_ptr<const TokenTable> tokens,
                 absl::Duration refresh);

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // Who holds the admin token that authorized the Admin calls on the
  // connection of `context` (a handler's auth_context()): the holder's
  // NAME, or "" when unknown (a client certificate was presented too, or
  // more than one admin token was used on the connection).
  std::string AdminName(const grpc::AuthContext& context) const;

 private:
  std::shared_ptr<const TokenTable> CurrentTokens();
  // Logs `refusal` of `method` for `who`, rate-limited.
  void LogRefusal(absl::string_view method, const std::string& who,
                  const absl::Status& refusal);

  // Constant after construction.
  const std::string tokens_path_;
  const absl::Duration refresh_;

  // Guards the connection AuthContexts too: gRPC shares one per connection
  // between its calls, and AddProperty is not safe beside readers.
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_);
  absl::Time modified_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  struct Logged {
    absl::Time last;
    int suppressed = 0;
  };
  absl::Mutex log_mu_;
  absl::flat_hash_map<std::string, Logged> logged_ ABSL_GUARDED_BY(log_mu_);
};

}  // namespace baton::coordinator
