#include "agent/agent.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/rendezvous_client.h"
#include "agent/transport/gloo/gloo_transport.h"
#include "agent/transport/tcp/tcp_transport.h"
#include "common/grpc_util.h"
#include "common/log_context.h"
#include "common/shm.h"
#include "common/tls.h"
#include "common/validation.h"
#include "glog/logging.h"
#include "grpcpp/server_posix.h"

namespace baton::agent {
namespace {

std::string RandomInstance() {
  std::random_device device;
  std::mt19937_64 rng(device());
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16));
}

// The job a coordinator message is about ("" when it names none).
const std::string& JobOf(const v1::CoordinatorMessage& m) {
  static const std::string kNone;
  switch (m.body_case()) {
    case v1::CoordinatorMessage::kJoinAccepted:
      return m.join_accepted().job();
    case v1::CoordinatorMessage::kMembership:
      return m.membership().job();
    case v1::CoordinatorMessage::kGenerationAborted:
      return m.generation_aborted().job();
    case v1::CoordinatorMessage::kPlan:
      return m.plan().job();
    case v1::CoordinatorMessage::kError:
      return m.error().job();
    case v1::CoordinatorMessage::kJobEnded:
      return m.job_ended().job();
    case v1::CoordinatorMessage::kTimelineRequest:
      return m.timeline_request().job();
    case v1::CoordinatorMessage::kJoinPending:
      return m.join_pending().job();
    default:
      return kNone;
  }
}

}  // namespace

Agent::Agent(AgentConfig config, GpuSupport gpus, Clock* clock)
    : config_(std::move(config)),
      gpus_(std::move(gpus)),
      clock_(clock),
      metrics_(absl::FromChrono(config_.metrics_retention)) {}

Agent::~Agent() { Shutdown(); }

absl::Status Agent::Start() {
  const int orphans = SharedMemory::RemoveOrphans(config_.pid);
  if (orphans > 0) {
    LOG(INFO) << "removed " << orphans
              << " shared memory objects left by a killed agent";
  }
  GlooTransport::Options gloo;
  gloo.clock = clock_;
  absl::StatusOr<std::unique_ptr<Transport>> transport =
      config_.data_transport == DataTransport::kGloo
          ? absl::StatusOr<std::unique_ptr<Transport>>(
                GlooTransport::Create(config_.data_host, gloo))
          : absl::StatusOr<std::unique_ptr<Transport>>(TcpTransport::Create(
                config_.data_host, clock_, config_.skip_zero_blocks));
  if (!transport.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(transport.status().message(), ": fix --data_host"));
  }
  transport_ = std::move(*transport);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(config_.reconnect_max_backoff.count()));
  channel_ = grpc::CreateCustomChannel(config_.coordinator,
                                       ChannelCredentials(config_.tls), args);
  CoordinatorClient::Callbacks callbacks;
  callbacks.on_session = [this](bool restarted) {
    for (auto& job : Jobs()) job->OnCoordinatorSession(restarted);
  };
  callbacks.on_message = [this](const v1::CoordinatorMessage& m) {
    RouteMessage(m);
  };
  coordinator_ = std::make_unique<CoordinatorClient>(
      channel_, config_.node_name, RandomInstance(),
      config_.reconnect_max_backoff, std::move(callbacks), clock_);

  trainer_service_ = std::make_unique<TrainerService>(
      [this](const std::string& job, int32_t local_rank) {
        return FindOrCreateJob(job, local_rank);
      });
  EnableStandardServices();
  // No listening port: the TrainerListener owns the socket, checks who
  // connects and hands the admitted connections to the server.
  grpc::ServerBuilder builder;
  ApplyServerDefaults(builder, 16 << 20);
  builder.RegisterService(trainer_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server for the trainers on ",
                     config_.socket_path));
  }
  grpc::Server* server = server_.get();
  absl::StatusOr<std::unique_ptr<TrainerListener>> listener =
      TrainerListener::Start(
          config_.socket_path,
          TrainerAdmission::ForThisProcess(config_.trainer_group),
          [server](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
  if (!listener.ok()) return listener.status();
  trainer_listener_ = *std::move(listener);
  coordinator_->Start();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Agent::ServeMetrics(
    const std::string& listen_address) {
  CHECK(metrics_endpoint_ == nullptr) << "Agent::ServeMetrics called twice";
  if (listen_address.empty()) return "";
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(listen_address);
  if (!endpoint.ok()) return endpoint.status();
  metrics_endpoint_ = *std::move(endpoint);
  metrics_endpoint_->Add(metrics_.registry());
  return metrics_endpoint_->url();
}

absl::StatusOr<std::shared_ptr<AgentJob>> Agent::FindOrCreateJob(
    const std::string& job, int32_t local_rank) {
  absl::Status valid = ValidateIdentifier("AttachRequest.job", job);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) {
    return absl::UnavailableError("the agent is shutting down");
  }
  auto it = jobs_.find(job);
  if (it != jobs_.end() && !it->second->ended()) {
    // A trainer detaches as finished only after the job handled it (the job
    // closes the stream), so a finished rank's next attach sees it here.
    if (!it->second->finished(local_rank)) return it->second;
    std::shared_ptr<AgentJob>& next = next_runs_[job];
    if (next == nullptr) next = CreateJob(job);
    return next;
  }
  // A job that ended here and was not reaped yet is replaced: trainers
  // attaching now start it afresh (its next run, if one waits).
  std::shared_ptr<AgentJob> created;
  if (auto next = next_runs_.find(job); next != next_runs_.end()) {
    created = std::move(next->second);
    next_runs_.erase(next);
  } else {
    created = CreateJob(job);
  }
  jobs_[job] = created;
  return created;
}

std::shared_ptr<AgentJob> Agent::CreateJob(const std::string& job) {
  AgentJob::Environment env;
  env.config = &config_;
  env.coordinator = coordinator_.get();
  env.transport = transport_.get();
  env.gpus = &gpus_;
  env.metrics = metrics_.ForJob(job);
  env.clock = clock_;
  env.store_factory = [this](const std::string& name, int64_t generation) {
    RendezvousClient::Options options;
    options.clock = clock_;
    return std::make_shared<RendezvousClient>(channel_, name, generation,
                                              options);
  };
  auto created_ptr = std::make_shared<const AgentJob*>(nullptr);
  env.on_done = [this, created_ptr, job] {
    absl::MutexLock lock(&mu_);
    done_.push_back(job);
    // The name's next run takes over: its trainers attached while this one
    // ended, and coordinator messages for the name are now its.
    auto it = jobs_.find(job);
    auto next = next_runs_.find(job);
    if (it != jobs_.end() && it->second.get() == *created_ptr &&
        next != next_runs_.end()) {
      replaced_.push_back(std::move(it->second));
      it->second = std::move(next->second);
      next_runs_.erase(next);
    }
  };
  auto created = std::make_shared<AgentJob>(job, std::move(env));
  *created_ptr = created.get();
  return created;
}

std::vector<std::shared_ptr<AgentJob>> Agent::Jobs() {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<AgentJob>> jobs;
  for (auto& [name, job] : jobs_) jobs.push_back(job);
  return jobs;
}

void Agent::RouteMessage(const v1::CoordinatorMessage& message) {
  const std::string& name = JobOf(message);
  std::shared_ptr<AgentJob> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(name);
    if (it != jobs_.end()) job = it->second;
  }
  if (job) {
    job->OnCoordinatorMessage(message);
    return;
  }
  if (message.has_timeline_request()) {
    // Not (or no longer) a job here: nothing recorded, answered at once so
    // the coordinator need not wait for its deadline.
    v1::AgentMessage reply;
    reply.mutable_timeline_reply()->set_request_id(
        message.timeline_request().request_id());
    reply.mutable_timeline_reply()->set_job(name);
    coordinator_->Send(std::move(reply));
    return;
  }
  if (name.empty()) {
    // An error about a request that names no job: every job checks whether
    // it was its join.
    for (auto& j : Jobs()) j->OnCoordinatorMessage(message);
  }
}

