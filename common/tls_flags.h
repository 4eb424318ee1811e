#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/tls.h"

namespace baton {

// The TLS flags every baton binary takes (BATON_TLS_CERT etc. in the
// environment): --tls_cert, --tls_key, --tls_ca, --tls_refresh_s.
TlsFiles TlsFilesFromFlags();

// --insecure: plaintext on a non-loopback address is allowed.
bool InsecureFromFlags();

// What a server or client must check before it starts: CheckTlsFiles, then
// secure by default: when `addresses` (what it listens on or dials, by
// flag) include one that is not loopback, TLS must be on or --insecure
// given. FAILED_PRECONDITION otherwise, one line naming the flag and
// address and the way out.
struct NamedAddress {
  const char* flag;
  std::string address;
};
absl::Status CheckTransportSecurity(
    std::initializer_list<NamedAddress> addresses);

}  // namespace baton
