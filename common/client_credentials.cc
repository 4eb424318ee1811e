#include "common/client_credentials.h"

#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

// Adds "authorization: Bearer <token>" to every call.
class BearerTokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(std::string token)
      : header_(absl::StrCat("Bearer ", token)) {}

  // Runs on gRPC's threads without blocking.
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "baton-bearer-token"; }

  grpc::Status GetMetadata(
      grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
      const grpc::AuthContext& /*channel_auth_context*/,
      std::multimap<std::string, std::string>* metadata) override {
    metadata->emplace("authorization", header_);
    return grpc::Status::OK;
  }

 private:
  const std::string header_;
};

std::string Environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

}  // namespace

absl::StatusOr<std::string> ReadBearerToken(const std::string& path,
                                            const char* name) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " ", path,
        " cannot be read: give the path of a readable file holding your "
        "token"));
  }
  const std::string contents((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  const std::string token(absl::StripAsciiWhitespace(contents));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " ", path,
        " is empty: put the token the coordinator's --tokens_file lists for "
        "you in it"));
  }
  for (const char c : token) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        !absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " ", path,
          " holds more than one word or a control character: it must hold "
          "exactly one token"));
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientChannelCredentials(const TlsFiles& tls, const std::string& token_file,
                         const char* token_name) {
  const bool has_token = !token_file.empty();
  if (absl::Status checked = CheckTlsFiles(tls, /*allow_ca_only=*/has_token);
      !checked.ok()) {
    return checked;
  }
  if (!has_token) return ChannelCredentials(tls);
  if (!tls.enabled() && !tls.ca_only()) {
    return absl::InvalidArgumentError(absl::StrCat(
        token_name, " ", token_file,
        " needs TLS: tokens are never sent in plaintext; give --tls_ca (the "
        "CA of the coordinator's certificate), or leave out the token for a "
        "coordinator without TLS"));
  }
  absl::StatusOr<std::string> token = ReadBearerToken(token_file, token_name);
  if (!token.ok()) return token.status();
  return grpc::CompositeChannelCredentials(
      ChannelCredentials(tls),
      grpc::MetadataCredentialsFromPlugin(
          std::make_unique<BearerTokenPlugin>(*std::move(token))));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
ClientCredentialsFromEnvironment() {
  TlsFiles tls;
  tls.cert = Environment("BATON_TLS_CERT");
  tls.key = Environment("BATON_TLS_KEY");
  tls.ca = Environment("BATON_TLS_CA");
  const std::string refresh = Environment("BATON_TLS_REFRESH_S");
  if (!refresh.empty() && !absl::SimpleAtoi(refresh, &tls.refresh_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BATON_TLS_REFRESH_S=", refresh, " is not a number of seconds"));
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ClientChannelCredentials(tls, Environment("BATON_TOKEN_FILE"),
                               "BATON_TOKEN_FILE");
  if (!credentials.ok()) {
    // The messages name flags; here they came from the environment.
    return absl::Status(
        credentials.status().code(),
        absl::StrCat("from the environment (BATON_TLS_CERT, BATON_TLS_KEY, "
                     "BATON_TLS_CA for the flags named, BATON_TOKEN_FILE): ",
                     credentials.status().message()));
  }
  return credentials;
}

}  // namespace baton
