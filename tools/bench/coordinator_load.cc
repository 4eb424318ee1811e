// baton-coordinator-load: N simulated agents in one process against a running
// coordinator. Measures how long the job takes to seal, the heartbeat round
// trip in steady state, errors, and (given its pid) the coordinator's memory
// and CPU.
//
// Each agent is one AgentSession stream (a callback reactor with its own
// outbound queue and one write in flight); agents are spread over several
// channels, each its own TCP connection. One ticker thread sends every
// agent's heartbeats and step reports.

#include <gflags/gflags.h>
#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "baton/v1/status.grpc.pb.h"
#include "common/init.h"

DEFINE_string(coordinator, "", "Coordinator to load, host:port (required)");
DEFINE_int32(nodes, 100, "Simulated agents, one node and one session each");
DEFINE_int32(duration_s, 10,
             "Seconds of steady state (heartbeats and step reports) measured "
             "after the job is sealed");
DEFINE_string(job, "load", "Job every simulated agent joins");
DEFINE_int32(coordinator_pid, 0,
             "The coordinator's process id, to sample its memory and CPU "
             "from /proc (0: do not sample)");
DEFINE_bool(json, false,
            "Print the results as one JSON line on stdout (the human summary "
            "then goes to stderr)");
DEFINE_bool(print_status, false,
            "Before the agents leave, print the job as Status.GetJob reports "
            "it");
DEFINE_int32(connect_timeout_s, 30,
             "Seconds every session may take to be accepted");
DEFINE_int32(seal_timeout_s, 60,
             "Seconds from the first JoinJob until every agent must have its "
             "membership");
DEFINE_int32(agents_per_channel, 256,
             "Sessions per channel (TCP connection) to the coordinator");

namespace baton {
namespace {

constexpr char kUsage[] =
    "baton-coordinator-load: simulates --nodes agents against a running "
    "coordinator and reports time to seal, heartbeat round trip, errors and "
    "the coordinator's memory and CPU.\n"
    "Usage: baton-coordinator-load --coordinator=host:port [--nodes=N] "
    "[--duration_s=S] [--coordinator_pid=PID] [--json] [--print_status]";

// An agent's read arena past this size is freed after the message that grew
// it (a large membership) instead of being kept for the next read.
constexpr size_t kArenaKeepBytes = 64 << 10;
// How long the reachability probe, the streams' ending after LeaveJob and
// Status.GetJob may take.
constexpr absl::Duration kReachTimeout = absl::Seconds(5);
constexpr absl::Duration kLeaveTimeout = absl::Seconds(30);
constexpr absl::Duration kStatusTimeout = absl::Seconds(10);
constexpr size_t kKeptTexts = 5;

int64_t NowUnixMicros() { return absl::GetCurrentTimeNanos() / 1000; }

// Everything the agents observe, for the summary. Thread-safe.
class LoadRecorder {
 public:
  struct Progress {
    int count = 0;
    absl::Time first = absl::InfiniteFuture();
    absl::Time last = absl::InfinitePast();
  };
  struct Counters {
    int64_t errors = 0;
    int64_t stream_failures = 0;
    int64_t clean_closes = 0;
    int64_t heartbeats = 0;
    int64_t reports = 0;
    int64_t window_heartbeats = 0;
    int64_t aborted_generations = 0;
    int64_t plans = 0;
    int64_t job_ended = 0;
    int64_t shutdowns = 0;
  };
  void SessionAccepted() { Bump(&accepted_, absl::Now()); }
  void JoinAccepted() { Bump(&joins_accepted_, absl::Now()); }
  void MembershipReceived() { Bump(&memberships_, absl::Now()); }
  void Count(int64_t LoadRecorder::Counters::*counter) {
    absl::MutexLock lock(&mu_);
    ++(counters_.*counter);
  }

  void ErrorReceived(const std::string& node, const v1::Error& error) {
    absl::MutexLock lock(&mu_);
    ++counters_.errors;
    if (error_texts_.size() < kKeptTexts) {
      error_texts_.push_back(absl::StrFormat(
          "%s: %s (job %s gen %d): %s", node,
          absl::StatusCodeToString(static_cast<absl::StatusCode>(error.code())),
          error.job(), error.generation(), error.message()));
    }
  }

