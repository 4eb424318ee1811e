#include "common/membership_view.h"

#include "absl/strings/str_cat.h"

namespace baton {

void CompleteMembership(v1::Membership* membership) {
  membership->set_num_nodes(membership->nodes_size());
  membership->clear_local_sizes();
  v1::LocalSizeRun* run = nullptr;
  for (const v1::NodeInfo& node : membership->nodes()) {
    if (run == nullptr || run->local_size() != node.local_size()) {
      run = membership->add_local_sizes();
      run->set_local_size(node.local_size());
    }
    run->set_nodes(run->nodes() + 1);
  }
}

v1::Membership MembershipView(const v1::Membership& full, int32_t node_rank) {
  v1::Membership view;
  view.set_job(full.job());
  view.set_generation(full.generation());
  view.set_world_size(full.world_size());
  view.set_store_prefix(full.store_prefix());
  view.set_data_plane_secret(full.data_plane_secret());
  view.set_sealed_unix_ms(full.sealed_unix_ms());
  view.set_num_nodes(full.num_nodes());
  *view.mutable_local_sizes() = full.local_sizes();
  *view.mutable_self() = full.nodes(node_rank);
  if (node_rank < kMembershipKeepers) *view.mutable_nodes() = full.nodes();
  return view;
}

std::optional<RankPlace> NodeOfRank(const v1::Membership& membership,
                                    int32_t rank) {
  if (rank < 0) return std::nullopt;
  RankPlace place;
  for (const v1::LocalSizeRun& run : membership.local_sizes()) {
    const int64_t ranks = int64_t{run.nodes()} * run.local_size();
    if (run.local_size() > 0 && rank < place.rank_offset + ranks) {
      const int32_t within = (rank - place.rank_offset) / run.local_size();
      place.node_rank += within;
      place.rank_offset += within * run.local_size();
      place.local_size = run.local_size();
      return place;
    }
    place.node_rank += run.nodes();
    place.rank_offset += static_cast<int32_t>(ranks);
  }
  return std::nullopt;
}

absl::Status ValidateMembershipView(absl::string_view what,
                                    const v1::Membership& membership,
                                    int32_t max_nodes) {
  const int32_t num_nodes = membership.num_nodes();
  if (num_nodes < 1 || num_nodes > max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".num_nodes is ", num_nodes, ": it must be 1..", max_nodes,
        " (agent and coordinator must run one build "
        "of baton)"));
  }
  int64_t nodes = 0;
  int64_t ranks = 0;
  for (int i = 0; i < membership.local_sizes_size(); ++i) {
    const v1::LocalSizeRun& run = membership.local_sizes(i);
    if (run.nodes() < 1 || run.local_size() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ".local_sizes[", i, "] is ", run.nodes(), " nodes of ",
          run.local_size(), " trainers: both must be at least 1"));
    }
    nodes += run.nodes();
    ranks += int64_t{run.nodes()} * run.local_size();
  }
  if (nodes != num_nodes || ranks != membership.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".local_sizes cover ", nodes, " nodes and ", ranks,
                     " ranks; num_nodes is ", num_nodes, " and world_size ",
                     membership.world_size(),
                     ": report the membership exactly as it was "
                     "sealed"));
  }
  const v1::NodeInfo& self = membership.self();
  const std::optional<RankPlace> place =
      NodeOfRank(membership, self.rank_offset());
  if (self.node_rank() < 0 || self.node_rank() >= num_nodes || !place ||
      place->node_rank != self.node_rank() ||
      place->rank_offset != self.rank_offset() ||
      place->local_size != self.local_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".self has node_rank ", self.node_rank(), ", rank_offset ",
        self.rank_offset(), " and local_size ", self.local_size(),
        ", which local_sizes do not place there: report the membership "
        "exactly as it was sealed"));
  }
  if (membership.nodes().empty()) return absl::OkStatus();
  if (membership.nodes_size() != num_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " lists ", membership.nodes_size(),
                     " nodes; num_nodes is ", num_nodes));
  }
  // The runs, walked beside the table (validated above: they cover it).
  int run = 0;
  int32_t left_in_run = membership.local_sizes(0).nodes();
  int32_t offset = 0;
  for (int i = 0; i < membership.nodes_size(); ++i) {
    if (left_in_run == 0) left_in_run = membership.local_sizes(++run).nodes();
    --left_in_run;
    const v1::NodeInfo& node = membership.nodes(i);
    if (node.node_rank() != i || node.rank_offset() != offset ||
        node.local_size() != membership.local_sizes(run).local_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".nodes[", i, "] has node_rank ", node.node_rank(),
                       ", rank_offset ", node.rank_offset(), " and local_size ",
                       node.local_size(),
                       ", which do not follow from local_sizes: "
                       "report the membership exactly as it was sealed"));
    }
    offset += node.local_size();
  }
  const v1::NodeInfo& listed = membership.nodes(self.node_rank());
  if (listed.node_name() != self.node_name() ||
      listed.data_address() != self.data_address()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".self names node \"", self.node_name(), "\" but nodes[",
        self.node_rank(), "] is \"", listed.node_name(), "\""));
  }
  return absl::OkStatus();
}

}  // namespace baton
