#include "coordinator/tensor_plan_manager.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/tensor_spec.h"

namespace baton::coordinator {
namespace {

// Longest rank or node list spelled out in a message; the proto keeps all.
constexpr size_t kMaxListed = 8;

int64_t NumPartitions(int64_t size_bytes, int64_t partition_bytes) {
  return std::max<int64_t>(
      1, (size_bytes + partition_bytes - 1) / partition_bytes);
}

std::string ValueText(const v1::MismatchValue& value) {
  if (value.nodes().empty()) return value.value();
  const int listed = std::min<int>(value.nodes_size(), kMaxListed);
  std::string nodes = absl::StrJoin(value.nodes().begin(),
                                    value.nodes().begin() + listed, ", ");
  if (listed < value.nodes_size()) {
    absl::StrAppend(&nodes, " and ", value.nodes_size() - listed, " more");
  }
  return absl::StrCat(
      value.value(), " on ranks ", RanksText(value.ranks(), kMaxListed),
      value.nodes_size() == 1 ? " (node " : " (nodes ", nodes, ")");
}

// With a plan entry (`planned` is its value) the message lists only the
// declarations that differ from it: those are the ones to fix.
std::string MismatchMessage(const v1::TensorMismatch& mismatch,
                            const std::string* planned) {
  std::string message =
      absl::StrCat("tensor \"", mismatch.tensor(), "\" ",
                   mismatch.version() == 0
                       ? ""
                       : absl::StrCat("(version ", mismatch.version(), ") "));
  if (planned != nullptr) {
    absl::StrAppend(&message, "is planned with ", mismatch.field(), " ",
                    *planned, " but has ");
  } else {
    absl::StrAppend(&message, "has ", mismatch.field(), " ");
  }
  int listed = 0;
  for (const v1::MismatchValue& value : mismatch.values()) {
    if (value.nodes().empty() || (planned && value.value() == *planned)) {
      continue;
    }
    if (listed > 0) message += listed == 1 && !planned ? " but " : " and ";
    message += ValueText(value);
    ++listed;
  }
  message += planned ? ": a planned tensor keeps its spec for the life of the "
                       "job; declare it as planned"
                     : ": declare it identically on every rank";
  return message;
}

bool SameEntry(const v1::TensorPlanEntry& a, const v1::TensorPlanEntry& b) {
  return a.tensor_id() == b.tensor_id() && SameSpec(a.spec(), b.spec()) &&
         a.priority() == b.priority() && a.size_bytes() == b.size_bytes() &&
         a.num_partitions() == b.num_partitions();
}

std::string DescribeEntry(const v1::TensorPlanEntry& entry) {
  return absl::StrCat("tensor_id ", entry.tensor_id(), " ",
                      DescribeSpec(entry.spec()), " priority ",
                      entry.priority(), ", ", entry.size_bytes(), " bytes in ",
                      entry.num_partitions(), " partitions");
}

}  // namespace

struct TensorPlanManager::JobPlans {
  // One node of the generation's manifest tree. Every node's manifest is the
  // path from the root (prefixes[0]) to the prefix it ends at, so nodes that
  // declare the same tensors in the same order share one path: 5000 nodes
  // declaring 100k tensors keep 100k specs, not 500M.
  struct Prefix {
    v1::TensorSpec spec;  // the manifest's last entry; unset at the root
    int parent = 0;
    // An ancestor picked so that walking up to any depth takes O(log depth)
    // steps (Myers' skew-binary jump pointers).
    int jump = 0;
    int depth = 0;  // entries in this prefix
    std::vector<int> children;
  };

  // A tensor (name and version) declared in the current generation.
  struct DeclaredName {
    // Prefixes ending in this name (one per distinct path to it); the first
    // is the first declaration, the one later ones are compared with.
    std::vector<int> declarations;
    int nodes = 0;         // nodes that declared it
    uint8_t reported = 0;  // SpecFields already reported as mismatches
    // Set once nodes disagree on it: the tensor is retired, never planned in
    // this generation; holds the first mismatch reported, for nodes that
    // declare it later.
    std::optional<v1::TensorMismatch> retired;
  };