  // `leaving`: the agent had sent its LeaveJob, so an OK end is expected.
  void StreamEnded(const std::string& node, const grpc::Status& status,
                   bool leaving) {
    absl::MutexLock lock(&mu_);
    ++ended_;
    if (status.ok() && leaving) {
      ++counters_.clean_closes;
      return;
    }
    ++counters_.stream_failures;
    if (stream_texts_.size() < kKeptTexts) {
      stream_texts_.push_back(absl::StrFormat(
          "%s: stream ended %s: %s", node,
          absl::StatusCodeToString(
              static_cast<absl::StatusCode>(status.error_code())),
          status.ok() ? "before the agent left" : status.error_message()));
    }
  }

  // Round trips count only for heartbeats stamped inside the window, which
  // opens now and lasts `length`. Returns when it ends.
  absl::Time OpenWindow(absl::Duration length) {
    absl::MutexLock lock(&mu_);
    window_begin_us_ = NowUnixMicros();
    window_end_us_ = window_begin_us_ + absl::ToInt64Microseconds(length);
    return absl::FromUnixMicros(window_end_us_);
  }
  // The send time for a heartbeat, taken under the same lock as the window
  // so that every heartbeat counted here is also one whose answer counts.
  int64_t StampHeartbeat() {
    absl::MutexLock lock(&mu_);
    const int64_t now_us = NowUnixMicros();
    ++counters_.heartbeats;
    if (now_us >= window_begin_us_ && now_us <= window_end_us_) {
      ++counters_.window_heartbeats;
    }
    return now_us;
  }
  void HeartbeatAcked(int64_t sent_us, int64_t now_us) {
    absl::MutexLock lock(&mu_);
    if (sent_us >= window_begin_us_ && sent_us <= window_end_us_) {
      round_trips_us_.push_back(now_us - sent_us);
    }
  }

  // Waits until `count` sessions were accepted / joins accepted /
  // memberships received / streams ended; false at `deadline`.
  bool AwaitAccepted(int count, absl::Time deadline) {
    return Await(&accepted_, count, deadline);
  }
  bool AwaitMemberships(int count, absl::Time deadline) {
    return Await(&memberships_, count, deadline);
  }
  bool AwaitEnded(int count, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ >= count;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&reached), deadline);
  }

  struct Snapshot {
    Progress accepted, joins_accepted, memberships;
    Counters counters;
    std::vector<int64_t> round_trips_us;
    std::vector<std::string> error_texts, stream_texts;
  };
  Snapshot Take() const {
    absl::MutexLock lock(&mu_);
    return {accepted_,       joins_accepted_, memberships_, counters_,
            round_trips_us_, error_texts_,    stream_texts_};
  }

 private:
  void Bump(Progress* progress, absl::Time now) {
    absl::MutexLock lock(&mu_);
    ++progress->count;
    progress->first = std::min(progress->first, now);
    progress->last = std::max(progress->last, now);
  }
  bool Await(const Progress* progress, int count, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return progress->count >= count;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&reached), deadline);
  }

  mutable absl::Mutex mu_;
  Progress accepted_ ABSL_GUARDED_BY(mu_);
  Progress joins_accepted_ ABSL_GUARDED_BY(mu_);
  Progress memberships_ ABSL_GUARDED_BY(mu_);
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  int64_t window_begin_us_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  int64_t window_end_us_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  std::vector<int64_t> round_trips_us_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> error_texts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> stream_texts_ ABSL_GUARDED_BY(mu_);
};

enum class TimerKind : uint8_t { kHeartbeat, kReport };

// One thread firing every agent's periodic timers at a fixed rate (due times
// do not drift when a firing is late). Thread-safe.
class Ticker {
 public:
  using FireFn = std::function<void(int32_t agent, TimerKind kind)>;

  explicit Ticker(FireFn fire)
      : fire_(std::move(fire)), thread_([this] { Run(); }) {}
  ~Ticker() {
    Stop();
    thread_.join();
  }

  void Add(int32_t agent, TimerKind kind, absl::Time first,
           absl::Duration interval) {
    absl::MutexLock lock(&mu_);
    heap_.push({first, interval, agent, kind});
    ++version_;
  }

  // Ends the firing; a batch the thread already took is still fired.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  // The latest any timer fired after its due time.
  absl::Duration max_lag() const {
    absl::MutexLock lock(&mu_);
    return max_lag_;
  }

 private:
  struct Entry {
    absl::Time due;
    absl::Duration interval;
    int32_t agent;
    TimerKind kind;
    bool operator>(const Entry& other) const { return due > other.due; }
  };