void Agent::ReapJobs() {
  std::vector<std::shared_ptr<AgentJob>> reaped;
  {
    absl::MutexLock lock(&mu_);
    reaped.swap(replaced_);
    for (const std::string& name : done_) {
      // Only if the name still maps to a job that ended: a newer run of
      // the name may have taken it meanwhile. (The ended job's address is
      // no test: once destroyed, a new run may be made at the same address,
      // and reaping that one left its trainers waiting for ever.)
      auto it = jobs_.find(name);
      if (it == jobs_.end() || !it->second->ended()) continue;
      reaped.push_back(std::move(it->second));
      jobs_.erase(it);
    }
    done_.clear();
  }
  // Destroyed here (or by the last trainer stream holding them), never on
  // their own thread.
  for (auto& job : reaped) {
    LOG(INFO) << LogPrefix({job->name(), 0, config_.node_name})
              << "ended on this node";
  }
  reaped.clear();
  metrics_.RemoveIdle(clock_->Now());
}

void Agent::Shutdown() {
  std::vector<std::shared_ptr<AgentJob>> jobs;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (auto& [name, job] : jobs_) jobs.push_back(std::move(job));
    jobs_.clear();
    for (auto& [name, job] : next_runs_) jobs.push_back(std::move(job));
    next_runs_.clear();
    for (auto& job : replaced_) jobs.push_back(std::move(job));
    replaced_.clear();
  }
  // Destroying a job fails its operations and closes its trainers' streams.
  jobs.clear();
  // The coordinator session ends before the trainer service: a trainer
  // handler still sending to a coordinator that stopped reading (it died)
  // is released by the cancel instead of holding the server's shutdown.
  if (coordinator_) coordinator_->Stop();
  // No connection is handed to the server once it shuts down; this also
  // removes the socket file.
  if (trainer_listener_) trainer_listener_->Stop();
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(clock_->Now() + absl::Seconds(2)));
  }
}

}  // namespace baton::agent
