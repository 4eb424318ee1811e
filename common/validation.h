#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace baton {

// Names of jobs and nodes: 1..128 characters of [A-Za-z0-9._:-]. `what`
// names the field in the error ("JoinJob.job").
absl::Status ValidateIdentifier(absl::string_view what,
                                absl::string_view value);

// Tensor names: 1..256 printable ASCII characters.
absl::Status ValidateTensorName(absl::string_view what,
                                absl::string_view value);

// Whether port 0 is acceptable: for a listen address (the kernel picks a
// port) or a data-plane address whose ports are exchanged through the
// rendezvous store (gloo binds one ephemeral port per peer connection).
enum class PortZero { kRejected, kAllowed };

// "host:port" or "[v6]:port" with a port in 1..65535 (0..65535 with
// PortZero::kAllowed).
absl::Status ValidateHostPort(absl::string_view what, absl::string_view value,
                              PortZero port_zero = PortZero::kRejected);

}  // namespace baton
