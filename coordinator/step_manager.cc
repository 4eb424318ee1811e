#include "coordinator/step_manager.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace baton::coordinator {
namespace {

using StallKey = std::pair<uint32_t, int64_t>;  // (tensor_id, step)

// a + b for non-negative values, saturating instead of overflowing: an agent
// may report any waiting_ms, and a bad one must not wrap to negative.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  if (a > std::numeric_limits<int64_t>::max() - b) {
    return std::numeric_limits<int64_t>::max();
  }
  return a + b;
}

// Longest waits first: they are the ones to look at.
void SortStalls(std::vector<v1::Stall>* stalls) {
  std::sort(stalls->begin(), stalls->end(),
            [](const v1::Stall& a, const v1::Stall& b) {
              if (a.waiting_ms() != b.waiting_ms()) {
                return a.waiting_ms() > b.waiting_ms();
              }
              if (a.tensor_id() != b.tensor_id()) {
                return a.tensor_id() < b.tensor_id();
              }
              return a.step() < b.step();
            });
}

// Each rank's place, for lag: the furthest step it submitted (never below
// one it completed), but one below the earliest stalled step it holds back.
// The ranks waiting for it stay where they are. The furthest place is one
// pass over the ranks.
class RankPlaces {
 public:
  // `rank_steps` and `submitted_steps` (by rank) are the job's; `stalls`
  // those in flight.
  RankPlaces(const std::vector<int64_t>& rank_steps,
             const std::vector<int64_t>& submitted_steps,
             const std::vector<v1::Stall>& stalls)
      : rank_steps_(rank_steps), submitted_steps_(submitted_steps) {
    for (const v1::Stall& stall : stalls) {
      for (int32_t rank : stall.missing_ranks()) {
        auto [it, inserted] = caps_.try_emplace(rank, stall.step() - 1);
        if (!inserted) it->second = std::min(it->second, stall.step() - 1);
      }
    }
    for (size_t rank = 0; rank < rank_steps_.size(); ++rank) {
      furthest_ = std::max(furthest_, Place(static_cast<int32_t>(rank)));
    }
  }

  // The rank's completed step, lowered below a stalled step it holds back.
  int64_t Completed(int32_t rank) const {
    return Capped(rank, rank_steps_[rank]);
  }
  // Steps behind the furthest rank.
  int64_t Lag(int32_t rank) const { return furthest_ - Place(rank); }

 private:
  int64_t Capped(int32_t rank, int64_t step) const {
    if (caps_.empty()) return step;
    auto it = caps_.find(rank);
    return it == caps_.end() ? step : std::min(step, it->second);
  }
  int64_t Place(int32_t rank) const {
    return Capped(rank, std::max(submitted_steps_[rank], rank_steps_[rank]));
  }

  const std::vector<int64_t>& rank_steps_;
  const std::vector<int64_t>& submitted_steps_;
  // A rank's cap: one below the earliest stalled step it holds back.
  absl::flat_hash_map<int32_t, int64_t> caps_;
  int64_t furthest_ = -1;
};

}  // namespace

// One job's progress in its current generation.
struct StepManager::JobSteps {
  struct Node {
    std::string name;
    int32_t rank_offset = 0;
    int32_t local_size = 0;
    // The node's latest report and when it arrived; pending waits grow by the
    // time since.
    bool has_report = false;
    v1::StepReport report;
    absl::Time received;
    // Per tensor id, the highest step this node completed (from every
    // report's latencies, not only the latest). With nothing pending for the
    // tensor, the node's ranks submitted it up to exactly this step.
    absl::flat_hash_map<uint32_t, int64_t> completed_tensor_steps;
    // Per tensor id, the highest step pending in the latest report.
    absl::flat_hash_map<uint32_t, int64_t> max_pending_steps;
  };

  // A pending (tensor, step) as seen across the nodes' latest reports.
  struct PendingGroup {
    std::vector<int32_t> submitted;
    int64_t waiting_ms = 0;
    // The nodes whose reports list it.
    absl::flat_hash_set<const Node*> reporters;
  };

