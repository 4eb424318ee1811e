#include "coordinator/grpc/coordinator_server.h"

#include <glog/logging.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "coordinator/coordinator_metrics.h"

namespace baton::coordinator {

CoordinatorServer::CoordinatorServer(const CoordinatorOptions& options,
                                     Clock* clock)
    : clock_(clock),
      tick_interval_(options.tick_interval),
      coordinator_(options, clock),
      agent_sessions_(&loop_, &coordinator_, clock, options.session_queues),
      rendezvous_(&loop_, &coordinator_),
      status_(&loop_, &coordinator_) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<int> CoordinatorServer::Start(const std::string& listen_address,
                                             int max_message_bytes,
                                             const TlsFiles& tls,
                                             TokensFile tokens) {
  CHECK(server_ == nullptr) << "CoordinatorServer::Start called twice";
  CHECK(tls.enabled() || tokens.path.empty())
      << "tokens without TLS: gRPC sends none in plaintext";
  if (tls.enabled()) {
    authorizer_ = std::make_shared<CallAuthorizer>(
        tokens.path,
        tokens.table != nullptr ? tokens.table
                                : std::make_shared<const TokenTable>(),
        absl::Seconds(tls.refresh_s));
  }
  admin_ =
      std::make_unique<AdminService>(&loop_, &coordinator_, authorizer_.get());
  EnableStandardServices();
  grpc::ServerBuilder builder;
  ApplyServerDefaults(builder, max_message_bytes);
  // gRPC sets SO_REUSEPORT by default, which lets a second coordinator bind
  // the same port and share its connections; a used port must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(listen_address,
                           tls.enabled()
                               ? TlsServerCredentials(tls, authorizer_)
                               : grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&agent_sessions_);
  builder.RegisterService(&rendezvous_);
  builder.RegisterService(&status_);
  builder.RegisterService(admin_.get());
  agent_sessions_.AddQueues(builder);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen_address,
        ": the address is not a local address of this host, or the port is "
        "in use; choose another --listen"));
  }
  agent_sessions_.Start();
  loop_thread_ = std::thread([this] {
    loop_.Run(clock_, tick_interval_, [this] { coordinator_.Tick(); });
  });
  return port;
}

absl::StatusOr<std::string> CoordinatorServer::ServeMetrics(
    const std::string& listen_address) {
  CHECK(server_ != nullptr && metrics_ == nullptr)
      << "CoordinatorServer::ServeMetrics called before Start or twice";
  if (listen_address.empty()) return "";
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(listen_address);
  if (!endpoint.ok()) return endpoint.status();
  metrics_ = *std::move(endpoint);
  metrics_->Add(std::make_shared<CoordinatorMetrics>(&loop_, &coordinator_));
  return metrics_->url();
}

void CoordinatorServer::Shutdown(absl::Duration grace,
                                 const std::string& reason) {
  if (server_ == nullptr || shut_down_) return;
  shut_down_ = true;
  if (grpc::HealthCheckServiceInterface* health =
          server_->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  loop_.Post([this, reason] { coordinator_.Shutdown(reason); });
  // Waits for the sessions to drain their shutdown messages and for calls in
  // progress, cancelling what is left at the deadline. The loop keeps
  // running meanwhile: the calls finish through it.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  // Every stream has ended; their last completions post to the loop.
  agent_sessions_.Shutdown();
  metrics_.reset();
  loop_.Stop();
  loop_thread_.join();
  // Tasks posted by the last reactions (their sessions' ends) still run, on
  // this thread now that the loop's is gone.
  loop_.RunUntilIdle();
}

}  // namespace baton::coordinator
