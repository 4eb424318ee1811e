#include "coordinator/timeline_collector.h"

#include <algorithm>
#include <utility>

namespace baton::coordinator {

uint64_t TimelineCollector::Start(const v1::GetTimelineRequest& request,
                                  const std::vector<Node>& nodes,
                                  absl::Time deadline, Done done) {
  const uint64_t id = next_id_++;
  Pending& p = pending_[id];
  p.timeline.set_job(request.job());
  p.timeline.set_first_step(request.first_step());
  p.timeline.set_last_step(request.last_step());
  p.deadline = deadline;
  p.done = std::move(done);
  for (const Node& node : nodes) {
    if (!node.connected) {
      p.timeline.add_missing_nodes(node.name);
      continue;
    }
    v1::NodeTimeline* entry = p.timeline.add_nodes();
    entry->set_node_name(node.name);
    entry->set_node_rank(node.node_rank);
    p.waiting[node.name] = p.timeline.nodes_size() - 1;
  }
  MaybeFinish(id);
  return id;
}

void TimelineCollector::OnReply(const std::string& node_name,
                                const v1::TimelineReply& reply) {
  auto it = pending_.find(reply.request_id());
  if (it == pending_.end()) return;
  Pending& p = it->second;
  auto node = p.waiting.find(node_name);
  if (node == p.waiting.end()) return;
  v1::NodeTimeline* entry = p.timeline.mutable_nodes(node->second);
  for (const v1::PartitionTrace& trace : reply.partitions()) {
    if (trace.step() < p.timeline.first_step() ||
        trace.step() > p.timeline.last_step()) {
      continue;  // an agent sends only what was asked; keep the contract
    }
    *entry->add_partitions() = trace;
  }
  std::stable_sort(
      entry->mutable_partitions()->begin(), entry->mutable_partitions()->end(),
      [](const v1::PartitionTrace& a, const v1::PartitionTrace& b) {
        return std::make_pair(a.generation(), a.launch_seq()) <
               std::make_pair(b.generation(), b.launch_seq());
      });
  entry->set_truncated(reply.truncated());
  p.waiting.erase(node);
  MaybeFinish(reply.request_id());
}

void TimelineCollector::Tick(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, p] : pending_) {
    if (now >= p.deadline) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    Pending& p = pending_[id];
    // Nodes that did not answer move from `nodes` to `missing_nodes`.
    v1::Timeline answered;
    answered.set_job(p.timeline.job());
    answered.set_first_step(p.timeline.first_step());
    answered.set_last_step(p.timeline.last_step());
    *answered.mutable_missing_nodes() = p.timeline.missing_nodes();
    for (const v1::NodeTimeline& node : p.timeline.nodes()) {
      if (p.waiting.contains(node.node_name())) {
        answered.add_missing_nodes(node.node_name());
      } else {
        *answered.add_nodes() = node;
      }
    }
    p.timeline = std::move(answered);
    p.waiting.clear();
    MaybeFinish(id);
  }
}

void TimelineCollector::Abort(const absl::Status& status) {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending) p.done(status);
}

void TimelineCollector::MaybeFinish(uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end() || !it->second.waiting.empty()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  p.done(std::move(p.timeline));
}

}  // namespace baton::coordinator