  // Raises `rank` to `step` (ranks never go backwards) and keeps the cached
  // minimum and global step current.
  void RaiseRank(int32_t rank, int64_t step) {
    int64_t& current = rank_steps[rank];
    if (step <= current) return;
    const int64_t previous = current;
    current = step;
    if (previous == min_step && --ranks_at_min == 0) RecomputeMin();
  }

  // O(ranks), but only when the last rank at the minimum moved on: about
  // once per global step, not once per report.
  void RecomputeMin() {
    if (rank_steps.empty()) return;
    min_step = *std::min_element(rank_steps.begin(), rank_steps.end());
    ranks_at_min = std::count(rank_steps.begin(), rank_steps.end(), min_step);
    global_step = std::max(global_step, min_step);
  }

  // Whether `node`, which has no entry for (tensor_id, step) in its latest
  // report, is past that step of the tensor: it runs a later step of it, or
  // completed this one. Otherwise none of its ranks has submitted the step.
  static bool PastStep(const Node& node, uint32_t tensor_id, int64_t step) {
    auto pending = node.max_pending_steps.find(tensor_id);
    if (pending != node.max_pending_steps.end() && pending->second > step) {
      return true;
    }
    auto done = node.completed_tensor_steps.find(tensor_id);
    return done != node.completed_tensor_steps.end() && done->second >= step;
  }

  // Every (tensor, step) that some rank submitted, some rank has not, and
  // that has waited at least `threshold` by `now`.
  std::vector<v1::Stall> Stalls(absl::Time now, absl::Duration threshold,
                                const TensorNameFn& tensor_name) const {
    absl::flat_hash_map<StallKey, PendingGroup> groups;
    for (const Node* reporter : nodes_pending) {
      const Node& node = *reporter;
      const int64_t age_ms =
          std::max<int64_t>(0, absl::ToInt64Milliseconds(now - node.received));
      for (const v1::PendingTensor& pending : node.report.pending()) {
        // Completed by every rank: whatever the report said, it is done.
        if (pending.step() <= global_step) continue;
        PendingGroup& group = groups[{pending.tensor_id(), pending.step()}];
        // Ranks belong to exactly one node and OnReport rejected repeats, so
        // concatenation is the union.
        group.submitted.insert(group.submitted.end(),
                               pending.submitted_ranks().begin(),
                               pending.submitted_ranks().end());
        group.waiting_ms = std::max(
            group.waiting_ms, SaturatingAdd(pending.waiting_ms(), age_ms));
        group.reporters.insert(&node);
      }
    }
    std::vector<v1::Stall> stalls;
    std::vector<bool> submitted(rank_steps.size());
    for (auto& [key, group] : groups) {
      // Cheap filter first: most pending operations finish long before the
      // threshold, and finding the missing ranks is O(world size).
      if (absl::Milliseconds(group.waiting_ms) < threshold) continue;
      const auto& [tensor_id, step] = key;
      std::fill(submitted.begin(), submitted.end(), false);
      for (int32_t rank : group.submitted) submitted[rank] = true;
      v1::Stall stall;
      for (const Node* node : nodes_by_rank) {
        // A reporter's unnamed ranks have not submitted it; another node's
        // ranks have not, unless the node is already past the step.
        const bool reported = group.reporters.contains(node);
        if (!reported && PastStep(*node, tensor_id, step)) continue;
        const int missing_before = stall.missing_ranks_size();
        for (int32_t rank = node->rank_offset;
             rank < node->rank_offset + node->local_size; ++rank) {
          if (!reported || !submitted[rank]) stall.add_missing_ranks(rank);
        }
        if (stall.missing_ranks_size() > missing_before) {
          stall.add_missing_nodes(node->name);
        }
      }
      if (stall.missing_ranks().empty()) continue;
      std::sort(group.submitted.begin(), group.submitted.end());
      stall.set_tensor_id(tensor_id);
      stall.set_tensor(tensor_name(tensor_id));
      stall.set_step(step);
      stall.mutable_submitted_ranks()->Add(group.submitted.begin(),
                                           group.submitted.end());
      stall.set_waiting_ms(group.waiting_ms);
      stalls.push_back(std::move(stall));
    }
    SortStalls(&stalls);
    return stalls;
  }

