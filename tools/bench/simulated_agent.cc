// SimulatedAgent: one agent's AgentSession stream on gRPC's async API.

#include "tools/bench/simulated_agent.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace baton::bench {
namespace {

// An agent's read arena past this size is freed after the message that grew
// it (a large membership) instead of being kept for the next read.
constexpr size_t kArenaKeepBytes = 64 << 10;

// Called from the main thread only.
std::string RandomInstance() {
  static std::mt19937_64 random(std::random_device{}());
  return absl::StrFormat("%016x", random());
}

// Large blocks: a membership of thousands of nodes parses several times
// faster than with the default 8 KiB maximum.
google::protobuf::ArenaOptions ReadArenaOptions() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 4 << 10;
  options.max_block_size = 1 << 20;
  return options;
}

}  // namespace

SimulatedAgent::SimulatedAgent(int32_t index, int32_t nodes, std::string job,
                               grpc::CompletionQueue* queue,
                               LoadRecorder* recorder, Ticker* ticker,
                               bool probe, MembershipStore* memberships)
    : index_(index),
      nodes_(nodes),
      job_(std::move(job)),
      node_name_(absl::StrCat("sim-", index)),
      instance_(RandomInstance()),
      queue_(queue),
      recorder_(recorder),
      ticker_(ticker),
      memberships_(memberships),
      probe_(probe),
      read_tag_(this, &SimulatedAgent::OnReadDone),
      write_tag_(this, &SimulatedAgent::OnWriteDone),
      finish_tag_(this, &SimulatedAgent::OnFinishDone),
      context_(std::make_unique<grpc::ClientContext>()),
      arena_(ReadArenaOptions()),
      inbound_(NewInbound()) {}

void SimulatedAgent::Start(v1::Coordinator::Stub* stub, absl::Time deadline) {
  context_->set_deadline(absl::ToChronoTime(deadline));
  OpenStream(stub, /*reconnect=*/false);
}

void SimulatedAgent::Reconnect(v1::Coordinator::Stub* stub,
                               absl::Time deadline) {
  stream_.reset();
  context_ = std::make_unique<grpc::ClientContext>();
  context_->set_deadline(absl::ToChronoTime(deadline));
  // As the agent's session retries do: wait for the channel to reach the
  // new coordinator (its reconnect backoff, at most 2 s, as the agent's).
  context_->set_wait_for_ready(true);
  inbound_->Clear();
  OpenStream(stub, /*reconnect=*/true);
}

void SimulatedAgent::OpenStream(v1::Coordinator::Stub* stub, bool reconnect) {
  v1::AgentMessage hello;
  hello.mutable_hello()->set_node_name(node_name_);
  hello.mutable_hello()->set_agent_instance(instance_);
  hello.mutable_hello()->set_agent_version("baton-coordinator-load");
  {
    absl::MutexLock lock(&mu_);
    outbound_.clear();
    hello.set_seq(++seq_);
    outbound_.push_back(std::move(hello));
    // StartCall takes the write slot: Hello is written once it completed,
    // and nothing else starts before the stream below exists.
    write_in_flight_ = true;
    outstanding_ = 2;  // StartCall and the first Read
    leaving_ = false;
    writes_done_ = false;
    read_over_ = false;
    stream_over_ = false;
    finish_started_ = false;
    reconnected_ = reconnect;
    rejoin_pending_ = false;
    // No step report before the rejoin is accepted.
    rank_ = -1;
  }
  stream_ = stub->PrepareAsyncAgentSession(context_.get(), queue_);
  stream_->StartCall(&write_tag_);
  stream_->Read(inbound_, &read_tag_);
}

void SimulatedAgent::Join() {
  v1::AgentMessage message;
  v1::JoinJob* join = message.mutable_join();
  join->set_job(job_);
  join->set_data_address(absl::StrCat("127.0.0.1:", 10000 + index_ % 50000));
  join->set_local_size(1);
  join->set_expected_nodes(nodes_);
  Send(std::move(message));
}

void SimulatedAgent::Leave() {
  NextOperation next;
  {
    absl::MutexLock lock(&mu_);
    if (finish_started_ || leaving_) return;
    v1::AgentMessage message;
    message.set_seq(++seq_);
    v1::LeaveJob* leave = message.mutable_leave();
    leave->set_job(job_);
    leave->set_generation(generation_);
    leave->set_finished(true);
    leave->set_reason("load test over");
    outbound_.push_back(std::move(message));
    leaving_ = true;
    next = Advance();
  }
  StartOperation(std::move(next));
}

