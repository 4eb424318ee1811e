// What an agent reads from a peer before any data crosses: the data-plane
// introduction and its reply (agent/transport/tcp/tcp_introduction.h), under a
// fixed key prefix and secret, and a peer's publication in the rendezvous
// store (agent/transport/tcp/tcp_publication.h). The first byte picks which:
//
//   0: the rest is an introduction as an accepting node reads it;
//   1: 4 bytes of acceptor rank and 8 of link id, then a reply as the
//      connecting node checks it;
//   2: the rest is a publication;
//   3: an introduction (rank, link id), a key prefix and a secret from the
//      input, encoded and read back, then with one byte changed.
//
// Invariants: only bytes the encoder makes under this secret verify (an
// authentic introduction or reply is byte for byte the one the encoder
// makes); a parsed publication, written back, parses to the same thing; a
// round trip is authentic and any changed byte is not.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/transport/tcp/tcp_introduction.h"
#include "agent/transport/tcp/tcp_link.h"
#include "agent/transport/tcp/tcp_publication.h"
#include "tests/fuzz/fuzz_input.h"

namespace baton::agent::tcp {
namespace {

using fuzz::FuzzInput;
using Verdict = ReceivedIntroduction::Verdict;

constexpr char kPrefix[] = "baton/j0/1/negotiation";
// The fixed secret: bytes 1..32 (tests/fuzz/make_corpus.py signs with it).
std::string Secret() {
  std::string secret;
  for (int i = 1; i <= 32; ++i) secret.push_back(static_cast<char>(i));
  return secret;
}

[[noreturn]] void Broken(const std::string& what) {
  fuzz::Broken("introduction_fuzz", what);
}

void ReadAsAcceptor(const std::string& bytes) {
  const ReceivedIntroduction got = ReadIntroduction(bytes, kPrefix, Secret());
  if (got.verdict == Verdict::kMalformed) return;
  if (got.verdict != Verdict::kOtherPrefix &&
      got.introduction.prefix_hash != PrefixHash(kPrefix)) {
    Broken("an introduction for another prefix was not told apart");
  }
  if (got.verdict != Verdict::kAuthentic) return;
  absl::StatusOr<std::string> encoded =
      EncodeIntroduction(got.introduction, kPrefix, Secret());
  if (!encoded.ok() || *encoded != bytes) {
    Broken(absl::StrCat("an introduction of rank ", got.introduction.rank,
                        " verified but is not the one the encoder makes"));
  }
}

void ReadAsConnector(FuzzInput& in) {
  const auto rank = static_cast<int32_t>(in.Int(4));
  const auto link_id = static_cast<uint64_t>(in.Int(8));
  const std::string bytes = in.Rest();
  if (!VerifyIntroductionReply(bytes, kPrefix, rank, link_id, Secret())) {
    return;
  }
  absl::StatusOr<std::string> encoded =
      EncodeIntroductionReply(kPrefix, rank, link_id, Secret());
  if (!encoded.ok() || *encoded != bytes) {
    Broken("a reply verified but is not the one the encoder makes");
  }
}

void ReadPublication(const std::string& text) {
  absl::StatusOr<Published> parsed = ParsePublication(text, "negotiation");
  if (!parsed.ok()) return;
  std::vector<Link> kept;
  for (const auto& [id, sent] : parsed->kept) {
    Link link;
    link.id = id;
    link.sent = sent;
    kept.push_back(link);
  }
  const std::string written = Publication(parsed->host, parsed->port, kept);
  absl::StatusOr<Published> again = ParsePublication(written, "negotiation");
  if (!again.ok() || again->host != parsed->host ||
      again->port != parsed->port || again->kept != parsed->kept) {
    Broken(absl::StrCat("publication \"", text, "\" written back as \"",
                        written, "\" does not parse the same"));
  }
}

void RoundTrip(FuzzInput& in) {
  Introduction introduction;
  introduction.rank = static_cast<int32_t>(in.Int(4));
  introduction.link_id = static_cast<uint64_t>(in.Int(8));
  const std::string prefix = in.String(64);
  const std::string secret = in.String(64);
  introduction.prefix_hash = PrefixHash(prefix);
  absl::StatusOr<std::string> bytes =
      EncodeIntroduction(introduction, prefix, secret);
  if (!bytes.ok() || bytes->size() != kIntroductionBytes) {
    Broken("EncodeIntroduction failed or has the wrong size");
  }
  const ReceivedIntroduction got = ReadIntroduction(*bytes, prefix, secret);
  if (got.verdict != Verdict::kAuthentic ||
      got.introduction.rank != introduction.rank ||
      got.introduction.link_id != introduction.link_id) {
    Broken("an encoded introduction does not read back as authentic");
  }
  std::string changed = *bytes;
  const size_t at = in.Below(kIntroductionBytes);
  changed[at] = static_cast<char>(changed[at] ^ (1 | in.Byte()));
  if (ReadIntroduction(changed, prefix, secret).verdict ==
      Verdict::kAuthentic) {
    Broken(absl::StrCat("an introduction with byte ", at,
                        " changed still verifies"));
  }
  absl::StatusOr<std::string> reply = EncodeIntroductionReply(
      prefix, introduction.rank, introduction.link_id, secret);
  if (!reply.ok() ||
      !VerifyIntroductionReply(*reply, prefix, introduction.rank,
                               introduction.link_id, secret) ||
      VerifyIntroductionReply(*reply, prefix, introduction.rank ^ 1,
                              introduction.link_id, secret)) {
    Broken("a reply does not verify for its rank only");
  }
}

}  // namespace
}  // namespace baton::agent::tcp

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  baton::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::fuzz::FuzzInput in(data, size);
  switch (in.Below(4)) {
    case 0:
      baton::agent::tcp::ReadAsAcceptor(in.Rest());
      break;
    case 1:
      baton::agent::tcp::ReadAsConnector(in);
      break;
    case 2:
      baton::agent::tcp::ReadPublication(in.Rest());
      break;
    default:
      baton::agent::tcp::RoundTrip(in);
      break;
  }
  return 0;
}
