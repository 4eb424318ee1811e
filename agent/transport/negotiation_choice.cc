#include "agent/transport/negotiation_choice.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/transport/transport.h"
#include "glog/logging.h"

namespace baton::agent {

NegotiationChoice NegotiationChoice::Resolve(int num_nodes) const {
  NegotiationChoice resolved = *this;
  if (wire == Wire::kAuto) {
    resolved.wire = num_nodes <= kAllToAllUpTo ? Wire::kAllToAll : Wire::kTree;
  }
  return resolved;
}

const char* NegotiationChoice::WireName(Wire wire) {
  switch (wire) {
    case Wire::kAuto:
      return "auto";
    case Wire::kAllToAll:
      return "all_to_all";
    case Wire::kTree:
      return "tree";
  }
  return "unknown";
}

absl::StatusOr<NegotiationChoice::Wire> NegotiationChoice::ParseWire(
    const std::string& name) {
  for (const Wire wire : {Wire::kAuto, Wire::kAllToAll, Wire::kTree}) {
    if (name == WireName(wire)) return wire;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--negotiation=", name, ": expected auto, all_to_all or tree"));
}

std::string NegotiationChoice::Publication() const {
  if (wire == Wire::kTree) return absl::StrCat("tree ", fanout);
  return WireName(wire);
}

absl::StatusOr<NegotiationChoice> NegotiationChoice::FromPublication(
    const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ' ');
  NegotiationChoice choice;
  if (parts.size() == 1 && parts[0] == WireName(Wire::kAllToAll)) {
    choice.wire = Wire::kAllToAll;
    return choice;
  }
  if (parts.size() == 2 && parts[0] == WireName(Wire::kTree) &&
      absl::SimpleAtoi(parts[1], &choice.fanout) && choice.fanout >= 2 &&
      choice.fanout <= kMaxFanout) {
    choice.wire = Wire::kTree;
    return choice;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text,
                   "\" is not a negotiation wire: expected \"all_to_all\" or "
                   "\"tree <fanout 2..",
                   kMaxFanout, ">\""));
}

absl::StatusOr<NegotiationChoice> AgreeOnNegotiation(
    const ConnectRequest& request) {
  const NegotiationChoice mine = request.negotiation.Resolve(request.num_nodes);
  absl::StatusOr<std::string> published =
      NodeRankZeroValue(request, "negotiation", mine.Publication());
  if (!published.ok()) return published.status();
  absl::StatusOr<NegotiationChoice> theirs =
      NegotiationChoice::FromPublication(*published);
  if (!theirs.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node rank 0 published its negotiation wire under \"",
                     StoreKey(request.prefix, "negotiation"),
                     "\": ", theirs.status().message()));
  }
  if (*theirs != mine) {
    LOG(WARNING) << "negotiation of " << request.num_nodes
                 << " nodes (node rank " << request.node_rank
                 << "): using node rank 0's \"" << theirs->Publication()
                 << "\" instead of this node's \"" << mine.Publication()
                 << "\" (--negotiation, --negotiation_fanout)";
  }
  return theirs;
}

}  // namespace baton::agent
