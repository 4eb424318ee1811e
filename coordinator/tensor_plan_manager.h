#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/status.pb.h"
#include "common/tensor_spec.h"

namespace baton::coordinator {

// Owns every job's tensor plan: the manifests nodes send in the current
// generation, the agreed plan (stable ids, priorities, partitioning) and the
// mismatches found between nodes.
//
// Rules:
// - A manifest is the node's whole declaration list, in declaration order,
//   append-only within a generation.
// - A tensor is a name and a version (TensorSpec.version): a name declared
//   anew with another spec is its next version, a tensor of its own, and
//   each node's manifest lists a name's versions in order.
// - Two nodes that declare the same tensor with a different dtype, shape or
//   op are a mismatch, reported once per (tensor, field). The tensor is then
//   retired: never planned in this generation (a planned one keeps its
//   entry), while the job's other tensors are planned as before. Its
//   trainers declare the name anew, as its next version, to use it again.
// - A tensor declared by every node of the generation is planned. New entries
//   are appended in the declaration order of the lowest node rank that has
//   them all; an entry, once planned, never changes its id, priority or
//   partitioning for the life of the job, across generations.
//
// Not thread-safe: owned by the coordinator's control loop.
class TensorPlanManager {
 public:
  // Largest tensor a spec may describe, and most tensors per job.
  static constexpr int64_t kMaxTensorBytes = baton::kMaxTensorBytes;
  static constexpr int kMaxTensors = 100000;
  static constexpr int kMaxDims = kMaxTensorDims;

  // What a manifest changed, for the coordinator to send to every member.
  struct ManifestOutcome {
    // Set when the manifest completed a new plan version.
    std::optional<v1::TensorPlan> plan;
    // Mismatches this manifest revealed (not ones reported before): for
    // every member.
    std::vector<v1::TensorMismatch> mismatches;
    // Mismatches reported before on retired tensors this manifest declares:
    // for the declaring node only.
    std::vector<v1::TensorMismatch> retired;
  };

  // Out of line: JobPlans is complete only in the .cc.
  TensorPlanManager();
  ~TensorPlanManager();

  // Records `node_name`'s manifest for `membership` (the job's current sealed
  // generation; the caller has checked manifest.generation against it).
  // INVALID_ARGUMENT names the bad entry (index, name, field);
  // FAILED_PRECONDITION when the manifest drops or reorders entries this
  // node sent before in this generation. `global_step` is the job's last
  // step completed by every rank (-1 before the first), used to state the
  // step a new version is effective from.
  absl::StatusOr<ManifestOutcome> OnManifest(const v1::Membership& membership,
                                             const std::string& node_name,
                                             const v1::Manifest& manifest,
                                             int64_t global_step);

  // A new generation was sealed: manifests start over. Returns the job's
  // plan restamped with the new generation, if it has one, so it can be sent
  // to the members right away. `partition_bytes` (a multiple of 8) is fixed
  // the first time a job is seen.
  std::optional<v1::TensorPlan> OnGenerationSealed(
      const v1::Membership& membership, int64_t partition_bytes);

  // Restores a plan reported by a rejoining agent after a coordinator
  // restart. The first report wins; a later one with a different version or
  // entries gets FAILED_PRECONDITION naming the difference.
  absl::Status Recover(const std::string& job, const v1::TensorPlan& plan);

  void RemoveJob(const std::string& job);

  // The current plan, or nullptr when none was agreed yet.
  const v1::TensorPlan* Plan(const std::string& job) const;
  v1::PlanSummary Summary(const std::string& job) const;
  std::vector<v1::TensorMismatchStatus> Mismatches(
      const std::string& job) const;
  // The planned tensor's TensorLabel ("w", "w (version 2)"), or
  // "tensor#<id>" when unknown.
  std::string TensorName(const std::string& job, uint32_t tensor_id) const;

  // Shorthands for ValidateTensorSpec and TensorSizeBytes
  // (common/tensor_spec.h), which state the full contracts.
  // Validates one spec; `what` names it in the error ("Manifest.tensors[3]").
  static absl::Status ValidateSpec(const std::string& what,
                                   const v1::TensorSpec& spec);
  // Element count times element size; the spec must be valid.
  static int64_t SizeBytes(const v1::TensorSpec& spec);

 private:
  struct JobPlans;  // defined in the .cc
  absl::flat_hash_map<std::string, std::unique_ptr<JobPlans>> jobs_;
};

}  // namespace baton::coordinator
