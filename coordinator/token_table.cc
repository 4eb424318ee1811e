#include "coordinator/token_table.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace baton::coordinator {
namespace {

std::array<uint8_t, 32> Digest(absl::string_view token) {
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         digest.data());
  return digest;
}

}  // namespace

const char* TokenScopeName(TokenScope scope) {
  return scope == TokenScope::kAdmin ? "admin" : "read";
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens_file ", path,
        " cannot be read: give the path of a readable file of lines "
        "\"SCOPE NAME TOKEN\""));
  }
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  return Parse(text, path);
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text,
                                             const std::string& path) {
  TokenTable table;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const std::string where =
        absl::StrCat("--tokens_file ", path, " line ", number);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has ", words.size(),
          " words: write \"SCOPE NAME TOKEN\" (for example \"read alice "
          "<token>\"), one token a line"));
    }
    Entry entry;
    if (words[0] == "read") {
      entry.scope = TokenScope::kRead;
    } else if (words[0] == "admin") {
      entry.scope = TokenScope::kAdmin;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown scope \"", words[0],
                       "\": the scope is read or admin"));
    }
    entry.name = std::string(words[1]);
    const absl::string_view token = words[2];
    if (token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the token of \"", entry.name, "\" has ", token.size(),
          " characters, fewer than ", kMinTokenLength,
          ": make a longer one (openssl rand -hex 32)"));
    }
    entry.digest = Digest(token);
    for (const Entry& other : table.entries_) {
      if (other.digest == entry.digest) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the token of \"", entry.name,
                         "\" is also the token of \"", other.name,
                         "\": give each holder a token of their own"));
      }
    }
    table.entries_.push_back(std::move(entry));
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens_file ", path,
        " holds no tokens: add lines \"SCOPE NAME TOKEN\" (scope read or "
        "admin), or leave out --tokens_file"));
  }
  return table;
}

const TokenTable::Entry* TokenTable::Find(absl::string_view token) const {
  const std::array<uint8_t, 32> digest = Digest(token);
  const Entry* found = nullptr;
  for (const Entry& entry : entries_) {
    if (CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0) {
      found = &entry;
    }
  }
  return found;
}

}  // namespace baton::coordinator
