#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "baton/v1/trainer.grpc.pb.h"

namespace baton::agent {

class AgentJob;

// The gRPC edge trainers talk to: one bidirectional stream per trainer. It
// only translates: requests go to the trainer's AgentJob, events come back
// through the stream's TrainerSink (one write in flight, the rest queued).
class TrainerService final : public v1::TrainerService::CallbackService {
 public:
  // Finds or creates the job a trainer attaches to as `local_rank`; errors
  // (a bad job name) end the stream.
  using JobFinder = std::function<absl::StatusOr<std::shared_ptr<AgentJob>>(
      const std::string& job, int32_t local_rank)>;

  explicit TrainerService(JobFinder find_job)
      : find_job_(std::move(find_job)) {}

  grpc::ServerBidiReactor<v1::TrainerRequest, v1::TrainerEvent>* TrainerSession(
      grpc::CallbackServerContext* context) override;

 private:
  JobFinder find_job_;
};

}  // namespace baton::agent
