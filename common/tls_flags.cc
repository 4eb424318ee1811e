#include "common/tls_flags.h"

#include <gflags/gflags.h>

#include "absl/strings/str_cat.h"

DEFINE_string(tls_cert, "",
              "PEM certificate (chain) this process presents; with "
              "--tls_key and --tls_ca turns on mutual TLS. The files are read "
              "again every --tls_refresh_s seconds (rotation without restart)");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert");
DEFINE_string(tls_ca, "",
              "PEM certificate(s) of the CA that signs the cluster's "
              "certificates; peers' certificates are verified against it");
DEFINE_int32(tls_refresh_s, 10, "Seconds between reading the TLS files again");
DEFINE_bool(insecure, false,
            "Allow plaintext gRPC on an address that is not loopback (anyone "
            "who reaches it can join jobs and read the rendezvous store); "
            "on an agent with TLS, also allow --data_transport=gloo, whose "
            "connections between agents are not authenticated");

namespace baton {

TlsFiles TlsFilesFromFlags() {
  TlsFiles files;
  files.cert = FLAGS_tls_cert;
  files.key = FLAGS_tls_key;
  files.ca = FLAGS_tls_ca;
  files.refresh_s = FLAGS_tls_refresh_s;
  return files;
}

bool InsecureFromFlags() { return FLAGS_insecure; }

absl::Status CheckTransportSecurity(
    std::initializer_list<NamedAddress> addresses) {
  const TlsFiles files = TlsFilesFromFlags();
  if (absl::Status checked = CheckTlsFiles(files); !checked.ok()) {
    return checked;
  }
  if (files.enabled() || FLAGS_insecure) return absl::OkStatus();
  for (const NamedAddress& named : addresses) {
    if (named.address.empty() || IsLoopbackAddress(named.address)) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing plaintext on ", named.flag, "=", named.address,
        ", which is not a loopback address: without TLS anyone who reaches "
        "baton's ports can join its jobs, read the rendezvous store and "
        "connect to the data plane. Give --tls_cert, --tls_key and --tls_ca "
        "(docs/operations.md, \"TLS\"), or --insecure on a network you "
        "trust"));
  }
  return absl::OkStatus();
}

}  // namespace baton