  int64_t generation = 0;
  absl::flat_hash_map<std::string, Node> nodes;
  // The nodes in rank order: pointers into `nodes`, which changes only when
  // a generation is sealed.
  std::vector<const Node*> nodes_by_rank;
  // The nodes whose latest report has pending operations: the only ones
  // Stalls reads, so a status page does not walk every node.
  absl::flat_hash_set<const Node*> nodes_pending;
  // Indexed by global rank; -1 until the rank completes a step.
  std::vector<int64_t> rank_steps;
  // Indexed by global rank: the highest step it submitted any tensor of, as
  // last reported; -1 until then.
  std::vector<int64_t> submitted_steps;
  // Cached over rank_steps: the minimum and how many ranks sit at it.
  int64_t min_step = -1;
  int64_t ranks_at_min = 0;
  // Last step completed by every rank; kept across generations, never
  // lowered.
  int64_t global_step = -1;
  // Stalls TakeNewStalls already returned, so each is logged once.
  absl::flat_hash_set<StallKey> announced;
};

StepManager::StepManager(absl::Duration stall_threshold)
    : stall_threshold_(stall_threshold) {}

StepManager::~StepManager() = default;

void StepManager::OnGenerationSealed(const v1::Membership& membership) {
  std::unique_ptr<JobSteps>& job = jobs_[membership.job()];
  if (job == nullptr) job = std::make_unique<JobSteps>();
  // A repeated seal (another rejoin after a restart) must not wipe what
  // Recover seeded; an older one is stale.
  if (membership.generation() <= job->generation) return;

  job->generation = membership.generation();
  job->nodes.clear();
  job->nodes_pending.clear();
  job->announced.clear();
  // The job manager guarantees ranks within world_size; taking the largest
  // keeps a bad membership from indexing past the rank table.
  int32_t world_size = std::max(membership.world_size(), 0);
  for (const v1::NodeInfo& info : membership.nodes()) {
    DCHECK_LE(info.rank_offset() + info.local_size(), membership.world_size())
        << "node " << info.node_name() << " of job " << membership.job();
    if (info.rank_offset() < 0 || info.local_size() < 0) continue;
    JobSteps::Node& node = job->nodes[info.node_name()];
    node.name = info.node_name();
    node.rank_offset = info.rank_offset();
    node.local_size = info.local_size();
    world_size = std::max(world_size, info.rank_offset() + info.local_size());
  }
  job->nodes_by_rank.clear();
  for (const auto& [name, node] : job->nodes) {
    job->nodes_by_rank.push_back(&node);
  }
  std::sort(job->nodes_by_rank.begin(), job->nodes_by_rank.end(),
            [](const JobSteps::Node* a, const JobSteps::Node* b) {
              return a->rank_offset < b->rank_offset;
            });
  // Ranks are renumbered by a new generation, so per-rank progress starts
  // over; the global step does not.
  job->rank_steps.assign(world_size, -1);
  job->submitted_steps.assign(world_size, -1);
  job->min_step = -1;
  job->ranks_at_min = world_size;
}

