#include "tests/integration/test_agent.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace baton {

TestAgent::~TestAgent() {
  StopHeartbeats();
  if (reader_.joinable()) {
    Cancel();
    reader_.join();
  }
}

absl::Status TestAgent::Connect(const std::string& address,
                                const std::string& node_name,
                                const std::string& instance,
                                absl::Duration timeout) {
  if (started_) {
    return absl::FailedPreconditionError(
        "TestAgent::Connect called twice; use a new TestAgent");
  }
  const absl::Time deadline = absl::Now() + timeout;
  node_name_ = node_name;
  {
    absl::MutexLock lock(&write_mu_);
    channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    if (!channel_->WaitForConnected(absl::ToChronoTime(deadline))) {
      return absl::UnavailableError(
          absl::StrCat("agent ", node_name, " could not connect to ", address,
                       " within ", absl::FormatDuration(timeout)));
    }
    stub_ = v1::Coordinator::NewStub(channel_);
    {
      absl::MutexLock context_lock(&context_mu_);
      context_ = std::make_unique<grpc::ClientContext>();
      stream_ = stub_->AgentSession(context_.get());
    }
  }
  started_ = true;
  reader_ = std::thread([this] { ReadLoop(); });

  v1::AgentMessage hello;
  hello.mutable_hello()->set_node_name(node_name);
  hello.mutable_hello()->set_agent_instance(instance);
  hello.mutable_hello()->set_agent_version("baton-integration-test");
  const uint64_t seq = Send(std::move(hello));
  if (seq == 0) {
    return absl::UnavailableError(
        absl::StrCat("agent ", node_name, " could not send its hello"));
  }
  std::optional<v1::CoordinatorMessage> reply = WaitFor(
      [seq](const v1::CoordinatorMessage& message) {
        return message.has_session_accepted() ||
               (message.has_error() && message.reply_to() == seq);
      },
      deadline - absl::Now());
  if (!reply.has_value()) {
    const std::optional<grpc::Status> status = final_status();
    return absl::DeadlineExceededError(absl::StrCat(
        "agent ", node_name, " got no session_accepted from ", address,
        status.has_value()
            ? absl::StrCat("; the stream ended with code ",
                           status->error_code(), ": ", status->error_message())
            : absl::StrCat(" within ", absl::FormatDuration(timeout))));
  }
  if (reply->has_error()) {
    return absl::Status(static_cast<absl::StatusCode>(reply->error().code()),
                        reply->error().message());
  }
  session_accepted_ = reply->session_accepted();
  return absl::OkStatus();
}

void TestAgent::ReadLoop() {
  v1::CoordinatorMessage message;
  while (stream_->Read(&message)) {
    absl::MutexLock lock(&mu_);
    received_.push_back(std::move(message));
    message.Clear();
  }
  grpc::Status status;
  {
    // No write may run concurrently with Finish; a blocked one fails now
    // that the call is over.
    absl::MutexLock lock(&write_mu_);
    status = stream_->Finish();
    writes_done_ = true;
    // Let the connection go, as an agent moving on would: a connection that
    // no thread polls never answers the server's GOAWAY, which holds a
    // shutting-down coordinator for its whole grace period. The context
    // holds the channel too.
    stream_.reset();
    stub_.reset();
    channel_.reset();
    absl::MutexLock context_lock(&context_mu_);
    context_.reset();
  }
  absl::MutexLock lock(&mu_);
  final_status_ = std::move(status);
}

uint64_t TestAgent::Send(v1::AgentMessage message) {
  absl::MutexLock lock(&write_mu_);
  if (stream_ == nullptr || writes_done_) return 0;
  const uint64_t seq = ++next_seq_;
  message.set_seq(seq);
  return stream_->Write(message) ? seq : 0;
}

uint64_t TestAgent::Join(const std::string& job,
                         const std::string& data_address, int32_t local_size,
                         int32_t expected_nodes, int32_t min_nodes,
                         int64_t partition_bytes) {
  v1::AgentMessage message;
  v1::JoinJob* join = message.mutable_join();
  join->set_job(job);
  join->set_data_address(data_address);
  join->set_local_size(local_size);
  join->set_expected_nodes(expected_nodes);
  join->set_min_nodes(min_nodes);
  join->set_partition_bytes(partition_bytes);
  return Send(std::move(message));
}

uint64_t TestAgent::Heartbeat() {
  v1::AgentMessage message;
  message.mutable_heartbeat()->set_sent_unix_us(
      absl::ToUnixMicros(absl::Now()));
  return Send(std::move(message));
}

uint64_t TestAgent::Manifest(const std::string& job, int64_t generation,
                             const std::vector<v1::TensorSpec>& tensors) {
  v1::AgentMessage message;
  v1::Manifest* manifest = message.mutable_manifest();
  manifest->set_job(job);
  manifest->set_generation(generation);
  for (const v1::TensorSpec& tensor : tensors) {
    *manifest->add_tensors() = tensor;
  }
  return Send(std::move(message));
}

