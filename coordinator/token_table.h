#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::coordinator {

// What a bearer token allows (docs/operations.md, "Tokens").
enum class TokenScope {
  kRead,   // the Status service and server reflection
  kAdmin,  // also the Admin service (cancelling jobs)
};

const char* TokenScopeName(TokenScope scope);

// The bearer tokens the coordinator accepts, from --tokens_file: lines
// "SCOPE NAME TOKEN" (scope read or admin; NAME says who holds the token,
// for logs and for "cancelled by NAME"), "#" comments and blank lines.
//
// Only SHA-256 digests of the tokens are kept. Find compares a presented
// token's digest with every entry's in constant time (CRYPTO_memcmp, no
// early exit), so neither the result's timing nor a log says which bytes
// matched.
//
// Immutable after Parse: thread-safe.
class TokenTable {
 public:
  struct Entry {
    TokenScope scope;
    std::string name;
    std::array<uint8_t, 32> digest;
  };

  // The shortest token accepted.
  static constexpr size_t kMinTokenLength = 16;

  // Reads and parses the file at `path`. Errors (INVALID_ARGUMENT) are one
  // line naming "--tokens_file PATH", the line number where there is one,
  // and the fix: unreadable, no tokens, a line that is not "SCOPE NAME
  // TOKEN", an unknown scope, a token shorter than kMinTokenLength, a token
  // listed twice.
  static absl::StatusOr<TokenTable> Load(const std::string& path);
  // The same for `text`, as if read from `path`.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text,
                                          const std::string& path);

  // The entry of `token`, or nullptr.
  const Entry* Find(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace baton::coordinator
