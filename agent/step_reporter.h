#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "agent/job_environment.h"
#include "agent/job_membership.h"
#include "agent/job_operations.h"
#include "agent/job_trainers.h"
#include "common/clock.h"

namespace baton::agent {

// This node's StepReport of one job while a generation runs: each local
// rank's last completed and last submitted step, the operations still
// waiting, and the data plane's stats, throughput and per-tensor latencies
// (with the last step completed) since the previous report. The
// coordinator's stall detection reads the waiting operations and the last
// completed steps: together they say which ranks have submitted a tensor's
// step. Job thread only.
class StepReporter {
 public:
  // `env` and the job's parts outlive it.
  StepReporter(std::string job, const JobEnvironment& env,
               const JobTrainers* trainers, const JobMembership* membership,
               JobOperations* operations);

  StepReporter(const StepReporter&) = delete;
  StepReporter& operator=(const StepReporter&) = delete;

  // Sends a report to the coordinator if a generation runs.
  void Send();

 private:
  // Constant after construction.
  const std::string job_;
  const JobEnvironment& env_;
  Clock& clock_;
  const JobTrainers& trainers_;
  const JobMembership& membership_;
  JobOperations& operations_;

  int64_t reported_bytes_done_ = 0;
  // Bytes per second over the last report interval long enough to measure.
  double throughput_ = 0;
  absl::Time reported_at_;
};

}  // namespace baton::agent