  void Run() {
    std::vector<Entry> due;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        for (Entry& entry : due) {
          entry.due += entry.interval;
          heap_.push(entry);
        }
        due.clear();
        absl::Time now;
        for (;;) {
          if (stopped_) return;
          now = absl::Now();
          if (!heap_.empty() && heap_.top().due <= now) break;
          const uint64_t seen = version_;
          const auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stopped_ || version_ != seen;
          };
          mu_.AwaitWithDeadline(
              absl::Condition(&changed),
              heap_.empty() ? absl::InfiniteFuture() : heap_.top().due);
        }
        while (!heap_.empty() && heap_.top().due <= now) {
          max_lag_ = std::max(max_lag_, now - heap_.top().due);
          due.push_back(heap_.top());
          heap_.pop();
        }
      }
      for (const Entry& entry : due) fire_(entry.agent, entry.kind);
    }
  }

  const FireFn fire_;
  mutable absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_
      ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration max_lag_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

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

// One simulated agent: Hello, JoinJob, then heartbeats and step reports
// until Leave. Owned by main; it must outlive OnDone (the recorder's
// AwaitEnded).
//
// Thread-safety: Join, Leave, Cancel and OnTimer may be called from any
// thread. gRPC operations are started outside mu_ (a reaction may run at
// once on another thread and take mu_); the decision to start one is made
// under mu_, so there is at most one write in flight, WritesDone follows the
// last write, and the hold that keeps the stream alive for writes from
// outside reactions is removed exactly once, after the last operation was
// started.
class SimulatedAgent final
    : public grpc::ClientBidiReactor<v1::AgentMessage, v1::CoordinatorMessage> {
 public:
  SimulatedAgent(int32_t index, int32_t nodes, LoadRecorder* recorder,
                 Ticker* ticker)
      : index_(index),
        nodes_(nodes),
        node_name_(absl::StrCat("sim-", index)),
        recorder_(recorder),
        ticker_(ticker),
        arena_(ReadArenaOptions()),
        inbound_(NewInbound()) {}

  void Start(v1::Coordinator::Stub* stub, absl::Time deadline) {
    context_.set_deadline(absl::ToChronoTime(deadline));
    stub->async()->AgentSession(&context_, this);
    AddHold();
    StartRead(inbound_);
    v1::AgentMessage hello;
    hello.mutable_hello()->set_node_name(node_name_);
    hello.mutable_hello()->set_agent_instance(RandomInstance());
    hello.mutable_hello()->set_agent_version("baton-coordinator-load");
    Send(std::move(hello));
    StartCall();
  }

  void Join() {
    v1::AgentMessage message;
    v1::JoinJob* join = message.mutable_join();
    join->set_job(FLAGS_job);
    join->set_data_address(absl::StrCat("127.0.0.1:", 10000 + index_ % 50000));
    join->set_local_size(1);
    join->set_expected_nodes(nodes_);
    Send(std::move(message));
  }

  // Sends LeaveJob{finished} and then ends the stream's writes.
  void Leave() {
    absl::ReleasableMutexLock lock(&mu_);
    if (hold_released_ || leaving_) return;
    v1::AgentMessage message;
    message.set_seq(++seq_);
    v1::LeaveJob* leave = message.mutable_leave();
    leave->set_job(FLAGS_job);
    leave->set_generation(generation_);
    leave->set_finished(true);
    leave->set_reason("load test over");
    outbound_.push_back(std::move(message));
    leaving_ = true;
    Advance(lock);
  }

  void Cancel() { context_.TryCancel(); }

  void OnTimer(TimerKind kind) {
    v1::AgentMessage message;
    if (kind == TimerKind::kHeartbeat) {
      // Stamped when its write starts (Advance).
      message.mutable_heartbeat();
    } else {
      absl::MutexLock lock(&mu_);
      if (rank_ < 0) return;  // Not sealed (yet, or any more).
      v1::StepReport* report = message.mutable_step_report();
      report->set_job(FLAGS_job);
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

  void OnReadDone(bool ok) override {
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

  void OnWriteDone(bool ok) override {
    absl::ReleasableMutexLock lock(&mu_);
    write_in_flight_ = false;
    if (!ok) stream_over_ = true;
    Advance(lock);
  }

  void OnDone(const grpc::Status& status) override {
    bool leaving;
    {
      absl::MutexLock lock(&mu_);
      leaving = leaving_;
    }
    recorder_->StreamEnded(node_name_, status, leaving);
  }

 private:
  v1::CoordinatorMessage* NewInbound() {
    return google::protobuf::Arena::CreateMessage<v1::CoordinatorMessage>(
        &arena_);
  }

  void Handle(const v1::CoordinatorMessage& message) {
    switch (message.body_case()) {
      case v1::CoordinatorMessage::kSessionAccepted: {
        const v1::SessionAccepted& accepted = message.session_accepted();
        const absl::Time now = absl::Now();
        const absl::Duration heartbeat = absl::Milliseconds(
            std::max<int64_t>(1, accepted.heartbeat_interval_ms()));
        const absl::Duration report = absl::Milliseconds(
            std::max<int64_t>(1, accepted.report_interval_ms()));
        ticker_->Add(index_, TimerKind::kHeartbeat, now + heartbeat, heartbeat);
        ticker_->Add(index_, TimerKind::kReport, now + report, report);
        recorder_->SessionAccepted();
        return;
      }
      case v1::CoordinatorMessage::kJoinAccepted:
        recorder_->JoinAccepted();
        return;
      case v1::CoordinatorMessage::kMembership: {
        const v1::Membership& membership = message.membership();
        int32_t rank = -1;
        for (const v1::NodeInfo& node : membership.nodes()) {
          if (node.node_name() == node_name_) rank = node.rank_offset();
        }
        if (rank < 0) {
          v1::Error error;
          error.set_code(static_cast<int32_t>(absl::StatusCode::kInternal));
          error.set_message("the membership does not list this node");
          recorder_->ErrorReceived(node_name_, error);
          return;
        }
        {
          absl::MutexLock lock(&mu_);
          generation_ = membership.generation();
          rank_ = rank;
        }
        recorder_->MembershipReceived();
        return;
      }
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
        recorder_->Count(&LoadRecorder::Counters::plans);
        return;
      case v1::CoordinatorMessage::kJobEnded:
        recorder_->Count(&LoadRecorder::Counters::job_ended);
        return;
      case v1::CoordinatorMessage::kShutdown:
        recorder_->Count(&LoadRecorder::Counters::shutdowns);
        return;
      case v1::CoordinatorMessage::BODY_NOT_SET:
        return;
    }
  }

  void Send(v1::AgentMessage message) {
    absl::ReleasableMutexLock lock(&mu_);
    if (hold_released_ || leaving_ || stream_over_) return;
    message.set_seq(++seq_);
    outbound_.push_back(std::move(message));
    Advance(lock);
  }

  // Starts the next write, or WritesDone once the LeaveJob is written, or
  // gives up the hold once no more writes can happen. Releases `lock`.
  void Advance(absl::ReleasableMutexLock& lock)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  // Constant after construction.
  const int32_t index_;
  const int32_t nodes_;
  const std::string node_name_;
  LoadRecorder* const recorder_;
  Ticker* const ticker_;
  grpc::ClientContext context_;

  // Only touched by StartRead and OnReadDone, which never overlap.
  google::protobuf::Arena arena_;
  v1::CoordinatorMessage* inbound_;

  absl::Mutex mu_;
  std::deque<v1::AgentMessage> outbound_ ABSL_GUARDED_BY(mu_);
  // Untouched between its StartWrite and OnWriteDone.
  v1::AgentMessage in_flight_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  // The stream failed or the coordinator ended it: nothing more to write.
  bool stream_over_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  // From the latest membership; rank_ is -1 while not sealed.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t rank_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t completed_step_ ABSL_GUARDED_BY(mu_) = 0;
};

// The coordinator process as /proc shows it.
struct ProcessSample {
  bool ok = false;
  double rss_mib = 0;
  double hwm_mib = 0;
  double cpu_s = 0;
};

ProcessSample SampleProcess(int pid) {
  ProcessSample sample;
  if (pid <= 0) return sample;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    std::istringstream fields(line);
    std::string key;
    double kib = 0;
    fields >> key >> kib;
    if (key == "VmRSS:") sample.rss_mib = kib / 1024;
    if (key == "VmHWM:") sample.hwm_mib = kib / 1024;
  }
  std::ifstream stat_file(absl::StrCat("/proc/", pid, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(stat_file)),
                         std::istreambuf_iterator<char>());
  // The command may contain spaces; fields after it start with the state
  // (field 3), so utime (14) and stime (15) are the 12th and 13th.
  const size_t comm_end = stat.rfind(')');
  if (comm_end == std::string::npos) return sample;
  std::istringstream fields(stat.substr(comm_end + 1));
  std::vector<std::string> values;
  for (std::string value; values.size() < 13 && fields >> value;) {
    values.push_back(value);
  }
  if (values.size() < 13) return sample;
  const double ticks = std::strtod(values[11].c_str(), nullptr) +
                       std::strtod(values[12].c_str(), nullptr);
  sample.cpu_s = ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  sample.ok = true;
  return sample;
}

double OwnCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

void RaiseFdLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    std::fprintf(stderr, "warning: could not raise the fd limit to %llu\n",
                 static_cast<unsigned long long>(limit.rlim_max));
  }
}

