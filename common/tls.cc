#include "common/tls.h"

#include <arpa/inet.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

// RAII for OpenSSL objects.
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct StoreFree {
  void operator()(X509_STORE* store) const { X509_STORE_free(store); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* ctx) const { X509_STORE_CTX_free(ctx); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

// The last OpenSSL error as text ("" when none), clearing the queue.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();  // NOLINT(runtime/int)
  ERR_clear_error();
  if (code == 0) return "";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// "--tls_cert /x/node-0.crt".
std::string Named(const char* flag, const std::string& path) {
  return absl::StrCat("--", flag, " ", path);
}

absl::StatusOr<Bio> Open(const char* flag, const std::string& path) {
  std::ifstream probe(path);
  if (!probe) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(flag, path),
                     " cannot be read: give the path of a readable PEM file"));
  }
  Bio bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(flag, path), " cannot be opened: ", OpenSslError()));
  }
  return bio;
}

// Every certificate in the PEM file at `path`, in order; at least one.
absl::StatusOr<std::vector<Cert>> ReadCertificates(const char* flag,
                                                   const std::string& path) {
  absl::StatusOr<Bio> bio = Open(flag, path);
  if (!bio.ok()) return bio.status();
  std::vector<Cert> certs;
  while (X509* cert =
             PEM_read_bio_X509(bio->get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the end of the file reads as an error
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named(flag, path),
        " holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\"): give "
        "the certificate file"));
  }
  return certs;
}

std::string Utc(const ASN1_TIME* time) {
  Bio bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), time);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);  // NOLINT
  return std::string(data, static_cast<size_t>(size));
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files, bool allow_ca_only) {
  const bool any =
      !files.cert.empty() || !files.key.empty() || !files.ca.empty();
  if (!any) return absl::OkStatus();
  if (allow_ca_only && files.ca_only()) {
    return ReadCertificates("tls_ca", files.ca).status();
  }
  for (const auto& [flag, path] :
       {std::pair{"tls_cert", &files.cert}, std::pair{"tls_key", &files.key},
        std::pair{"tls_ca", &files.ca}}) {
    if (path->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag,
          " is missing: TLS needs all of --tls_cert, --tls_key and --tls_ca "
          "(or none of them)"));
    }
  }
  if (files.refresh_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_refresh_s=", files.refresh_s,
                     " must be at least 1 (seconds between reading the "
                     "certificate files again)"));
  }
  absl::StatusOr<std::vector<Cert>> chain =
      ReadCertificates("tls_cert", files.cert);
  if (!chain.ok()) return chain.status();
  absl::StatusOr<std::vector<Cert>> authorities =
      ReadCertificates("tls_ca", files.ca);
  if (!authorities.ok()) return authorities.status();
  absl::StatusOr<Bio> key_bio = Open("tls_key", files.key);
  if (!key_bio.ok()) return key_bio.status();
  Key key(PEM_read_bio_PrivateKey(key_bio->get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named("tls_key", files.key), " holds no unencrypted PEM private key (",
        OpenSslError(), "): give the key file of --tls_cert"));
  }
  X509* leaf = chain->front().get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(Named("tls_key", files.key), " is not the key of ",
                     Named("tls_cert", files.cert),
                     ": give the key the certificate was made for"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named("tls_cert", files.cert), " expired at ",
                     Utc(X509_get0_notAfter(leaf)), ": renew it"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named("tls_cert", files.cert), " is not valid before ",
        Utc(X509_get0_notBefore(leaf)), ": check this host's clock"));
  }
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  for (const Cert& authority : *authorities) {
    X509_STORE_add_cert(store.get(), authority.get());
  }
  STACK_OF(X509)* intermediates = sk_X509_new_null();
  for (size_t i = 1; i < chain->size(); ++i) {
    sk_X509_push(intermediates, (*chain)[i].get());
  }
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> context(X509_STORE_CTX_new());
  X509_STORE_CTX_init(context.get(), store.get(), leaf, intermediates);
  const bool verified = X509_verify_cert(context.get()) == 1;
  const int error = X509_STORE_CTX_get_error(context.get());
  sk_X509_free(intermediates);
  ERR_clear_error();
  if (!verified) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named("tls_cert", files.cert), " is not signed by ",
        Named("tls_ca", files.ca), " (", X509_verify_cert_error_string(error),
        "): give the CA of the cluster, or a certificate it signed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CertificateDnsNames(
    const std::string& path) {
  absl::StatusOr<std::vector<Cert>> chain = ReadCertificates("tls_cert", path);
  if (!chain.ok()) return chain.status();
  std::vector<std::string> names;
  auto* entries = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(
      chain->front().get(), NID_subject_alt_name, nullptr, nullptr));
  if (entries == nullptr) return names;
  for (int i = 0; i < sk_GENERAL_NAME_num(entries); ++i) {
    const GENERAL_NAME* entry = sk_GENERAL_NAME_value(entries, i);
    if (entry->type != GEN_DNS) continue;
    const ASN1_IA5STRING* dns = entry->d.dNSName;
    names.emplace_back(
        reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
        static_cast<size_t>(ASN1_STRING_length(dns)));
  }
  GENERAL_NAMES_free(entries);
  return names;
}

namespace {

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(
    const TlsFiles& files) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca,
      static_cast<unsigned int>(files.refresh_s));
}

}  // namespace

std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(
    const TlsFiles& files,
    std::shared_ptr<grpc::AuthMetadataProcessor> authorizer) {
  grpc::experimental::TlsServerCredentialsOptions options(Provider(files));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(
      authorizer != nullptr
          ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(options);
  if (authorizer != nullptr) {
    credentials->SetAuthMetadataProcessor(std::move(authorizer));
  }
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TlsFiles& files) {
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (files.ca_only()) {
    options.set_certificate_provider(
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            files.ca, static_cast<unsigned int>(files.refresh_s)));
    options.watch_root_certs();
    return grpc::experimental::TlsCredentials(options);
  }
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  options.set_certificate_provider(Provider(files));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(options);
}

std::vector<std::string> PeerDnsNames(const grpc::AuthContext& context) {
  std::vector<std::string> names;
  if (!context.IsPeerAuthenticated()) return names;
  for (const grpc::string_ref& name : context.FindPropertyValues("peer_dns")) {
    names.emplace_back(name.data(), name.size());
  }
  return names;
}

bool IsLoopbackAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:")) return true;
  std::string host = address;
  // "host:port", "[v6]:port", or a bare host.
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    host = host.substr(1, close - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

}  // namespace baton