  // For the life of the job.
  int64_t partition_bytes = 0;
  std::optional<v1::TensorPlan> plan;
  // TensorKey (name and version) -> index in plan.
  absl::flat_hash_map<std::string, int> planned;
  absl::flat_hash_map<uint32_t, int> planned_ids;  // tensor_id -> index
  uint32_t next_id = 0;

  // For the current generation only; StartGeneration resets them.
  v1::Membership membership;
  absl::flat_hash_map<std::string, int> node_index;  // into membership.nodes
  std::vector<int> node_end;  // per node: the prefix its manifest ends at
  // Per node: names it declared that were not planned at the time. All of
  // them but the planned_in_generation since planned are still unplanned.
  std::vector<int> node_unplanned;
  int planned_in_generation = 0;
  std::vector<Prefix> prefixes;
  absl::flat_hash_map<std::string, DeclaredName> names;  // by TensorKey
  // TensorKeys declared by every node, not planned.
  std::vector<std::string> ready;
  std::vector<v1::TensorMismatchStatus> mismatches;

  void StartGeneration(const v1::Membership& sealed) {
    membership = sealed;
    node_index.clear();
    for (int i = 0; i < membership.nodes_size(); ++i) {
      node_index[membership.nodes(i).node_name()] = i;
    }
    node_end.assign(membership.nodes_size(), 0);
    node_unplanned.assign(membership.nodes_size(), 0);
    planned_in_generation = 0;
    prefixes.assign(1, Prefix());
    names.clear();
    ready.clear();
    // The old members' declarations are gone; the new members redeclare and
    // any disagreement that remains is found and reported again.
    mismatches.clear();
    if (plan) plan->set_generation(membership.generation());
  }

  // The prefix `spec` appended to prefix `at`; `created` says it is new.
  int Extend(int at, const v1::TensorSpec& spec, bool* created) {
    for (int child : prefixes[at].children) {
      if (SameSpec(prefixes[child].spec, spec)) {
        *created = false;
        return child;
      }
    }
    Prefix next;
    next.spec = spec;
    next.parent = at;
    next.depth = prefixes[at].depth + 1;
    const int jump = prefixes[at].jump;
    const int jump2 = prefixes[jump].jump;
    next.jump = prefixes[at].depth - prefixes[jump].depth ==
                        prefixes[jump].depth - prefixes[jump2].depth
                    ? jump2
                    : at;
    prefixes.push_back(std::move(next));
    prefixes[at].children.push_back(static_cast<int>(prefixes.size()) - 1);
    *created = true;
    return static_cast<int>(prefixes.size()) - 1;
  }

  int Ancestor(int at, int depth) const {
    while (prefixes[at].depth > depth) {
      const int jump = prefixes[at].jump;
      at = prefixes[jump].depth >= depth ? jump : prefixes[at].parent;
    }
    return at;
  }

  // The position of tensor `key` in `node`'s manifest: among its entries
  // recorded before, or in `added` (this manifest's new ones); -1 if none.
  int PositionOf(const std::string& key, int node,
                 const absl::flat_hash_map<std::string, int>& added) const {
    const auto declared = names.find(key);
    if (declared != names.end()) {
      const int prefix = DeclarationOf(declared->second, node);
      if (prefix >= 0) return prefixes[prefix].depth - 1;
    }
    const auto found = added.find(key);
    return found == added.end() ? -1 : found->second;
  }

  // The prefix ending in `name` on `node`'s manifest, or -1.
  int DeclarationOf(const DeclaredName& name, int node) const {
    const int end = node_end[node];
    for (int declaration : name.declarations) {
      if (Ancestor(end, prefixes[declaration].depth) == declaration) {
        return declaration;
      }
    }
    return -1;
  }