absl::Status StepManager::OnReport(const std::string& node_name,
                                   const v1::StepReport& report,
                                   absl::Time now) {
  auto job_it = jobs_.find(report.job());
  if (job_it == jobs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("StepReport for job \"", report.job(),
                     "\": the job has no sealed generation yet"));
  }
  JobSteps& job = *job_it->second;
  if (report.generation() != job.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "StepReport for job \"", report.job(), "\" generation ",
        report.generation(), " does not match the current generation ",
        job.generation));
  }
  auto node_it = job.nodes.find(node_name);
  if (node_it == job.nodes.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node \"", node_name, "\" is not a member of job \"",
                     report.job(), "\" generation ", job.generation));
  }
  JobSteps::Node& node = node_it->second;
  const int32_t first = node.rank_offset;
  const int32_t last = node.rank_offset + node.local_size - 1;
  const auto rank_range = [&] {
    return absl::StrCat("node \"", node_name, "\"'s ranks ", first, "..", last);
  };

  // Validate the whole report before changing anything. `seen[r - first]`
  // holds the number of the list that last named rank r, so duplicate checks
  // cost O(report) with one table of local_size entries.
  std::vector<int> seen(node.local_size, 0);
  int list = 1;
  for (int i = 0; i < report.ranks_size(); ++i) {
    const v1::RankProgress& progress = report.ranks(i);
    if (progress.rank() < first || progress.rank() > last) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepReport.ranks[", i, "].rank ", progress.rank(),
                       " is not one of ", rank_range()));
    }
    if (progress.completed_step() < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepReport.ranks[", i, "].completed_step is ",
                       progress.completed_step(), " for rank ", progress.rank(),
                       "; it must be -1 (no step completed) or more"));
    }
    if (progress.submitted_step() < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepReport.ranks[", i, "].submitted_step is ",
                       progress.submitted_step(), " for rank ", progress.rank(),
                       "; it must be -1 (nothing submitted) or more"));
    }
    if (seen[progress.rank() - first] == list) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StepReport.ranks names rank ", progress.rank(), " twice"));
    }
    seen[progress.rank() - first] = list;
  }
  const auto& latencies = report.stats().tensor_latencies();
  for (int i = 0; i < latencies.size(); ++i) {
    if (latencies[i].last_step() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StepReport.stats.tensor_latencies[", i, "] (tensor ",
          latencies[i].tensor_id(), ") has last_step ",
          latencies[i].last_step(), "; a completed step is 0 or more"));
    }
  }
  for (int i = 0; i < report.pending_size(); ++i) {
    const v1::PendingTensor& pending = report.pending(i);
    ++list;
    const std::string what = absl::StrCat(
        "StepReport.pending[", i, "] (tensor ", pending.tensor_id(), ")");
    if (pending.step() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has step ", pending.step(), "; steps start at 0"));
    }
    if (pending.waiting_ms() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has waiting_ms ", pending.waiting_ms(), "; it must be >= 0"));
    }
    for (int32_t rank : pending.submitted_ranks()) {
      if (rank < first || rank > last) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " names submitted rank ", rank,
                         ", which is not one of ", rank_range()));
      }
      if (seen[rank - first] == list) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " names submitted rank ", rank, " twice"));
      }
      seen[rank - first] = list;
    }
  }

  for (const v1::RankProgress& progress : report.ranks()) {
    job.RaiseRank(progress.rank(), progress.completed_step());
    // Not raised only: a failed step is submitted again.
    job.submitted_steps[progress.rank()] = progress.submitted_step();
  }
  for (const v1::TensorLatency& latency : latencies) {
    int64_t& done = node.completed_tensor_steps[latency.tensor_id()];
    done = std::max(done, latency.last_step());
  }
  node.max_pending_steps.clear();
  for (const v1::PendingTensor& pending : report.pending()) {
    auto [it, inserted] =
        node.max_pending_steps.try_emplace(pending.tensor_id(), pending.step());
    if (!inserted) it->second = std::max(it->second, pending.step());
  }
  if (report.pending().empty()) {
    job.nodes_pending.erase(&node);
  } else {
    job.nodes_pending.insert(&node);
  }
  node.has_report = true;
  node.report = report;
  node.received = now;
  return absl::OkStatus();
}

void StepManager::Recover(const std::string& job_name,
                          const std::string& node_name,
                          int64_t completed_step) {
  auto job_it = jobs_.find(job_name);
  if (job_it == jobs_.end()) return;
  JobSteps& job = *job_it->second;
  auto node_it = job.nodes.find(node_name);
  if (node_it == job.nodes.end()) return;
  const JobSteps::Node& node = node_it->second;
  for (int32_t rank = node.rank_offset;
       rank < node.rank_offset + node.local_size; ++rank) {
    job.RaiseRank(rank, completed_step);
    job.submitted_steps[rank] =
        std::max(job.submitted_steps[rank], completed_step);
  }
}

