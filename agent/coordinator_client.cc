#include "agent/coordinator_client.h"

#include <algorithm>
#include <utility>

#include "absl/time/time.h"
#include "common/thread_name.h"
#include "glog/logging.h"

namespace baton::agent {

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                     std::string node_name,
                                     std::string agent_instance,
                                     std::chrono::milliseconds max_backoff,
                                     Callbacks callbacks, Clock* clock)
    : channel_(std::move(channel)),
      stub_(v1::Coordinator::NewStub(channel_)),
      node_name_(std::move(node_name)),
      agent_instance_(std::move(agent_instance)),
      max_backoff_(max_backoff),
      callbacks_(std::move(callbacks)),
      clock_(clock) {}

CoordinatorClient::~CoordinatorClient() { Stop(); }

void CoordinatorClient::Start() {
  reader_ = std::thread([this] {
    SetThreadName("baton-coord");
    Run();
  });
  heartbeat_ = std::thread([this] {
    SetThreadName("baton-heartbeat");
    HeartbeatLoop();
  });
}

void CoordinatorClient::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !reader_.joinable()) return;
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (reader_.joinable()) reader_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
}

bool CoordinatorClient::connected() const {
  absl::MutexLock lock(&mu_);
  return stream_ != nullptr;
}

std::chrono::milliseconds CoordinatorClient::liveness_timeout() const {
  absl::MutexLock lock(&mu_);
  return liveness_timeout_;
}

std::chrono::milliseconds CoordinatorClient::report_interval() const {
  absl::MutexLock lock(&mu_);
  return report_interval_;
}

uint64_t CoordinatorClient::Send(v1::AgentMessage message) {
  absl::MutexLock write_lock(&write_mu_);
  grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>* stream;
  {
    absl::MutexLock lock(&mu_);
    message.set_seq(++seq_);
    stream = stream_;
    last_sent_ = clock_->Now();
  }
  if (stream == nullptr) {
    VLOG(1) << "coordinator session down; dropped " << message.body_case();
    return message.seq();
  }
  // A failed write shows up as the end of the reader's stream.
  stream->Write(message);
  return message.seq();
}

void CoordinatorClient::Run() {
  constexpr std::chrono::milliseconds kInitialBackoff{100};
  std::chrono::milliseconds backoff = kInitialBackoff / 2;
  while (true) {
    const SessionEnd end = RunSession();
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    // After a session that worked, start over from a short wait.
    if (end.accepted) backoff = kInitialBackoff / 2;
    backoff = end.retry_after.count() > 0 ? end.retry_after
                                          : std::min(backoff * 2, max_backoff_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(backoff));
    if (stop_) return;
  }
}

CoordinatorClient::SessionEnd CoordinatorClient::RunSession() {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return SessionEnd{};
    context_ = &context;
  }
  auto stream = stub_->AgentSession(&context);
  std::chrono::milliseconds retry_after{0};
  v1::AgentMessage hello;
  hello.mutable_hello()->set_node_name(node_name_);
  hello.mutable_hello()->set_agent_instance(agent_instance_);
  hello.mutable_hello()->set_agent_version("baton-agent 0.1");
  v1::CoordinatorMessage message;
  bool accepted = false;
  if (stream->Write(hello) && stream->Read(&message) &&
      message.has_session_accepted()) {
    const v1::SessionAccepted& a = message.session_accepted();
    bool restarted;
    {
      absl::MutexLock lock(&mu_);
      restarted = !coordinator_instance_.empty() &&
                  coordinator_instance_ != a.coordinator_instance();
      coordinator_instance_ = a.coordinator_instance();
      if (a.heartbeat_interval_ms() > 0) {
        heartbeat_interval_ =
            std::chrono::milliseconds(a.heartbeat_interval_ms());
      }
      if (a.liveness_timeout_ms() > 0) {
        liveness_timeout_ = std::chrono::milliseconds(a.liveness_timeout_ms());
      }
      if (a.report_interval_ms() > 0) {
        report_interval_ = std::chrono::milliseconds(a.report_interval_ms());
      }
      stream_ = stream.get();
      last_sent_ = clock_->Now();
    }
    accepted = true;
    LOG(INFO) << "coordinator session " << a.session_id() << " accepted"
              << (restarted ? " (coordinator restarted)" : "");
    callbacks_.on_session(restarted);
    while (stream->Read(&message)) {
      if (message.has_shutdown()) {
        retry_after =
            std::chrono::milliseconds(message.shutdown().retry_after_ms());
        LOG(INFO) << "coordinator shutting down ("
                  << message.shutdown().reason() << "); reconnecting in "
                  << retry_after.count() << " ms";
        context.TryCancel();
        break;
      }
      if (message.has_heartbeat_ack()) continue;
      callbacks_.on_message(message);
    }
  }
  // Cancelling first releases a writer blocked in Write (a dead peer never
  // opens its flow-control window again); taking write_mu_ before that
  // would wait for it forever.
  context.TryCancel();
  {
    absl::MutexLock write_lock(&write_mu_);
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
    context_ = nullptr;
  }
  const grpc::Status status = stream->Finish();
  if (accepted) {
    LOG(WARNING) << "coordinator session ended: " << status.error_message()
                 << "; reconnecting";
  } else {
    VLOG(1) << "coordinator not reachable: " << status.error_message();
  }
  return SessionEnd{retry_after, accepted};
}

void CoordinatorClient::HeartbeatLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      const absl::Duration interval = absl::FromChrono(heartbeat_interval_);
      const absl::Duration since = clock_->Now() - last_sent_;
      if (stream_ == nullptr) {
        // Until a session is accepted: its interval (the coordinator's, often
        // shorter than ours) counts from then, not from the end of a wait
        // that began before it.
        const auto session_or_stop = [this]()
                                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                           return stop_ || stream_ != nullptr;
                                         };
        mu_.AwaitWithTimeout(absl::Condition(&session_or_stop), interval);
        continue;
      }
      if (since < interval) {
        // Clock is the wall clock: the wait is bounded by the interval
        // whatever a step of the system clock does to `since`.
        mu_.AwaitWithTimeout(absl::Condition(&stop_),
                             std::min(interval - since, interval));
        continue;
      }
    }
    v1::AgentMessage message;
    message.mutable_heartbeat()->set_sent_unix_us(
        absl::ToUnixMicros(clock_->Now()));
    Send(std::move(message));
  }
}

}  // namespace baton::agent