  // Checks the declaration at `prefix` against the name's first declaration
  // and its plan entry; reports every field that differs for the first time.
  void FindMismatches(int prefix, std::vector<v1::TensorMismatch>* found) {
    const v1::TensorSpec& spec = prefixes[prefix].spec;
    const std::string key = TensorKey(spec);
    DeclaredName& name = names.at(key);
    uint8_t fields = DiffSpecFields(spec, prefixes[name.declarations[0]].spec);
    const auto entry = planned.find(key);
    const v1::TensorSpec* planned_spec =
        entry == planned.end() ? nullptr : &plan->tensors(entry->second).spec();
    if (planned_spec != nullptr) fields |= DiffSpecFields(spec, *planned_spec);
    fields &= ~name.reported;
    name.reported |= fields;
    for (SpecField field : kSpecFields) {
      if ((fields & field) == 0) continue;
      v1::TensorMismatch mismatch;
      mismatch.set_tensor(spec.name());
      mismatch.set_version(spec.version());
      mismatch.set_field(SpecFieldName(field));
      // The plan's value first (it is what everyone must match), then the
      // declared values in the order of the lowest node rank holding them.
      const std::string planned_text =
          planned_spec ? SpecFieldText(*planned_spec, field) : "";
      if (planned_spec != nullptr) {
        mismatch.add_values()->set_value(
            absl::StrCat(planned_text, " (planned)"));
      }
      absl::flat_hash_map<std::string, v1::MismatchValue*> values;
      for (int node = 0; node < membership.nodes_size(); ++node) {
        const int declaration = DeclarationOf(name, node);
        if (declaration < 0) continue;
        const std::string text =
            SpecFieldText(prefixes[declaration].spec, field);
        v1::MismatchValue*& value = values[text];
        if (value == nullptr) {
          value = mismatch.add_values();
          value->set_value(text);
        }
        const v1::NodeInfo& info = membership.nodes(node);
        for (int rank = 0; rank < info.local_size(); ++rank) {
          value->add_ranks(info.rank_offset() + rank);
        }
        value->add_nodes(info.node_name());
      }
      for (v1::MismatchValue& value : *mismatch.mutable_values()) {
        std::sort(value.mutable_ranks()->begin(), value.mutable_ranks()->end());
      }
      v1::TensorMismatchStatus& status = mismatches.emplace_back();
      status.set_tensor(TensorLabel(spec));
      status.set_field(mismatch.field());
      status.set_message(MismatchMessage(
          mismatch, planned_spec != nullptr ? &planned_text : nullptr));
      if (!name.retired) name.retired = mismatch;
      found->push_back(std::move(mismatch));
    }
  }

  // Appends the ready names to the plan as a new version.
  v1::TensorPlan ExtendPlan(int64_t global_step) {
    v1::TensorPlan next = plan ? *plan : v1::TensorPlan();
    next.set_job(membership.job());
    next.set_generation(membership.generation());
    next.set_version(next.version() + 1);
    // Version 1 is in force before any step ran. Later versions only add
    // entries, so they may be used from the next step on.
    next.set_effective_step(plan ? global_step + 1 : 0);
    next.set_partition_bytes(partition_bytes);
    std::vector<std::pair<int, const DeclaredName*>> order;
    for (const std::string& ready_name : ready) {
      if (planned.contains(ready_name)) continue;  // recovered meanwhile
      const DeclaredName& name = names.at(ready_name);
      if (name.retired) continue;
      // membership.nodes is ordered by node_rank: node 0 is the lowest.
      order.emplace_back(prefixes[DeclarationOf(name, 0)].depth, &name);
    }
    std::sort(order.begin(), order.end());
    for (const auto& [position, name] : order) {
      const v1::TensorSpec& spec = prefixes[name->declarations[0]].spec;
      const int index = next.tensors_size();
      v1::TensorPlanEntry* entry = next.add_tensors();
      entry->set_tensor_id(next_id++);
      *entry->mutable_spec() = spec;
      entry->set_priority(index);
      entry->set_size_bytes(TensorSizeBytes(spec));
      entry->set_num_partitions(static_cast<int32_t>(
          NumPartitions(entry->size_bytes(), partition_bytes)));
      planned[TensorKey(spec)] = index;
      planned_ids[entry->tensor_id()] = index;
      ++planned_in_generation;
    }
    ready.clear();
    plan = next;
    return next;
  }