void SimulatedAgent::OnTimer(TimerKind kind) {
  v1::AgentMessage message;
  if (kind == TimerKind::kHeartbeat) {
    absl::MutexLock lock(&mu_);
    if (!probe_ && absl::Now() - last_sent_ < heartbeat_interval_) return;
    // Stamped when its write starts (Advance).
    message.mutable_heartbeat();
  } else {
    absl::MutexLock lock(&mu_);
    if (rank_ < 0) return;  // Not sealed (yet, or any more).
    v1::StepReport* report = message.mutable_step_report();
    report->set_job(job_);
    report->set_generation(generation_);
    v1::RankProgress* progress = report->add_ranks();
    progress->set_rank(rank_);
    progress->set_completed_step(completed_step_++);
    report->mutable_stats()->set_throughput_bytes_per_second(1e9);
  }
  if (kind == TimerKind::kReport) {
    recorder_->Count(&LoadRecorder::Counters::reports);
  }
  Send(std::move(message));
}

void SimulatedAgent::OnReadDone(bool ok) {
  if (!ok) {
    NextOperation next;
    {
      absl::MutexLock lock(&mu_);
      --outstanding_;
      read_over_ = true;
      stream_over_ = true;
      next = Advance();
    }
    StartOperation(std::move(next));
    return;
  }
  Handle(*inbound_);
  if (arena_.SpaceUsed() > kArenaKeepBytes) {
    arena_.Reset();
    inbound_ = NewInbound();
  } else {
    inbound_->Clear();
  }
  // The next Read takes over the one that completed: outstanding_ stays.
  stream_->Read(inbound_, &read_tag_);
}

void SimulatedAgent::OnWriteDone(bool ok) {
  NextOperation next;
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    write_in_flight_ = false;
    if (!ok) stream_over_ = true;
    next = Advance();
  }
  StartOperation(std::move(next));
}

// A client's Finish always completes ok; status_ holds the outcome.
void SimulatedAgent::OnFinishDone(bool /*ok*/) {
  bool leaving;
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    // Finish starts only after every other operation completed (Advance).
    CHECK_EQ(outstanding_, 0)
        << node_name_ << ": the stream finished with operations in flight";
    leaving = leaving_;
  }
  // The last touch of this object for the stream: once the recorder counts
  // it ended, main may reconnect or destroy the agent.
  recorder_->StreamEnded(node_name_, status_, leaving);
}

v1::CoordinatorMessage* SimulatedAgent::NewInbound() {
  return google::protobuf::Arena::CreateMessage<v1::CoordinatorMessage>(
      &arena_);
}

void SimulatedAgent::Handle(const v1::CoordinatorMessage& message) {
  switch (message.body_case()) {
    case v1::CoordinatorMessage::kSessionAccepted:
      HandleSessionAccepted(message.session_accepted());
      return;
    case v1::CoordinatorMessage::kJoinAccepted: {
      bool rejoined = false;
      {
        absl::MutexLock lock(&mu_);
        if (rejoin_pending_) {
          rejoin_pending_ = false;
          rejoined = true;
          rank_ = sealed_rank_;
        }
      }
      if (rejoined) {
        recorder_->Rejoined();
      } else {
        recorder_->JoinAccepted();
      }
      return;
    }
    case v1::CoordinatorMessage::kMembership:
      HandleMembership(message.membership());
      return;
    case v1::CoordinatorMessage::kHeartbeatAck:
      recorder_->HeartbeatAcked(message.heartbeat_ack().sent_unix_us(),
                                NowUnixMicros());
      return;
    case v1::CoordinatorMessage::kError:
      recorder_->ErrorReceived(node_name_, message.error());
      return;
    case v1::CoordinatorMessage::kGenerationAborted: {
      absl::MutexLock lock(&mu_);
      rank_ = -1;
      recorder_->Count(&LoadRecorder::Counters::aborted_generations);
      return;
    }
    case v1::CoordinatorMessage::kPlan:
      if (memberships_ != nullptr) {
        absl::MutexLock lock(&mu_);
        plan_ = message.plan();
      }
      recorder_->Count(&LoadRecorder::Counters::plans);
      return;
    case v1::CoordinatorMessage::kJoinPending: {
      // As elastic trainers at their next commit: admit the waiting nodes.
      v1::AgentMessage admit;
      admit.mutable_admit_joins()->set_job(message.join_pending().job());
      admit.mutable_admit_joins()->set_generation(
          message.join_pending().generation());
      Send(std::move(admit));
      return;
    }
    case v1::CoordinatorMessage::kJobEnded:
      recorder_->Count(&LoadRecorder::Counters::job_ended);
      return;
    case v1::CoordinatorMessage::kShutdown:
      recorder_->Count(&LoadRecorder::Counters::shutdowns);
      return;
    case v1::CoordinatorMessage::kTimelineRequest: {
      // A simulated agent runs no collectives: it has nothing recorded.
      v1::AgentMessage reply;
      reply.mutable_timeline_reply()->set_request_id(
          message.timeline_request().request_id());
      reply.mutable_timeline_reply()->set_job(message.timeline_request().job());
      Send(std::move(reply));
      return;
    }
    case v1::CoordinatorMessage::BODY_NOT_SET:
      return;
  }
}

