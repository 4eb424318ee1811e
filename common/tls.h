#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton {

// The files of a process's mutual TLS (--tls_cert, --tls_key, --tls_ca):
// its certificate (chain), its private key and the CA that signs every
// certificate of the cluster. All three or none: none means plaintext.
//
// The files are watched: gRPC reads them again every `refresh_s` seconds,
// so a renewed certificate takes effect without a restart (connections
// already open keep theirs). Replace a key and its certificate together:
// one file holding both, renamed into place, given as --tls_cert and
// --tls_key (docs/operations.md, "TLS").
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;
  int refresh_s = 10;

  bool enabled() const { return !cert.empty(); }
  // Only --tls_ca: a client that verifies the server and presents a bearer
  // token instead of a certificate (batonctl --token_file).
  bool ca_only() const { return cert.empty() && key.empty() && !ca.empty(); }
};

// What --tls_* must satisfy before a process starts: all three given or none
// (INVALID_ARGUMENT naming the missing one); each readable PEM; the key
// matches the certificate; the certificate is valid now and signed by the
// CA. Each error is one line naming the flag, the file and what to do.
// gRPC itself would start with bad files and fail every handshake later.
// With `allow_ca_only` (a client that presents a token instead), --tls_ca
// alone is accepted too: it must hold a readable PEM certificate.
absl::Status CheckTlsFiles(const TlsFiles& files, bool allow_ca_only = false);

// The DNS names of the certificate in `path` (its subjectAltName entries).
absl::StatusOr<std::vector<std::string>> CertificateDnsNames(
    const std::string& path);

// Server credentials for `files` (enabled): TLS 1.2+. Without `authorizer`
// a client certificate is required and verified against the CA. With one,
// a client certificate is optional at the handshake (one that is presented
// is still verified: another CA's or an expired one is refused) and
// `authorizer` decides each call (coordinator/grpc/call_authorizer.h).
std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(
    const TlsFiles& files,
    std::shared_ptr<grpc::AuthMetadataProcessor> authorizer = nullptr);

// Channel credentials for `files` (enabled or ca_only): the server's
// certificate verified against the CA and the address dialled, this
// process's certificate presented (none when ca_only). Without TLS:
// insecure credentials.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TlsFiles& files);

// The DNS names of a call's verified client certificate ("peer_dns"); empty
// for a plaintext call or a certificate without DNS names.
std::vector<std::string> PeerDnsNames(const grpc::AuthContext& context);

// True for addresses only this host can reach: "unix:" paths, 127.0.0.0/8,
// ::1 and "localhost" (with or without a port). False for 0.0.0.0, ::, an
// empty host and every other name or address.
bool IsLoopbackAddress(const std::string& address);

}  // namespace baton