  // The agents run with the reported plan, so its partition size wins over
  // the one the job was sealed with.
  void AdoptPlan(const std::string& job, const v1::TensorPlan& reported) {
    plan = reported;
    plan->set_job(job);
    partition_bytes = reported.partition_bytes();
    planned.clear();
    planned_ids.clear();
    next_id = 0;
    for (int i = 0; i < reported.tensors_size(); ++i) {
      const v1::TensorPlanEntry& entry = reported.tensors(i);
      planned[TensorKey(entry.spec())] = i;
      planned_ids[entry.tensor_id()] = i;
      next_id = std::max(next_id, entry.tensor_id() + 1);
    }
  }
};

TensorPlanManager::TensorPlanManager() = default;
TensorPlanManager::~TensorPlanManager() = default;

absl::StatusOr<TensorPlanManager::ManifestOutcome>
TensorPlanManager::OnManifest(const v1::Membership& membership,
                              const std::string& node_name,
                              const v1::Manifest& manifest,
                              int64_t global_step) {
  const auto found = jobs_.find(membership.job());
  if (found == jobs_.end() || found->second->partition_bytes <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", membership.job(),
                     "\" has no sealed generation yet: declare tensors after "
                     "the membership arrives"));
  }
  JobPlans& job = *found->second;
  if (membership.generation() < job.membership.generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", membership.generation(), " of job \"", membership.job(),
        "\" is over; generation ", job.membership.generation(), " is sealed"));
  }
  // A newer membership than the last one sealed here (for example a job
  // rebuilt by Recover after a coordinator restart) starts its generation,
  // as OnGenerationSealed would have.
  if (membership.generation() > job.membership.generation()) {
    job.StartGeneration(membership);
  }
  const auto node_it = job.node_index.find(node_name);
  if (node_it == job.node_index.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node \"", node_name, "\" is not a member of job \"", membership.job(),
        "\" generation ", membership.generation(),
        ": only members of the sealed generation declare tensors"));
  }
  const int node = node_it->second;
  const int size = manifest.tensors_size();
  if (size > kMaxTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Manifest declares ", size, " tensors; the limit is ", kMaxTensors,
        " per job: fuse small tensors into larger buckets"));
  }

  // Append-only: the manifest must start with this node's previous one.
  // Those entries were validated when first sent, so comparing suffices.
  const int end = job.node_end[node];
  const int before = job.prefixes[end].depth;
  int changed = -1;  // the first index that differs
  for (int at = end; at != 0; at = job.prefixes[at].parent) {
    const int i = job.prefixes[at].depth - 1;
    if (i >= size || !SameSpec(job.prefixes[at].spec, manifest.tensors(i))) {
      changed = i;
    }
  }
  if (changed >= 0) {
    const v1::TensorSpec& old_spec =
        job.prefixes[job.Ancestor(end, changed + 1)].spec;
    if (changed < size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Manifest.tensors[", changed, "] is ",
          DescribeSpec(manifest.tensors(changed)), " but node \"", node_name,
          "\" declared ", DescribeSpec(old_spec),
          " there before in generation ", membership.generation(),
          ": manifests are append-only; declare new tensors after the "
          "existing ones"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "Manifest has ", size, " tensors but node \"", node_name,
        "\" declared ", before, " before in generation ",
        membership.generation(), " (Manifest.tensors[", changed, "] ",
        DescribeSpec(old_spec),
        " is missing): manifests are append-only; resend every tensor "
        "declared before, in the same order"));
  }

  // By TensorKey.
  absl::flat_hash_map<std::string, int> added_names;
  added_names.reserve(size - before);
  int unplanned = 0;
  for (int i = before; i < size; ++i) {
    const v1::TensorSpec& spec = manifest.tensors(i);
    const std::string what = absl::StrCat("Manifest.tensors[", i, "]");
    BATON_RETURN_IF_ERROR(ValidateTensorSpec(what, spec));
    const std::string key = TensorKey(spec);
    const int first = job.PositionOf(key, node, added_names);
    if (first >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " declares tensor ", DescribeSpec(spec),
          " again (first at Manifest.tensors[", first,
          "]): declare each tensor once, and a name anew with the next "
          "version"));
    }
    if (spec.version() > 0) {
      v1::TensorSpec previous = spec;
      previous.set_version(spec.version() - 1);
      if (job.PositionOf(TensorKey(previous), node, added_names) < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " declares tensor ", DescribeSpec(spec), " but not version ",
            previous.version(),
            " before it: a name's versions are declared in order"));
      }
    }
    added_names.emplace(key, i);
    if (!job.planned.contains(key)) ++unplanned;
    // Only reachable with 8-byte partitions: a 16 GiB tensor would need
    // 2^31 partitions, one more than num_partitions can count.
    const int64_t partitions =
        NumPartitions(TensorSizeBytes(spec), job.partition_bytes);
    if (partitions > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " tensor \"", spec.name(), "\" would need ",
                       partitions, " partitions of ", job.partition_bytes,
                       " bytes, more than a plan can count: split the tensor"));
    }
  }
  // Every name planned later is in every manifest, so the plan stays within
  // kMaxTensors as long as each manifest's unplanned names fit beside it.
  unplanned += job.node_unplanned[node] - job.planned_in_generation;
  if (job.planned.size() + unplanned > kMaxTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Manifest declares ", unplanned,
        " tensors that are not planned yet; "
        "with the ",
        job.planned.size(), " planned the job would exceed ", kMaxTensors,
        " tensors: fuse small tensors into larger buckets"));
  }

  // Accepted: record the new entries, then look for disagreements once the
  // node's whole manifest is in place so its own ranks are counted.
  const int num_nodes = job.membership.nodes_size();
  std::vector<int> added;
  int at = end;
  for (int i = before; i < size; ++i) {
    const v1::TensorSpec& spec = manifest.tensors(i);
    bool created = false;
    at = job.Extend(at, spec, &created);
    const std::string key = TensorKey(spec);
    JobPlans::DeclaredName& name = job.names[key];
    if (created) name.declarations.push_back(at);
    if (!job.planned.contains(key)) {
      ++job.node_unplanned[node];
      if (++name.nodes == num_nodes) job.ready.push_back(key);
    }
    added.push_back(at);
  }
  job.node_end[node] = at;

  ManifestOutcome outcome;
  for (int prefix : added) {
    JobPlans::DeclaredName& name =
        job.names.at(TensorKey(job.prefixes[prefix].spec));
    const bool retired_before = name.retired.has_value();
    const size_t found = outcome.mismatches.size();
    job.FindMismatches(prefix, &outcome.mismatches);
    // Every other member was told when it was retired; this node declares
    // it only now.
    if (retired_before && outcome.mismatches.size() == found) {
      outcome.retired.push_back(*name.retired);
    }
  }
  // A mismatch retires only its own tensor: the others are planned in the
  // declaration order of the lowest node rank, the retired ones left out.
  if (std::any_of(job.ready.begin(), job.ready.end(),
                  [&](const std::string& key) {
                    return !job.names.at(key).retired.has_value();
                  })) {
    outcome.plan = job.ExtendPlan(global_step);
  } else {
    job.ready.clear();
  }
  return outcome;
}

