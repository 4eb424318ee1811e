// SimulatedAgent: one agent's AgentSession stream as a gRPC callback reactor.

#include "tools/bench/simulated_agent.h"

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
                               LoadRecorder* recorder, Ticker* ticker,
                               MembershipStore* memberships)
    : index_(index),
      nodes_(nodes),
      job_(std::move(job)),
      node_name_(absl::StrCat("sim-", index)),
      instance_(RandomInstance()),
      recorder_(recorder),
      ticker_(ticker),
      memberships_(memberships),
      context_(std::make_unique<grpc::ClientContext>()),
      arena_(ReadArenaOptions()),
      inbound_(NewInbound()) {}

void SimulatedAgent::Start(v1::Coordinator::Stub* stub, absl::Time deadline) {
  context_->set_deadline(absl::ToChronoTime(deadline));
  OpenStream(stub);
}

void SimulatedAgent::Reconnect(v1::Coordinator::Stub* stub,
                               absl::Time deadline) {
  context_ = std::make_unique<grpc::ClientContext>();
  context_->set_deadline(absl::ToChronoTime(deadline));
  // As the agent's session retries do: wait for the channel to reach the
  // new coordinator (its reconnect backoff, at most 2 s, as the agent's).
  context_->set_wait_for_ready(true);
  inbound_->Clear();
  OpenStream(stub);
}

void SimulatedAgent::OpenStream(v1::Coordinator::Stub* stub) {
  // Nothing is written until the flags below are reset: the stream is bound
  // first.
  stub->async()->AgentSession(context_.get(), this);
  AddHold();
  StartRead(inbound_);
  {
    absl::MutexLock lock(&mu_);
    reconnected_ = hold_released_;
    outbound_.clear();
    write_in_flight_ = false;
    stream_over_ = false;
    hold_released_ = false;
    leaving_ = false;
    rejoin_pending_ = false;
    // No step report before the rejoin is accepted.
    rank_ = -1;
  }
  v1::AgentMessage hello;
  hello.mutable_hello()->set_node_name(node_name_);
  hello.mutable_hello()->set_agent_instance(instance_);
  hello.mutable_hello()->set_agent_version("baton-coordinator-load");
  Send(std::move(hello));
  StartCall();
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
  absl::ReleasableMutexLock lock(&mu_);
  if (hold_released_ || leaving_) return;
  v1::AgentMessage message;
  message.set_seq(++seq_);
  v1::LeaveJob* leave = message.mutable_leave();
  leave->set_job(job_);
  leave->set_generation(generation_);
  leave->set_finished(true);
  leave->set_reason("load test over");
  outbound_.push_back(std::move(message));
  leaving_ = true;
  Advance(lock);
}

void SimulatedAgent::OnTimer(TimerKind kind) {
  v1::AgentMessage message;
  if (kind == TimerKind::kHeartbeat) {
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
    absl::ReleasableMutexLock lock(&mu_);
    stream_over_ = true;
    Advance(lock);
    return;
  }
  Handle(*inbound_);
  if (arena_.SpaceUsed() > kArenaKeepBytes) {
    arena_.Reset();
    inbound_ = NewInbound();
  } else {
    inbound_->Clear();
  }
  StartRead(inbound_);
}

void SimulatedAgent::OnWriteDone(bool ok) {
  absl::ReleasableMutexLock lock(&mu_);
  write_in_flight_ = false;
  if (!ok) stream_over_ = true;
  Advance(lock);
}

void SimulatedAgent::OnDone(const grpc::Status& status) {
  bool leaving;
  {
    absl::MutexLock lock(&mu_);
    leaving = leaving_;
  }
  recorder_->StreamEnded(node_name_, status, leaving);
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
  absl::ReleasableMutexLock lock(&mu_);
  if (hold_released_ || leaving_ || stream_over_) return;
  message.set_seq(++seq_);
  outbound_.push_back(std::move(message));
  Advance(lock);
}

void SimulatedAgent::Advance(absl::ReleasableMutexLock& lock) {
  bool write = false;
  bool writes_done = false;
  bool release_hold = false;
  if (!write_in_flight_ && !hold_released_) {
    if (stream_over_) {
      outbound_.clear();
      release_hold = true;
    } else if (!outbound_.empty()) {
      in_flight_ = std::move(outbound_.front());
      outbound_.pop_front();
      // The round trip starts when the heartbeat leaves the agent, not
      // while it waits behind the agent's previous write (at the default
      // intervals a step report falls due with every heartbeat).
      if (in_flight_.has_heartbeat()) {
        in_flight_.mutable_heartbeat()->set_sent_unix_us(
            recorder_->StampHeartbeat());
      }
      write_in_flight_ = true;
      write = true;
    } else if (leaving_) {
      writes_done = true;
      release_hold = true;
    }
    hold_released_ = release_hold;
  }
  lock.Release();
  if (write) StartWrite(&in_flight_);
  if (writes_done) StartWritesDone();
  if (release_hold) RemoveHold();
}

}  // namespace baton::bench