std::shared_ptr<grpc::Channel> NewChannel(int index) {
  grpc::ChannelArguments args;
  // A local subchannel pool and a distinct argument give every channel its
  // own TCP connection, as separate agent processes would have.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("baton.load.channel", index);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  return grpc::CreateCustomChannel(FLAGS_coordinator,
                                   grpc::InsecureChannelCredentials(), args);
}

absl::Status GetJob(const std::shared_ptr<grpc::Channel>& channel,
                    absl::Duration timeout, v1::JobStatus* job) {
  std::unique_ptr<v1::Status::Stub> stub = v1::Status::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::GetJobRequest request;
  request.set_job(FLAGS_job);
  const grpc::Status status = stub->GetJob(&context, request, job);
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// When the coordinator recorded the job's latest seal; InfinitePast if its
// event log has none.
absl::Time SealedAt(const v1::JobStatus& job) {
  absl::Time sealed = absl::InfinitePast();
  for (const v1::JobEvent& event : job.events()) {
    if (event.kind() == "sealed") {
      sealed = absl::FromUnixMillis(event.unix_ms());
    }
  }
  return sealed;
}

void PrintJob(const v1::JobStatus& job, FILE* out) {
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::fprintf(out,
               "job %s: %s (%s)\n  generation %lld, world size %d, global "
               "step %lld, %d members\n",
               job.job().c_str(), v1::JobState_Name(job.state()).c_str(),
               job.state_reason().c_str(),
               static_cast<long long>(job.generation()), job.world_size(),
               static_cast<long long>(job.global_step()), job.members_size());
  for (int i = 0; i < std::min(3, job.members_size()); ++i) {
    const v1::MemberStatus& m = job.members(i);
    std::fprintf(out, "  %s rank %d at %s, last seen %lld ms ago\n",
                 m.node_name().c_str(), m.rank_offset(),
                 m.data_address().c_str(),
                 static_cast<long long>(now_ms - m.last_seen_unix_ms()));
  }
  std::fprintf(out, "  last events:\n");
  for (int i = std::max(0, job.events_size() - 5); i < job.events_size(); ++i) {
    const v1::JobEvent& e = job.events(i);
    std::fprintf(
        out, "    %s %s (gen %lld): %s\n",
        absl::FormatTime("%H:%M:%E3S", absl::FromUnixMillis(e.unix_ms()),
                         absl::LocalTimeZone())
            .c_str(),
        e.kind().c_str(), static_cast<long long>(e.generation()),
        e.message().c_str());
  }
}

// What one run measured; -1 where a number was not measured.
struct Results {
  int nodes = 0;
  int channels = 0;
  bool sealed = false;
  double accept_s = -1;
  double accept_spread_s = -1;
  int memberships = 0;
  int joins_accepted = 0;
  double seal_s = -1;
  double coordinator_seal_s = -1;
  double seal_client_cpu_s = -1;
  double seal_coordinator_cpu_s = -1;
  std::vector<int64_t> round_trips_us;  // Sorted.
  int64_t window_heartbeats = 0;
  double ticker_lag_ms = 0;
  LoadRecorder::Counters counters;
  std::vector<std::string> texts;
  ProcessSample coordinator;
  double steady_cpu_pct = -1;
  double client_cpu_s = 0;
};

double PercentileMs(const std::vector<int64_t>& sorted_us, double q) {
  if (sorted_us.empty()) return -1;
  const size_t i = static_cast<size_t>(q * (sorted_us.size() - 1) + 0.5);
  return sorted_us[i] / 1000.0;
}

void PrintResults(const Results& r, FILE* human) {
  const double p50 = PercentileMs(r.round_trips_us, 0.50);
  const double p99 = PercentileMs(r.round_trips_us, 0.99);
  const double max = PercentileMs(r.round_trips_us, 1.0);
  const long long samples = static_cast<long long>(r.round_trips_us.size());
  const LoadRecorder::Counters& c = r.counters;
  const long long errors = c.errors + c.stream_failures;
  std::fprintf(human, "coordinator load: %d nodes on %d channels against %s\n",
               r.nodes, r.channels, FLAGS_coordinator.c_str());
  std::fprintf(human,
               "  sessions accepted after %.3f s (first to last %.3f s)\n",
               r.accept_s, r.accept_spread_s);
  if (r.sealed) {
    std::fprintf(human,
                 "  time to seal %.3f s from the first JoinJob to the last "
                 "membership (the coordinator's seal event: %.3f s); CPU "
                 "meanwhile: coordinator %.2f s, load generator %.2f s\n",
                 r.seal_s, r.coordinator_seal_s, r.seal_coordinator_cpu_s,
                 r.seal_client_cpu_s);
    std::fprintf(human,
                 "  heartbeat round trip in steady state: p50 %.2f ms, p99 "
                 "%.2f ms, max %.2f ms (%lld samples, %lld unanswered)\n",
                 p50, p99, max, samples,
                 static_cast<long long>(r.window_heartbeats) - samples);
  } else {
    std::fprintf(human,
                 "  NOT SEALED within %d s: %d of %d joins accepted, %d of %d "
                 "memberships received\n",
                 FLAGS_seal_timeout_s, r.joins_accepted, r.nodes, r.memberships,
                 r.nodes);
  }
  std::fprintf(human,
               "  sent %lld heartbeats and %lld step reports (ticker late by "
               "up to %.1f ms)\n",
               static_cast<long long>(c.heartbeats),
               static_cast<long long>(c.reports), r.ticker_lag_ms);
  std::fprintf(human,
               "  errors %lld (error messages %lld, failed streams %lld); "
               "closed cleanly %lld; received %lld generation_aborted, %lld "
               "plan, %lld job_ended, %lld shutdown\n",
               errors, static_cast<long long>(c.errors),
               static_cast<long long>(c.stream_failures),
               static_cast<long long>(c.clean_closes),
               static_cast<long long>(c.aborted_generations),
               static_cast<long long>(c.plans),
               static_cast<long long>(c.job_ended),
               static_cast<long long>(c.shutdowns));
  for (const std::string& text : r.texts) {
    std::fprintf(human, "    %s\n", text.c_str());
  }
  if (r.coordinator.ok) {
    std::fprintf(human,
                 "  coordinator: RSS %.1f MiB (peak %.1f MiB), CPU %.2f s "
                 "since start",
                 r.coordinator.rss_mib, r.coordinator.hwm_mib,
                 r.coordinator.cpu_s);
    if (r.steady_cpu_pct >= 0) {
      std::fprintf(human, ", %.0f%% of a core in steady state",
                   r.steady_cpu_pct);
    }
    std::fprintf(human, "\n");
  }
  if (!FLAGS_json) return;
  std::printf(
      "{\"nodes\":%d,\"channels\":%d,\"duration_s\":%d,\"sealed\":%s,"
      "\"memberships\":%d,\"accept_s\":%.4f,\"seal_s\":%.4f,"
      "\"coordinator_seal_s\":%.3f,\"seal_coordinator_cpu_s\":%.2f,"
      "\"seal_client_cpu_s\":%.2f,\"latency_samples\":%lld,"
      "\"unanswered\":%lld,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,"
      "\"ticker_lag_max_ms\":%.1f,\"heartbeats\":%lld,\"reports\":%lld,"
      "\"errors\":%lld,\"error_messages\":%lld,\"stream_failures\":%lld,"
      "\"clean_closes\":%lld,\"aborted_generations\":%lld,\"rss_mib\":%.1f,"
      "\"hwm_mib\":%.1f,\"cpu_s\":%.2f,\"steady_cpu_pct\":%.1f,"
      "\"client_cpu_s\":%.2f}\n",
      r.nodes, r.channels, FLAGS_duration_s, r.sealed ? "true" : "false",
      r.memberships, r.accept_s, r.seal_s, r.coordinator_seal_s,
      r.seal_coordinator_cpu_s, r.seal_client_cpu_s, samples,
      static_cast<long long>(r.window_heartbeats) - samples, p50, p99, max,
      r.ticker_lag_ms, static_cast<long long>(c.heartbeats),
      static_cast<long long>(c.reports), errors,
      static_cast<long long>(c.errors),
      static_cast<long long>(c.stream_failures),
      static_cast<long long>(c.clean_closes),
      static_cast<long long>(c.aborted_generations), r.coordinator.rss_mib,
      r.coordinator.hwm_mib, r.coordinator.cpu_s, r.steady_cpu_pct,
      r.client_cpu_s);
}

// Copies what every run reports, whatever phase it reached.
void Collect(const LoadRecorder& recorder, const Ticker& ticker, Results* r) {
  LoadRecorder::Snapshot s = recorder.Take();
  std::sort(s.round_trips_us.begin(), s.round_trips_us.end());
  r->memberships = s.memberships.count;
  r->joins_accepted = s.joins_accepted.count;
  r->round_trips_us = std::move(s.round_trips_us);
  r->window_heartbeats = s.counters.window_heartbeats;
  r->ticker_lag_ms = absl::ToDoubleMilliseconds(ticker.max_lag());
  r->counters = s.counters;
  r->texts = std::move(s.error_texts);
  r->texts.insert(r->texts.end(), s.stream_texts.begin(), s.stream_texts.end());
  r->client_cpu_s = OwnCpuSeconds();
}

// Ends every stream still open and waits for them. A stream that does not
// end makes destroying its agent unsafe, so the process then exits at once.
void CancelAll(std::vector<std::unique_ptr<SimulatedAgent>>& agents,
               LoadRecorder& recorder) {
  for (auto& agent : agents) agent->Cancel();
  if (!recorder.AwaitEnded(static_cast<int>(agents.size()),
                           absl::Now() + kReachTimeout)) {
    std::fprintf(stderr,
                 "baton-coordinator-load: streams did not end after "
                 "cancelling them; exiting without cleanup\n");
    std::fflush(nullptr);
    std::_Exit(1);
  }
}

int Main(int argc, char** argv) {
  InitProcess(&argc, &argv, kUsage);
  if (FLAGS_coordinator.empty()) {
    std::fprintf(stderr,
                 "baton-coordinator-load: --coordinator is required "
                 "(host:port of a running coordinator)\n");
    return 2;
  }
  if (FLAGS_nodes < 1 || FLAGS_nodes > 100000 || FLAGS_duration_s < 1 ||
      FLAGS_agents_per_channel < 1 || FLAGS_seal_timeout_s < 1 ||
      FLAGS_connect_timeout_s < 1) {
    std::fprintf(stderr,
                 "baton-coordinator-load: --nodes must be in 1..100000; "
                 "--duration_s, --agents_per_channel, --seal_timeout_s and "
                 "--connect_timeout_s must be positive\n");
    return 2;
  }
  RaiseFdLimit();
  // The load generator parses one membership per agent: keep freed memory
  // instead of returning it to the kernel and faulting it back in, and skip
  // the Mutex deadlock bookkeeping, so the generator costs as little CPU as
  // it can next to the coordinator.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  FILE* human = FLAGS_json ? stderr : stdout;

  Results results;
  results.nodes = FLAGS_nodes;
  results.channels =
      (FLAGS_nodes + FLAGS_agents_per_channel - 1) / FLAGS_agents_per_channel;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int i = 0; i < results.channels; ++i) {
    channels.push_back(NewChannel(i));
    stubs.push_back(v1::Coordinator::NewStub(channels.back()));
  }
  if (!channels[0]->WaitForConnected(
          absl::ToChronoTime(absl::Now() + kReachTimeout))) {
    std::fprintf(stderr,
                 "baton-coordinator-load: cannot reach the coordinator at %s "
                 "within %s: is it running and listening there?\n",
                 FLAGS_coordinator.c_str(),
                 absl::FormatDuration(kReachTimeout).c_str());
    return 1;
  }

  LoadRecorder recorder;
  std::vector<std::unique_ptr<SimulatedAgent>> agents;
  // Declared after the agents, so destroyed (its thread joined) first.
  Ticker ticker([&agents](int32_t agent, TimerKind kind) {
    agents[agent]->OnTimer(kind);
  });
  for (int i = 0; i < FLAGS_nodes; ++i) {
    agents.push_back(
        std::make_unique<SimulatedAgent>(i, FLAGS_nodes, &recorder, &ticker));
  }

  // Sessions: every Hello answered before the first JoinJob.
  const absl::Time start = absl::Now();
  const absl::Time stream_deadline =
      start +
      absl::Seconds(FLAGS_connect_timeout_s + FLAGS_seal_timeout_s +
                    FLAGS_duration_s) +
      kLeaveTimeout + kStatusTimeout;
  for (int i = 0; i < FLAGS_nodes; ++i) {
    agents[i]->Start(stubs[i / FLAGS_agents_per_channel].get(),
                     stream_deadline);
  }
  if (!recorder.AwaitAccepted(FLAGS_nodes,
                              start + absl::Seconds(FLAGS_connect_timeout_s))) {
    Collect(recorder, ticker, &results);
    std::fprintf(stderr,
                 "baton-coordinator-load: only %d of %d sessions were "
                 "accepted within %d s (--connect_timeout_s)\n",
                 recorder.Take().accepted.count, FLAGS_nodes,
                 FLAGS_connect_timeout_s);
    for (const std::string& text : results.texts) {
      std::fprintf(stderr, "  %s\n", text.c_str());
    }
    ticker.Stop();
    CancelAll(agents, recorder);
    return 1;
  }
  {
    const LoadRecorder::Snapshot s = recorder.Take();
    results.accept_s = absl::ToDoubleSeconds(s.accepted.last - start);
    results.accept_spread_s =
        absl::ToDoubleSeconds(s.accepted.last - s.accepted.first);
  }

  // Sealing: from the first JoinJob to the last membership.
  const ProcessSample before_join = SampleProcess(FLAGS_coordinator_pid);
  const double client_cpu_before_join = OwnCpuSeconds();
  const absl::Time join_start = absl::Now();
  for (auto& agent : agents) agent->Join();
  results.sealed = recorder.AwaitMemberships(
      FLAGS_nodes, join_start + absl::Seconds(FLAGS_seal_timeout_s));
  const ProcessSample after_seal = SampleProcess(FLAGS_coordinator_pid);
  results.seal_client_cpu_s = OwnCpuSeconds() - client_cpu_before_join;
  if (after_seal.ok) {
    results.seal_coordinator_cpu_s = after_seal.cpu_s - before_join.cpu_s;
  }
  if (!results.sealed) {
    results.coordinator = after_seal;
    ticker.Stop();
    Collect(recorder, ticker, &results);
    v1::JobStatus job;
    if (GetJob(channels[0], kReachTimeout, &job).ok() &&
        SealedAt(job) != absl::InfinitePast()) {
      results.coordinator_seal_s =
          absl::ToDoubleSeconds(SealedAt(job) - join_start);
    }
    PrintResults(results, human);
    std::fprintf(stderr,
                 "baton-coordinator-load: the job was not sealed within %d s "
                 "(--seal_timeout_s): %d of %d agents got their membership\n",
                 FLAGS_seal_timeout_s, results.memberships, FLAGS_nodes);
    CancelAll(agents, recorder);
    return 1;
  }
  results.seal_s =
      absl::ToDoubleSeconds(recorder.Take().memberships.last - join_start);

  // Steady state: heartbeats sent from now on are measured.
  const absl::Time window_end =
      recorder.OpenWindow(absl::Seconds(FLAGS_duration_s));
  absl::SleepFor(window_end - absl::Now());
  results.coordinator = SampleProcess(FLAGS_coordinator_pid);
  if (results.coordinator.ok) {
    results.steady_cpu_pct =
        100 * (results.coordinator.cpu_s - after_seal.cpu_s) / FLAGS_duration_s;
  }
  v1::JobStatus job;
  const absl::Status job_status = GetJob(channels[0], kStatusTimeout, &job);
  if (job_status.ok() && SealedAt(job) != absl::InfinitePast()) {
    results.coordinator_seal_s =
        absl::ToDoubleSeconds(SealedAt(job) - join_start);
  }
  // Answers to the window's last heartbeats may still be on their way.
  absl::SleepFor(absl::Milliseconds(200));
  ticker.Stop();

  // The end: every agent leaves (finished) and closes its stream.
  for (auto& agent : agents) agent->Leave();
  const bool all_left =
      recorder.AwaitEnded(FLAGS_nodes, absl::Now() + kLeaveTimeout);
  if (!all_left) {
    std::fprintf(stderr,
                 "baton-coordinator-load: not every stream ended within %s "
                 "of LeaveJob; cancelling the rest\n",
                 absl::FormatDuration(kLeaveTimeout).c_str());
    CancelAll(agents, recorder);
  }
  Collect(recorder, ticker, &results);
  PrintResults(results, human);
  if (!job_status.ok()) {
    std::fprintf(human, "  Status.GetJob failed: %s\n",
                 job_status.ToString().c_str());
  } else if (FLAGS_print_status) {
    PrintJob(job, human);
  }
  std::fflush(nullptr);
  return all_left ? 0 : 1;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