uint64_t TestAgent::StepReport(
    const std::string& job, int64_t generation,
    const std::vector<std::pair<int32_t, int64_t>>& ranks,
    const std::vector<v1::PendingTensor>& pending) {
  v1::AgentMessage message;
  v1::StepReport* report = message.mutable_step_report();
  report->set_job(job);
  report->set_generation(generation);
  for (const auto& [rank, completed_step] : ranks) {
    v1::RankProgress* progress = report->add_ranks();
    progress->set_rank(rank);
    progress->set_completed_step(completed_step);
  }
  for (const v1::PendingTensor& tensor : pending) {
    *report->add_pending() = tensor;
  }
  return Send(std::move(message));
}

uint64_t TestAgent::Leave(const std::string& job, int64_t generation,
                          bool finished, const std::string& reason) {
  v1::AgentMessage message;
  v1::LeaveJob* leave = message.mutable_leave();
  leave->set_job(job);
  leave->set_generation(generation);
  leave->set_finished(finished);
  leave->set_reason(reason);
  return Send(std::move(message));
}

std::optional<v1::CoordinatorMessage> TestAgent::WaitFor(
    const std::function<bool(const v1::CoordinatorMessage&)>& pred,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  for (;;) {
    for (auto it = received_.begin(); it != received_.end(); ++it) {
      if (pred(*it)) {
        v1::CoordinatorMessage match = std::move(*it);
        received_.erase(it);
        return match;
      }
    }
    if (final_status_.has_value()) return std::nullopt;
    const size_t seen = received_.size();
    const auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return received_.size() != seen || final_status_.has_value();
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&changed), deadline)) {
      return std::nullopt;
    }
  }
}

std::optional<v1::CoordinatorMessage> TestAgent::WaitForBody(
    v1::CoordinatorMessage::BodyCase body, absl::Duration timeout) {
  return WaitFor(
      [body](const v1::CoordinatorMessage& message) {
        return message.body_case() == body;
      },
      timeout);
}

std::optional<v1::CoordinatorMessage> TestAgent::WaitForReply(
    uint64_t seq, absl::Duration timeout) {
  return WaitFor(
      [seq](const v1::CoordinatorMessage& message) {
        return message.reply_to() == seq;
      },
      timeout);
}

std::vector<v1::CoordinatorMessage> TestAgent::Received() const {
  absl::MutexLock lock(&mu_);
  return std::vector<v1::CoordinatorMessage>(received_.begin(),
                                             received_.end());
}

std::optional<grpc::Status> TestAgent::WaitForStreamEnd(
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return final_status_.has_value();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
  return final_status_;
}

grpc::Status TestAgent::CloseStream(absl::Duration timeout) {
  StopHeartbeats();
  if (!started_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the agent is not connected");
  }
  {
    absl::MutexLock lock(&write_mu_);
    if (!writes_done_ && stream_ != nullptr) {
      writes_done_ = true;
      stream_->WritesDone();
    }
  }
  if (!WaitForStreamEnd(timeout).has_value()) Cancel();
  JoinThreads();
  return *final_status();
}

grpc::Status TestAgent::Abort() {
  StopHeartbeats();
  if (!started_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the agent is not connected");
  }
  Cancel();
  JoinThreads();
  return *final_status();
}

void TestAgent::StartHeartbeats(absl::Duration interval) {
  StopHeartbeats();
  {
    absl::MutexLock lock(&mu_);
    stop_heartbeats_ = false;
  }
  heartbeats_ = std::thread([this, interval] {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        const auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_heartbeats_ || final_status_.has_value();
        };
        if (mu_.AwaitWithTimeout(absl::Condition(&stop), interval)) return;
      }
      Heartbeat();
    }
  });
}

void TestAgent::StopHeartbeats() {
  {
    absl::MutexLock lock(&mu_);
    stop_heartbeats_ = true;
  }
  if (heartbeats_.joinable()) heartbeats_.join();
}

std::optional<grpc::Status> TestAgent::final_status() const {
  absl::MutexLock lock(&mu_);
  return final_status_;
}

void TestAgent::Cancel() {
  absl::MutexLock lock(&context_mu_);
  if (context_ != nullptr) context_->TryCancel();
}

void TestAgent::JoinThreads() {
  StopHeartbeats();
  // The reader ends with the stream; a cancelled call ends promptly.
  if (reader_.joinable()) reader_.join();
}

std::unique_ptr<TestAgent> TestAgent::Connected(const std::string& address,
                                                const std::string& node_name,
                                                const std::string& instance) {
  auto agent = std::make_unique<TestAgent>();
  const absl::Status connected = agent->Connect(
      address, node_name, instance.empty() ? "i-" + node_name : instance);
  EXPECT_TRUE(connected.ok()) << connected;
  agent->StartHeartbeats(absl::Milliseconds(200));
  return agent;
}

v1::Membership TestAgent::AwaitMembership(int64_t generation,
                                          absl::Duration timeout) {
  auto message = WaitFor(
      [&](const v1::CoordinatorMessage& m) {
        return m.has_membership() && m.membership().generation() == generation;
      },
      timeout);
  EXPECT_TRUE(message.has_value())
      << node_name() << ": no membership of generation " << generation;
  return message ? message->membership() : v1::Membership();
}

}  // namespace baton
