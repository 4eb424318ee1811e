#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/tls.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/grpc/admin_service.h"
#include "coordinator/grpc/agent_session_service.h"
#include "coordinator/grpc/call_authorizer.h"
#include "coordinator/grpc/rendezvous_service.h"
#include "coordinator/grpc/status_service.h"
#include "coordinator/token_table.h"

namespace baton::coordinator {

// The bearer tokens a TLS coordinator accepts (--tokens_file): the file,
// read again when it changes, and what was loaded from it at startup.
struct TokensFile {
  std::string path;
  std::shared_ptr<const TokenTable> table;
};

// A running coordinator: the Coordinator, the control loop thread that owns
// it, and the gRPC server with the agent-session, rendezvous, status, admin,
// health and reflection services.
//
// Start, Shutdown and the destructor are called from one thread (main's);
// the Coordinator inside is only touched on the loop thread.
class CoordinatorServer {
 public:
  // `clock` must outlive this object.
  CoordinatorServer(const CoordinatorOptions& options, Clock* clock);
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;
  // Shuts down with no grace if Start succeeded and Shutdown was not called.
  ~CoordinatorServer();

  // Binds `listen_address` ("host:port"; port 0 picks a free port), starts
  // serving and starts the control loop. Returns the bound port. Call once.
  // With `tls` enabled every connection is TLS and CallAuthorizer decides
  // each call: a node's client certificate (signed by tls.ca) for agent
  // sessions and the store, a certificate or one of `tokens` for status, an
  // admin token for the admin service (CheckTlsFiles first: gRPC starts
  // even with files it cannot use). Without TLS every call is admitted and
  // `tokens` must be empty (gRPC sends no tokens in plaintext).
  absl::StatusOr<int> Start(const std::string& listen_address,
                            int max_message_bytes, const TlsFiles& tls = {},
                            TokensFile tokens = {});

  // Serves the coordinator's Prometheus metrics on `listen_address`
  // ("host:port"; port 0 picks a free port) until Shutdown. Call after
  // Start, at most once. Returns the endpoint's URL; UNAVAILABLE when the
  // address cannot be bound. An empty address (--metrics_listen's default)
  // serves nothing and returns "".
  absl::StatusOr<std::string> ServeMetrics(const std::string& listen_address);

  // Reports NOT_SERVING, tells every agent the coordinator is going away and
  // closes their sessions, stops accepting calls, waits up to `grace` for
  // calls in progress and cancels the rest, then stops the control loop.
  // `reason` goes to the agents. Later calls do nothing.
  void Shutdown(absl::Duration grace,
                const std::string& reason = "the coordinator is shutting down");

 private:
  // Constant after construction.
  Clock* const clock_;
  const absl::Duration tick_interval_;

  ControlLoop loop_;
  // Only touched on the loop thread once it runs (and on this thread before
  // it starts and after it is joined).
  Coordinator coordinator_;
  AgentSessionService agent_sessions_;
  RendezvousService rendezvous_;
  StatusService status_;
  // Made by Start: with TLS, the authorizer first.
  std::shared_ptr<CallAuthorizer> authorizer_;
  std::unique_ptr<AdminService> admin_;

  std::unique_ptr<grpc::Server> server_;
  // Reads the coordinator through the loop: stopped before the loop is.
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::thread loop_thread_;
  bool shut_down_ = false;
};

}  // namespace baton::coordinator
