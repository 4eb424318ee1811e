#include "agent/transport/tcp/tcp_publication.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace baton::agent::tcp {

std::string Publication(const std::string& host, int port,
                        const std::vector<Link>& kept) {
  std::string text = absl::StrCat(host, " ", port);
  for (const Link& link : kept) {
    absl::StrAppend(&text, " ", absl::Hex(link.id), ":", link.sent);
  }
  return text;
}

absl::StatusOr<Published> ParsePublication(const std::string& text,
                                           const std::string& kind) {
  const std::vector<std::string> parts = absl::StrSplit(text, ' ');
  Published published;
  bool valid = parts.size() >= 2 && !parts[0].empty() &&
               absl::SimpleAtoi(parts[1], &published.port) &&
               published.port > 0 && published.port <= 65535;
  if (valid) published.host = parts[0];
  for (size_t i = 2; valid && i < parts.size(); ++i) {
    const std::vector<std::string> link = absl::StrSplit(parts[i], ':');
    uint64_t id = 0;
    uint64_t sent = 0;
    valid = link.size() == 2 && absl::SimpleHexAtoi(link[0], &id) && id != 0 &&
            absl::SimpleAtoi(link[1], &sent) &&
            published.kept.emplace(id, sent).second;
  }
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "published ", kind, " address \"", text,
        "\" is not \"<host> <port>\" followed by \"<link id>:<bytes sent>\" "
        "pairs (the nodes must run one build of baton)"));
  }
  return published;
}

}  // namespace baton::agent::tcp