std::optional<v1::TensorPlan> TensorPlanManager::OnGenerationSealed(
    const v1::Membership& membership, int64_t partition_bytes) {
  std::unique_ptr<JobPlans>& job = jobs_[membership.job()];
  if (job == nullptr) job = std::make_unique<JobPlans>();
  if (job->partition_bytes <= 0) job->partition_bytes = partition_bytes;
  if (membership.generation() != job->membership.generation()) {
    job->StartGeneration(membership);
  }
  return job->plan;
}

absl::Status TensorPlanManager::Recover(const std::string& job_name,
                                        const v1::TensorPlan& plan) {
  // An agent that never received a plan has nothing to report.
  if (plan.version() == 0 && plan.tensors().empty()) return absl::OkStatus();
  const auto found = jobs_.find(job_name);
  if (found != jobs_.end() && found->second->plan) {
    const v1::TensorPlan& have = *found->second->plan;
    const std::string prefix =
        absl::StrCat("job \"", job_name, "\" already has plan version ",
                     have.version(), " but this agent reports ");
    const std::string advice = ": the job's agents disagree on the plan";
    if (have.version() != plan.version() ||
        have.tensors_size() != plan.tensors_size() ||
        have.partition_bytes() != plan.partition_bytes()) {
      return absl::FailedPreconditionError(
          absl::StrCat(prefix, "version ", plan.version(), " with ",
                       plan.tensors_size(), " tensors in partitions of ",
                       plan.partition_bytes(), " bytes instead of ",
                       have.tensors_size(), " tensors in partitions of ",
                       have.partition_bytes(), " bytes", advice));
    }
    for (int i = 0; i < have.tensors_size(); ++i) {
      if (!SameEntry(have.tensors(i), plan.tensors(i))) {
        return absl::FailedPreconditionError(absl::StrCat(
            prefix, "tensors[", i, "] as ", DescribeEntry(plan.tensors(i)),
            " instead of ", DescribeEntry(have.tensors(i)), advice));
      }
    }
    return absl::OkStatus();
  }

  if (plan.version() < 1 || plan.partition_bytes() <= 0 ||
      plan.partition_bytes() % 8 != 0 || plan.tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TensorPlan has version ", plan.version(), ", partition_bytes ",
        plan.partition_bytes(), " and ", plan.tensors_size(),
        " tensors; a plan has version >= 1, partition_bytes a positive "
        "multiple of 8 and at most ",
        kMaxTensors, " tensors"));
  }
  absl::flat_hash_map<std::string, int> names;  // by TensorKey
  absl::flat_hash_map<uint32_t, int> ids;
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::TensorPlanEntry& entry = plan.tensors(i);
    const std::string what = absl::StrCat("TensorPlan.tensors[", i, "]");
    BATON_RETURN_IF_ERROR(
        ValidateTensorSpec(absl::StrCat(what, ".spec"), entry.spec()));
    const auto [same_name, new_name] =
        names.emplace(TensorKey(entry.spec()), i);
    if (!new_name) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " repeats tensor ", DescribeSpec(entry.spec()),
                       " of TensorPlan.tensors[", same_name->second, "]"));
    }
    const auto [same_id, new_id] = ids.emplace(entry.tensor_id(), i);
    if (!new_id) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " reuses tensor_id ", entry.tensor_id(),
                       " of TensorPlan.tensors[", same_id->second, "]"));
    }
    const int64_t size_bytes = TensorSizeBytes(entry.spec());
    const int64_t partitions =
        NumPartitions(size_bytes, plan.partition_bytes());
    if (entry.priority() != i || entry.size_bytes() != size_bytes ||
        entry.num_partitions() != partitions) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is ", DescribeEntry(entry), "; expected priority ", i,
          " (entries are ordered by priority), ", size_bytes, " bytes in ",
          partitions, " partitions"));
    }
  }
  std::unique_ptr<JobPlans>& job = jobs_[job_name];
  if (job == nullptr) job = std::make_unique<JobPlans>();
  job->AdoptPlan(job_name, plan);
  return absl::OkStatus();
}

