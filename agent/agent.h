#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_config.h"
#include "agent/agent_job.h"
#include "agent/agent_metrics.h"
#include "agent/coordinator_client.h"
#include "agent/trainer_listener.h"
#include "agent/trainer_service.h"
#include "agent/transport/transport.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"

namespace baton::agent {

// baton-agent: serves the trainers of this node on a unix socket, keeps one
// session with the coordinator, and runs one AgentJob per job its trainers
// attach to. Wires the pieces together; owns no job state itself.
class Agent {
 public:
  // `gpus`: the GPUs this node drives for CUDA tensors (none by default).
  // `clock` times the coordinator session, the rendezvous, the data
  // plane's transport and the jobs; it must outlive the agent.
  explicit Agent(AgentConfig config, GpuSupport gpus = {},
                 Clock* clock = Clock::Real());
  ~Agent();

  // Removes orphaned shared memory, connects to the coordinator and starts
  // serving the socket (owner-only, or for the trainer group: see
  // TrainerListener). FAILED_PRECONDITION / UNAVAILABLE when the socket
  // cannot be bound or given to the trainer group.
  absl::Status Start();
  // Ends every job (trainers see CANCELLED), closes the socket and the
  // session.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  // Destroys jobs that ended, and removes the metrics of jobs that ended
  // longer than metrics_retention ago; call periodically.
  void ReapJobs() ABSL_LOCKS_EXCLUDED(mu_);
  // Serves the agent's Prometheus metrics on `listen_address` ("host:port";
  // port 0 picks a free port). Call at most once, from the thread that
  // calls Start. Returns the endpoint's URL; UNAVAILABLE when the address
  // cannot be bound. An empty address (--metrics_listen's default) serves
  // nothing and returns "".
  absl::StatusOr<std::string> ServeMetrics(const std::string& listen_address);

 private:
  // The job a trainer attaching as `local_rank` joins: the name's running
  // job, or, when `local_rank` finished that one (shutdown() then init()),
  // the name's next run, which waits on this node until the running one
  // ended here.
  absl::StatusOr<std::shared_ptr<AgentJob>> FindOrCreateJob(
      const std::string& job, int32_t local_rank) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<AgentJob> CreateJob(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RouteMessage(const v1::CoordinatorMessage& message)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<AgentJob>> Jobs() ABSL_LOCKS_EXCLUDED(mu_);

  const AgentConfig config_;
  const GpuSupport gpus_;
  Clock* const clock_;
  AgentMetrics metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  std::unique_ptr<Transport> transport_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<CoordinatorClient> coordinator_;
  std::unique_ptr<TrainerService> trainer_service_;
  std::unique_ptr<grpc::Server> server_;
  // After server_: destroyed (stopped) before it.
  std::unique_ptr<TrainerListener> trainer_listener_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<AgentJob>> jobs_
      ABSL_GUARDED_BY(mu_);
  // Per name, the next run: trainers that finished the running job attach
  // to it; it replaces that job in jobs_ once that one ended.
  absl::flat_hash_map<std::string, std::shared_ptr<AgentJob>> next_runs_
      ABSL_GUARDED_BY(mu_);
  // Names whose job ended: ReapJobs destroys the job the name maps to if
  // that one has ended (a newer run may have taken the name meanwhile).
  std::vector<std::string> done_ ABSL_GUARDED_BY(mu_);
  // Jobs that ended and that their next run replaced, to destroy in ReapJobs.
  std::vector<std::shared_ptr<AgentJob>> replaced_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::agent
