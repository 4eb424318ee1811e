#include "agent/transport/tcp/tcp_introduction.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>

#include "absl/status/status.h"

namespace baton::agent::tcp {
namespace {

constexpr std::string_view kIntroductionMagic = "BRN2";
constexpr std::string_view kReplyMagic = "BRNA";
// Domain tags: an introduction's MAC is never a valid reply, nor the reverse.
constexpr std::string_view kIntroductionTag = "baton/intro/v1";
constexpr std::string_view kReplyTag = "baton/accept/v1";
constexpr size_t kMacBytes = 32;  // SHA-256
static_assert(kIntroductionBytes == 4 + 4 + 8 + 8 + kMacBytes);
static_assert(kIntroductionReplyBytes == 4 + kMacBytes);

using Mac = std::array<unsigned char, kMacBytes>;

void AppendBigEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

uint64_t ReadBigEndian(std::string_view bytes, size_t offset, int count) {
  uint64_t value = 0;
  for (int i = 0; i < count; ++i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[offset + i]);
  }
  return value;
}

// HMAC-SHA256(secret, tag || key_prefix || rank || link_id), the integers
// big-endian. Only the prefix varies in length and the fields after it are
// fixed-size, so the input is unambiguous. False when libcrypto fails.
bool ComputeMac(std::string_view tag, std::string_view key_prefix, int32_t rank,
                uint64_t link_id, std::string_view secret, Mac& mac) {
  std::string input;
  input.reserve(tag.size() + key_prefix.size() + 12);
  input.append(tag);
  input.append(key_prefix);
  AppendBigEndian(input, static_cast<uint32_t>(rank), 4);
  AppendBigEndian(input, link_id, 8);
  // HMAC wants a non-null key even when it is empty.
  static const char kNoKey = 0;
  const char* key = secret.empty() ? &kNoKey : secret.data();
  unsigned int length = 0;
  return HMAC(EVP_sha256(), key, static_cast<int>(secret.size()),
              reinterpret_cast<const unsigned char*>(input.data()),
              input.size(), mac.data(), &length) != nullptr &&
         length == kMacBytes;
}

bool SameMac(const Mac& expected, std::string_view received) {
  return received.size() == kMacBytes &&
         CRYPTO_memcmp(expected.data(), received.data(), kMacBytes) == 0;
}

absl::Status MacFailed() {
  return absl::InternalError(
      "computing the data-plane introduction's HMAC-SHA256 failed in "
      "libcrypto");
}

}  // namespace

uint64_t PrefixHash(std::string_view key_prefix) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : key_prefix) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::StatusOr<std::string> EncodeIntroduction(const Introduction& introduction,
                                               std::string_view key_prefix,
                                               std::string_view secret) {
  Mac mac;
  if (!ComputeMac(kIntroductionTag, key_prefix, introduction.rank,
                  introduction.link_id, secret, mac)) {
    return MacFailed();
  }
  std::string bytes(kIntroductionMagic);
  AppendBigEndian(bytes, static_cast<uint32_t>(introduction.rank), 4);
  AppendBigEndian(bytes, introduction.prefix_hash, 8);
  AppendBigEndian(bytes, introduction.link_id, 8);
  bytes.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  return bytes;
}

ReceivedIntroduction ReadIntroduction(std::string_view bytes,
                                      std::string_view key_prefix,
                                      std::string_view secret) {
  using Verdict = ReceivedIntroduction::Verdict;
  ReceivedIntroduction received;
  if (bytes.size() != kIntroductionBytes ||
      bytes.substr(0, kIntroductionMagic.size()) != kIntroductionMagic) {
    return received;
  }
  Introduction& introduction = received.introduction;
  introduction.rank =
      static_cast<int32_t>(static_cast<uint32_t>(ReadBigEndian(bytes, 4, 4)));
  introduction.prefix_hash = ReadBigEndian(bytes, 8, 8);
  introduction.link_id = ReadBigEndian(bytes, 16, 8);
  if (introduction.prefix_hash != PrefixHash(key_prefix)) {
    received.verdict = Verdict::kOtherPrefix;
    return received;
  }
  Mac expected;
  received.verdict = ComputeMac(kIntroductionTag, key_prefix, introduction.rank,
                                introduction.link_id, secret, expected) &&
                             SameMac(expected, bytes.substr(24))
                         ? Verdict::kAuthentic
                         : Verdict::kBadMac;
  return received;
}

absl::StatusOr<std::string> EncodeIntroductionReply(std::string_view key_prefix,
                                                    int32_t acceptor_rank,
                                                    uint64_t link_id,
                                                    std::string_view secret) {
  Mac mac;
  if (!ComputeMac(kReplyTag, key_prefix, acceptor_rank, link_id, secret, mac)) {
    return MacFailed();
  }
  std::string bytes(kReplyMagic);
  bytes.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  return bytes;
}

bool VerifyIntroductionReply(std::string_view bytes,
                             std::string_view key_prefix, int32_t acceptor_rank,
                             uint64_t link_id, std::string_view secret) {
  Mac expected;
  return bytes.size() == kIntroductionReplyBytes &&
         bytes.substr(0, kReplyMagic.size()) == kReplyMagic &&
         ComputeMac(kReplyTag, key_prefix, acceptor_rank, link_id, secret,
                    expected) &&
         SameMac(expected, bytes.substr(kReplyMagic.size()));
}

}  // namespace baton::agent::tcp