void SimulatedAgent::HandleSessionAccepted(
    const v1::SessionAccepted& accepted) {
  v1::AgentMessage rejoin;
  bool start_timers = false;
  bool reconnected = false;
  {
    absl::MutexLock lock(&mu_);
    start_timers = !timers_started_;
    timers_started_ = true;
    heartbeat_interval_ = absl::Milliseconds(
        std::max<int64_t>(1, accepted.heartbeat_interval_ms()));
    reconnected = reconnected_;
    if (reconnected && membership_ != nullptr) {
      // What agent/job_membership.cc re-reports on a new session.
      v1::RejoinJob* body = rejoin.mutable_rejoin();
      *body->mutable_membership() = *membership_;
      if (plan_.version() > 0) *body->mutable_plan() = plan_;
      body->set_completed_step(completed_step_ - 1);
      body->set_expected_nodes(nodes_);
      rejoin_pending_ = true;
    }
  }
  if (start_timers) {
    const absl::Time now = absl::Now();
    const absl::Duration heartbeat = absl::Milliseconds(
        std::max<int64_t>(1, accepted.heartbeat_interval_ms()));
    const absl::Duration report =
        absl::Milliseconds(std::max<int64_t>(1, accepted.report_interval_ms()));
    ticker_->Add(index_, TimerKind::kHeartbeat, now + heartbeat, heartbeat);
    ticker_->Add(index_, TimerKind::kReport, now + report, report);
  }
  if (!reconnected) {
    recorder_->SessionAccepted();
    return;
  }
  recorder_->SessionReaccepted();
  if (rejoin.has_rejoin()) Send(std::move(rejoin));
}

void SimulatedAgent::HandleMembership(const v1::Membership& membership) {
  // The node's own view: its entry, not the whole table.
  const int32_t rank = membership.self().node_name() == node_name_
                           ? membership.self().rank_offset()
                           : -1;
  if (rank < 0) {
    v1::Error error;
    error.set_code(static_cast<int32_t>(absl::StatusCode::kInternal));
    error.set_message("the membership is addressed to another node");
    recorder_->ErrorReceived(node_name_, error);
    return;
  }
  std::shared_ptr<const v1::Membership> kept =
      memberships_ != nullptr ? memberships_->Keep(membership) : nullptr;
  {
    absl::MutexLock lock(&mu_);
    generation_ = membership.generation();
    rank_ = rank;
    sealed_rank_ = rank;
    membership_ = std::move(kept);
  }
  recorder_->MembershipReceived();
}

void SimulatedAgent::Send(v1::AgentMessage message) {
  NextOperation next;
  {
    absl::MutexLock lock(&mu_);
    if (finish_started_ || leaving_ || stream_over_) return;
    message.set_seq(++seq_);
    outbound_.push_back(std::move(message));
    last_sent_ = absl::Now();
    next = Advance();
  }
  StartOperation(std::move(next));
}

SimulatedAgent::NextOperation SimulatedAgent::Advance() {
  using Kind = NextOperation::Kind;
  NextOperation next;
  if (write_in_flight_ || finish_started_) return next;
  if (stream_over_) {
    outbound_.clear();
    // Finish once the Read failed too: gRPC allows no Finish beside a Read,
    // and the call's status follows its last message.
    if (read_over_) next.kind = Kind::kFinish;
  } else if (!outbound_.empty()) {
    next.kind = Kind::kWrite;
    next.message = std::move(outbound_.front());
    outbound_.pop_front();
    // The round trip starts when the heartbeat leaves the agent, not while
    // it waits behind the agent's previous write (at the default intervals
    // a step report falls due with every heartbeat).
    if (next.message.has_heartbeat()) {
      next.message.mutable_heartbeat()->set_sent_unix_us(
          recorder_->StampHeartbeat());
    }
  } else if (leaving_ && !writes_done_) {
    writes_done_ = true;
    next.kind = Kind::kWritesDone;
  }
  if (next.kind == Kind::kWrite || next.kind == Kind::kWritesDone) {
    write_in_flight_ = true;
  }
  if (next.kind == Kind::kFinish) finish_started_ = true;
  if (next.kind != Kind::kNone) ++outstanding_;
  return next;
}

void SimulatedAgent::StartOperation(NextOperation next) {
  switch (next.kind) {
    case NextOperation::Kind::kNone:
      return;
    case NextOperation::Kind::kWrite:
      // gRPC serializes the message in Write: it need not outlive the call.
      stream_->Write(next.message, &write_tag_);
      return;
    case NextOperation::Kind::kWritesDone:
      stream_->WritesDone(&write_tag_);
      return;
    case NextOperation::Kind::kFinish:
      stream_->Finish(&status_, &finish_tag_);
      return;
  }
}

}  // namespace baton::bench
