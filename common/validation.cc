#include "common/validation.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

constexpr size_t kMaxIdentifier = 128;
constexpr size_t kMaxTensorName = 256;
constexpr size_t kMaxHostPort = 300;

// Quotes a user-supplied value for an error message without echoing
// megabytes or control characters back.
std::string Quote(absl::string_view value) {
  std::string out = "\"";
  for (size_t i = 0; i < value.size() && i < 64; ++i) {
    const char c = value[i];
    out += absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  if (value.size() > 64) absl::StrAppend(&out, "...");
  return out + "\"";
}

}  // namespace

absl::Status ValidateIdentifier(absl::string_view what,
                                absl::string_view value) {
  if (value.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is empty: give a name of 1..", kMaxIdentifier,
                     " characters of [A-Za-z0-9._:-]"));
  }
  if (value.size() > kMaxIdentifier) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", value.size(),
                     " characters long; the limit is ", kMaxIdentifier));
  }
  for (char c : value) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != ':' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quote(value),
                       " has a character outside [A-Za-z0-9._:-]; rename it"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTensorName(absl::string_view what,
                                absl::string_view value) {
  if (value.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is empty: every tensor needs a name"));
  }
  if (value.size() > kMaxTensorName) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(value), " is ", value.size(),
                     " characters long; the limit is ", kMaxTensorName));
  }
  for (char c : value) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quote(value),
                       " has a non-printable character; use printable ASCII"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateHostPort(absl::string_view what, absl::string_view value,
                              PortZero port_zero) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", Quote(value), " ", why, "; expected host:port"));
  };
  if (value.empty() || value.size() > kMaxHostPort) {
    return bad("has a bad length");
  }
  const size_t colon = value.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return bad("has no host or no port");
  }
  absl::string_view host = value.substr(0, colon);
  if (host.front() == '[' ? host.back() != ']'
                          : host.find(':') != absl::string_view::npos) {
    return bad("has an unbracketed IPv6 host");
  }
  for (char c : host) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c)) || c == ' ') {
      return bad("has a bad character in the host");
    }
  }
  uint32_t port = 0;
  const uint32_t min_port = port_zero == PortZero::kAllowed ? 0 : 1;
  if (!absl::SimpleAtoi(value.substr(colon + 1), &port) || port < min_port ||
      port > 65535) {
    return bad(port_zero == PortZero::kAllowed ? "has a port outside 0..65535"
                                               : "has a port outside 1..65535");
  }
  return absl::OkStatus();
}

}  // namespace baton