void TensorPlanManager::RemoveJob(const std::string& job) { jobs_.erase(job); }

const v1::TensorPlan* TensorPlanManager::Plan(const std::string& job) const {
  const auto found = jobs_.find(job);
  if (found == jobs_.end() || !found->second->plan) return nullptr;
  return &*found->second->plan;
}

v1::PlanSummary TensorPlanManager::Summary(const std::string& job) const {
  v1::PlanSummary summary;
  const auto found = jobs_.find(job);
  if (found == jobs_.end()) return summary;
  summary.set_partition_bytes(found->second->partition_bytes);
  const v1::TensorPlan* plan = Plan(job);
  if (plan == nullptr) return summary;
  summary.set_version(plan->version());
  summary.set_effective_step(plan->effective_step());
  summary.set_num_tensors(plan->tensors_size());
  summary.set_partition_bytes(plan->partition_bytes());
  for (const v1::TensorPlanEntry& entry : plan->tensors()) {
    summary.set_total_bytes(summary.total_bytes() + entry.size_bytes());
    summary.set_num_partitions(summary.num_partitions() +
                               entry.num_partitions());
  }
  return summary;
}

std::vector<v1::TensorMismatchStatus> TensorPlanManager::Mismatches(
    const std::string& job) const {
  const auto found = jobs_.find(job);
  if (found == jobs_.end()) return {};
  return found->second->mismatches;
}

std::string TensorPlanManager::TensorName(const std::string& job,
                                          uint32_t tensor_id) const {
  const auto found = jobs_.find(job);
  if (found != jobs_.end()) {
    const auto entry = found->second->planned_ids.find(tensor_id);
    if (entry != found->second->planned_ids.end()) {
      return TensorLabel(found->second->plan->tensors(entry->second).spec());
    }
  }
  return absl::StrCat("tensor#", tensor_id);
}

absl::Status TensorPlanManager::ValidateSpec(const std::string& what,
                                             const v1::TensorSpec& spec) {
  return ValidateTensorSpec(what, spec);
}

int64_t TensorPlanManager::SizeBytes(const v1::TensorSpec& spec) {
  return TensorSizeBytes(spec);
}

}  // namespace baton::coordinator
