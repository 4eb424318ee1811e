#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/status.pb.h"

namespace baton::coordinator {

// Tracks each job's step progress from the agents' periodic StepReports: the
// global step (last step completed by every rank), stalls (a tensor some
// ranks submitted for step s and others have not, for at least the stall
// threshold), and each rank's lag: how far its submissions are behind the
// furthest rank's, counting a rank that holds back a stalled tensor of step s
// as at s - 1.
//
// A rank is missing from (tensor, s) when its node's latest report lists the
// tensor pending at s without it, or lists nothing for the tensor at s or
// later and the node has not completed step s of it (from the latencies of
// every report so far). Steps at or below the global step never stall.
//
// Not thread-safe: owned by the coordinator's control loop.
class StepManager {
 public:
  using TensorNameFn = std::function<std::string(uint32_t tensor_id)>;

  explicit StepManager(absl::Duration stall_threshold);
  // Out of line: JobSteps is complete only in the .cc.
  ~StepManager();
  StepManager(const StepManager&) = delete;
  StepManager& operator=(const StepManager&) = delete;

  // A generation was sealed (or recovered): the job's ranks are those of
  // `membership`. Reports of earlier generations are dropped and every rank
  // starts at -1; the global step never goes backwards. Sealing the current
  // generation again (another rejoin) or an older one changes nothing.
  void OnGenerationSealed(const v1::Membership& membership);

  // Records `node_name`'s report (the caller checked job and generation).
  // It replaces the node's previous report; a rank's completed step never
  // goes down. FAILED_PRECONDITION when the job, generation or node is not
  // one this manager was told about; INVALID_ARGUMENT when a rank is not one
  // of the node's ranks or is named twice, a step is below -1 (a pending or
  // completed tensor's step below 0), or a waiting time is negative. A
  // rejected report changes nothing.
  absl::Status OnReport(const std::string& node_name,
                        const v1::StepReport& report, absl::Time now);

  // Seeds a recovered job: every rank of `node_name` completed
  // `completed_step` (never lowering a rank). Call after OnGenerationSealed;
  // an unknown job or node is ignored.
  void Recover(const std::string& job, const std::string& node_name,
               int64_t completed_step);

  // Stalls that crossed the threshold since the last call, for the event log.
  std::vector<v1::Stall> TakeNewStalls(const std::string& job, absl::Time now,
                                       const TensorNameFn& tensor_name);

  // -1 before the first completed step.
  int64_t GlobalStep(const std::string& job) const;

  // Fills global_step, stalls, and for every member already in `status`
  // its ranks (completed step, lowered below any stalled step a rank holds
  // back, and lag) and last reported scheduling stats.
  void FillStatus(const std::string& job, absl::Time now,
                  const TensorNameFn& tensor_name, v1::JobStatus* status) const;

  // Every rank's lag (indexed by rank), as FillStatus gives it, without
  // building the members: O(ranks + pending operations). Empty for a job
  // without a sealed generation.
  std::vector<int64_t> RankLags(const std::string& job, absl::Time now,
                                const TensorNameFn& tensor_name) const;

  // One tensor's latency summed over the members' last reports.
  struct TensorLatencySum {
    int64_t count = 0;
    int64_t total_us = 0;  // mean_us * count, summed
    int64_t max_us = 0;
  };
  // By tensor id, over every member's last report: O(members x tensors
  // reported), without building the members' statuses.
  absl::flat_hash_map<uint32_t, TensorLatencySum> TensorLatencies(
      const std::string& job) const;

  void RemoveJob(const std::string& job);

 private:
  struct JobSteps;  // defined in the .cc
  absl::Duration stall_threshold_;
  absl::flat_hash_map<std::string, std::unique_ptr<JobSteps>> jobs_;
};

}  // namespace baton::coordinator