std::vector<v1::Stall> StepManager::TakeNewStalls(
    const std::string& job_name, absl::Time now,
    const TensorNameFn& tensor_name) {
  auto job_it = jobs_.find(job_name);
  if (job_it == jobs_.end()) return {};
  JobSteps& job = *job_it->second;
  // Stalls of completed steps can never come back; forget them so the set
  // stays as small as the stalls in flight.
  absl::erase_if(job.announced, [&](const StallKey& key) {
    return key.second <= job.global_step;
  });
  std::vector<v1::Stall> fresh;
  for (v1::Stall& stall : job.Stalls(now, stall_threshold_, tensor_name)) {
    if (job.announced.insert({stall.tensor_id(), stall.step()}).second) {
      fresh.push_back(std::move(stall));
    }
  }
  return fresh;
}

int64_t StepManager::GlobalStep(const std::string& job_name) const {
  auto job_it = jobs_.find(job_name);
  return job_it == jobs_.end() ? -1 : job_it->second->global_step;
}

void StepManager::FillStatus(const std::string& job_name, absl::Time now,
                             const TensorNameFn& tensor_name,
                             v1::JobStatus* status) const {
  auto job_it = jobs_.find(job_name);
  if (job_it == jobs_.end()) {
    status->set_global_step(-1);
    return;
  }
  const JobSteps& job = *job_it->second;
  status->set_global_step(job.global_step);
  std::vector<v1::Stall> stalls =
      job.Stalls(now, stall_threshold_, tensor_name);
  const RankPlaces places(job.rank_steps, job.submitted_steps, stalls);
  for (v1::Stall& stall : stalls) *status->add_stalls() = std::move(stall);
  // Only the page's members are filled.
  for (v1::MemberStatus& member : *status->mutable_members()) {
    auto node_it = job.nodes.find(member.node_name());
    if (node_it == job.nodes.end()) continue;
    const JobSteps::Node& node = node_it->second;
    member.clear_ranks();
    for (int32_t rank = node.rank_offset;
         rank < node.rank_offset + node.local_size; ++rank) {
      v1::RankStatus* rank_status = member.add_ranks();
      rank_status->set_rank(rank);
      rank_status->set_completed_step(places.Completed(rank));
      rank_status->set_lag(places.Lag(rank));
    }
    if (node.has_report) {
      const v1::AgentStats& stats = node.report.stats();
      member.set_throughput_bytes_per_second(
          stats.throughput_bytes_per_second());
      member.set_queue_depth(stats.queue_depth());
      member.set_bytes_in_flight(stats.bytes_in_flight());
      *member.mutable_tensor_latencies() = stats.tensor_latencies();
      member.set_scheduling(stats.scheduling());
      member.set_credit_bytes(stats.credit_bytes());
      member.set_partition_bytes(stats.partition_bytes());
      member.set_partition_tuned(stats.partition_tuned());
      member.set_credit_tuned(stats.credit_tuned());
    }
  }
}

std::vector<int64_t> StepManager::RankLags(
    const std::string& job_name, absl::Time now,
    const TensorNameFn& tensor_name) const {
  auto job_it = jobs_.find(job_name);
  if (job_it == jobs_.end()) return {};
  const JobSteps& job = *job_it->second;
  const RankPlaces places(job.rank_steps, job.submitted_steps,
                          job.Stalls(now, stall_threshold_, tensor_name));
  std::vector<int64_t> lags(job.rank_steps.size());
  for (size_t rank = 0; rank < lags.size(); ++rank) {
    lags[rank] = places.Lag(static_cast<int32_t>(rank));
  }
  return lags;
}

absl::flat_hash_map<uint32_t, StepManager::TensorLatencySum>
StepManager::TensorLatencies(const std::string& job_name) const {
  absl::flat_hash_map<uint32_t, TensorLatencySum> sums;
  auto job_it = jobs_.find(job_name);
  if (job_it == jobs_.end()) return sums;
  for (const auto& [name, node] : job_it->second->nodes) {
    if (!node.has_report) continue;
    for (const v1::TensorLatency& l : node.report.stats().tensor_latencies()) {
      TensorLatencySum& sum = sums[l.tensor_id()];
      sum.count += l.count();
      sum.total_us += l.mean_us() * l.count();
      sum.max_us = std::max(sum.max_us, l.max_us());
    }
  }
  return sums;
}

void StepManager::RemoveJob(const std::string& job) { jobs_.erase(job); }

}  // namespace baton::coordinator
