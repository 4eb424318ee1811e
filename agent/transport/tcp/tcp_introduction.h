#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace baton::agent::tcp {

// The first bytes on each new TCP connection between two agents
// (ConnectPeers), and the answer to them: how the two prove to each other
// that both hold this generation's data-plane secret (the 32 bytes the
// coordinator draws at each seal, Membership.data_plane_secret) before a
// single data byte crosses. docs/protocol.md, "Data-plane introductions",
// has the wire layout.
//
// The node that connects sends an Introduction: its node rank, a hash of the
// peer set's key prefix (so a connection meant for another set or generation
// is told apart from a forged one), the new link's id, and
// HMAC-SHA256(secret, "baton/intro/v1" || key prefix || rank || link id).
// The node that accepts checks the MAC in constant time and answers with
// HMAC-SHA256(secret, "baton/accept/v1" || key prefix || its own rank ||
// link id), so the connecting node knows its peer holds the secret too. The
// link id is fresh for every connection, so neither MAC can be replayed on
// another one.
//
// Pure functions of their arguments (no sockets): safe to fuzz.

// Bytes on the wire: magic (4), rank (4), prefix hash (8), link id (8), MAC.
inline constexpr size_t kIntroductionBytes = 56;
// Magic (4) and MAC (32).
inline constexpr size_t kIntroductionReplyBytes = 36;

// What a connecting node says about itself.
struct Introduction {
  int32_t rank = 0;          // the connecting node's rank
  uint64_t prefix_hash = 0;  // PrefixHash(key prefix)
  uint64_t link_id = 0;      // the new link's Link::id
};

// FNV-1a of the peer set's key prefix: the same on every node.
uint64_t PrefixHash(std::string_view key_prefix);

// The kIntroductionBytes a node sends after connecting. INTERNAL only when
// libcrypto fails to compute the MAC.
absl::StatusOr<std::string> EncodeIntroduction(const Introduction& introduction,
                                               std::string_view key_prefix,
                                               std::string_view secret);

// What an accepting node makes of the bytes a peer sent first.
struct ReceivedIntroduction {
  enum class Verdict {
    // Not kIntroductionBytes, or not this protocol's magic: not a peer of
    // this build (or not a peer at all).
    kMalformed,
    // An introduction for another key prefix: a peer of another peer set
    // or generation, which holds another secret anyway.
    kOtherPrefix,
    // For this prefix, but the MAC does not verify: the sender does not hold
    // this generation's secret. Its rank is only what it claims.
    kBadMac,
    // The sender holds the secret; `introduction` is what it says.
    kAuthentic,
  };
  Verdict verdict = Verdict::kMalformed;
  // Parsed for every verdict but kMalformed.
  Introduction introduction;
};

// Checks `bytes` (what a peer sent first) against this node's key prefix and
// secret; the MAC is compared in constant time.
ReceivedIntroduction ReadIntroduction(std::string_view bytes,
                                      std::string_view key_prefix,
                                      std::string_view secret);

// The kIntroductionReplyBytes an accepting node of rank `acceptor_rank`
// sends once it has verified the introduction of link `link_id`. INTERNAL
// only when libcrypto fails to compute the MAC.
absl::StatusOr<std::string> EncodeIntroductionReply(std::string_view key_prefix,
                                                    int32_t acceptor_rank,
                                                    uint64_t link_id,
                                                    std::string_view secret);

// True when `bytes` is the reply the node of rank `acceptor_rank` owes for
// link `link_id` under this node's key prefix and secret (constant-time
// compare).
bool VerifyIntroductionReply(std::string_view bytes,
                             std::string_view key_prefix, int32_t acceptor_rank,
                             uint64_t link_id, std::string_view secret);

}  // namespace baton::agent::tcp
