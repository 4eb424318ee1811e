#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/links.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "common/clock.h"
#include "grpcpp/grpcpp.h"

namespace baton::agent {

// The agent's session with the coordinator (AgentSession): hello, then
// messages both ways; heartbeats when the agent has been silent for the
// heartbeat interval; on any break, reconnects with backoff (or after the
// coordinator's Shutdown.retry_after_ms) and tells the jobs to re-report.
// The data plane does not depend on it: training goes on while it is down.
//
// Thread-safe. Callbacks run on the session's reader thread.
class CoordinatorClient final : public CoordinatorLink {
 public:
  struct Callbacks {
    // A session was accepted; `restarted`: the coordinator instance differs
    // from the previous session's (a new coordinator process).
    std::function<void(bool restarted)> on_session;
    std::function<void(const v1::CoordinatorMessage&)> on_message;
  };

  // `clock` times the heartbeats and stamps them; it must outlive the
  // client.
  CoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                    std::string node_name, std::string agent_instance,
                    std::chrono::milliseconds max_backoff, Callbacks callbacks,
                    Clock* clock = Clock::Real());
  ~CoordinatorClient() override;

  void Start();
  // Ends the session (a final leave is the jobs' business) and joins.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t Send(v1::AgentMessage message) override
      ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  std::chrono::milliseconds liveness_timeout() const override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::chrono::milliseconds report_interval() const override
      ABSL_LOCKS_EXCLUDED(mu_);

  bool connected() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  struct SessionEnd {
    // The coordinator's Shutdown.retry_after_ms, or 0.
    std::chrono::milliseconds retry_after{0};
    bool accepted = false;
  };
  // One session.
  SessionEnd RunSession() ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::string node_name_;
  const std::string agent_instance_;
  const std::chrono::milliseconds max_backoff_;
  const Callbacks callbacks_;
  Clock* const clock_;

  // Writes are serialized separately so a blocked write never holds mu_.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>* stream_
      ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_sent_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds heartbeat_interval_ ABSL_GUARDED_BY(mu_){2000};
  std::chrono::milliseconds liveness_timeout_ ABSL_GUARDED_BY(mu_){6000};
  std::chrono::milliseconds report_interval_ ABSL_GUARDED_BY(mu_){1000};
  std::string coordinator_instance_ ABSL_GUARDED_BY(mu_);

  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace baton::agent
