#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "agent/agent_config.h"
#include "agent/agent_job.h"
#include "agent/coordinator_client.h"
#include "agent/trainer_service.h"
#include "agent/transport/transport.h"
#include "grpcpp/grpcpp.h"

namespace baton::agent {

// baton-agent: serves the trainers of this node on a unix socket, keeps one
// session with the coordinator, and runs one AgentJob per job its trainers
// attach to. Wires the pieces together; owns no job state itself.
class Agent {
 public:
  explicit Agent(AgentConfig config);
  ~Agent();

  // Removes orphaned shared memory, connects to the coordinator and starts
  // serving the socket. FAILED_PRECONDITION / UNAVAILABLE when the socket
  // cannot be bound.
  absl::Status Start();
  // Ends every job (trainers see CANCELLED), closes the socket and the
  // session.
  void Shutdown();
  // Destroys jobs that ended; call periodically.
  void ReapJobs();

 private:
  absl::StatusOr<std::shared_ptr<AgentJob>> FindOrCreateJob(
      const std::string& job);
  void RouteMessage(const v1::CoordinatorMessage& message);
  std::vector<std::shared_ptr<AgentJob>> Jobs();

  const AgentConfig config_;
  std::unique_ptr<Transport> transport_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<CoordinatorClient> coordinator_;
  std::unique_ptr<TrainerService> trainer_service_;
  std::unique_ptr<grpc::Server> server_;

  std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<AgentJob>> jobs_
      ABSL_GUARDED_BY(mu_);
  // Jobs that ended, to destroy in ReapJobs.
  std::vector<const AgentJob*> done_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::agent
