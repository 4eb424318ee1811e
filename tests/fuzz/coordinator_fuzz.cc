// The coordinator as a state machine. An input is a script of actions by up
// to eight fake agents (connect, join, rejoin from the membership they were
// last sent, leave, heartbeat, manifest, step report, admit joins, timeline
// reply, session loss), store and status calls, clock ticks and coordinator
// restarts, run against the real Coordinator on a FakeClock. After every
// action the invariants below are checked; a break aborts, so libFuzzer
// keeps the input (docs/fuzzing.md has the list and how to replay one).
//
// Input format (tests/fuzz/make_corpus.py writes seeds in it): one action per
// opcode byte, each followed by its own argument bytes (FuzzInput: reads
// past the end give 0).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/rendezvous.pb.h"
#include "baton/v1/status.pb.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "tests/fuzz/coordinator_invariants.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/unit/coordinator/recording_agent.h"

namespace baton::coordinator {
namespace {

using fuzz::FuzzInput;

constexpr int kAgents = 8;
constexpr int kJobs = 3;
// Longer scripts add little but time per input.
constexpr int kMaxActions = 400;

enum Action : uint8_t {
  kConnect,
  kJoin,
  kRejoin,
  kLeave,
  kHeartbeat,
  kManifest,
  kStepReport,
  kAdmitJoins,
  kTimelineReply,
  kCloseSession,
  kTick,
  kStore,
  kStatus,
  kRestart,
  kActionCount,
};

[[noreturn]] void Broken(const std::string& what) {
  fuzz::Broken("coordinator_fuzz", what);
}

std::string JobName(int j) { return absl::StrCat("j", j); }

// What one agent knows of one job, as a real agent would: the last
// membership and plan it was sent, its join, its trainers' progress.
struct JobView {
  // The last join the coordinator accepted (its sizing goes into a rejoin),
  // and the last one sent, by seq, until it is answered.
  v1::JoinJob join;
  v1::JoinJob sent_join;
  uint64_t sent_join_seq = 0;
  bool has_membership = false;
  v1::Membership membership;
  bool has_plan = false;
  v1::TensorPlan plan;
  // The generation it was last told of (sealed or announced as next).
  int64_t generation = 0;
  int64_t completed_step = -1;
};

struct FakeAgent {
  Agent agent;
  bool connected = false;
  std::string instance;
  // Messages of agent.channel already looked at.
  size_t read = 0;
  std::map<std::string, JobView> jobs;
  // The last TimelineRequest it was sent.
  bool asked = false;
  v1::TimelineRequest timeline_request;
};

// A job as GetJob shows it, for the restart check.
struct JobSnapshot {
  int64_t generation = 0;
  std::vector<MemberTuple> members;
};

class Driver {
 public:
  Driver() {
    for (int k = 0; k < kAgents; ++k) {
      agents_[k].agent.node = absl::StrCat("n", k);
      agents_[k].instance = absl::StrCat("i-n", k);
    }
    coordinator_ = std::make_unique<Coordinator>(options_, &clock_, &secrets_);
  }

  void Run(FuzzInput& in) {
    for (int n = 0; n < kMaxActions && !in.empty(); ++n) {
      clock_.Advance(absl::Milliseconds(1));
      const size_t start = in.pos();
      const uint8_t op = in.Byte() % kActionCount;
      if (op == kRestart) {
        Restart();
      } else {
        Step(static_cast<Action>(op), in);
      }
      if (trace_) Trace(n, op, in, start);
      Check();
    }
  }

 private:
  void Step(Action op, FuzzInput& in) {
    if (op == kTick) return Tick(in);
    if (op == kStore) return Store(in);
    if (op == kStatus) return Status(in);
    FakeAgent& a = agents_[in.Below(kAgents)];
    if (op == kConnect) return Connect(a, in.Byte());
    if (!a.connected) return;
    const std::string job = JobName(static_cast<int>(in.Below(kJobs)));
    JobView& view = a.jobs[job];
    switch (op) {
      case kJoin:
        return Join(a, job, view, in);
      case kRejoin:
        return Rejoin(a, view);
      case kLeave: {
        v1::AgentMessage m;
        v1::LeaveJob* leave = m.mutable_leave();
        leave->set_job(job);
        leave->set_generation(in.Bit() ? view.generation : in.Int(1));
        leave->set_finished(in.Bit());
        leave->set_reason(in.Bit() ? "trainer exited" : "");
        view = JobView();
        return Send(a, m);
      }
      case kHeartbeat: {
        v1::AgentMessage m;
        m.mutable_heartbeat()->set_sent_unix_us(in.Int(2));
        return Send(a, m);
      }
      case kManifest:
        return Manifest(a, job, view, in);
      case kStepReport:
        return Report(a, job, view, in);
      case kAdmitJoins: {
        v1::AgentMessage m;
        m.mutable_admit_joins()->set_job(job);
        m.mutable_admit_joins()->set_generation(in.Bit() ? view.generation
                                                         : in.Int(1));
        return Send(a, m);
      }
      case kTimelineReply:
        return TimelineReply(a, in);
      case kCloseSession:
        coordinator_->OnSessionClosed(a.agent.id, "the fuzzer closed it");
        a.connected = false;
        return;
      default:
        return;
    }
  }

  // A new session for `a`, with hello. The old one is closed first or left
  // open (the coordinator then replaces it); a new agent instance forgets
  // every job, as a restarted agent process does.
  void Connect(FakeAgent& a, uint8_t mode) {
    if (a.connected && (mode & 1) != 0) {
      coordinator_->OnSessionClosed(a.agent.id, "reconnecting");
    }
    if ((mode & 2) != 0) {
      a.instance = absl::StrCat("i-", a.agent.node, "-", ++instances_);
      a.jobs.clear();
    }
    OpenSession(a);
  }

  void OpenSession(FakeAgent& a) {
    a.agent.id = SessionId(next_session_++);
    a.agent.channel = std::make_shared<RecordingChannel>();
    a.agent.seq = 0;
    a.read = 0;
    a.asked = false;
    // Answers to the old session's joins never come on this one.
    for (auto& [job, view] : a.jobs) view.sent_join_seq = 0;
    coordinator_->OnSessionOpened(a.agent.id, a.agent.channel);
    v1::AgentMessage hello;
    hello.mutable_hello()->set_node_name(a.agent.node);
    hello.mutable_hello()->set_agent_instance(a.instance);
    hello.mutable_hello()->set_agent_version("fuzz");
    Send(a, hello);
    a.connected = !a.agent.channel->closed;
  }

  void Send(FakeAgent& a, v1::AgentMessage message) {
    message.set_seq(++a.agent.seq);
    coordinator_->OnAgentMessage(a.agent.id, message);
  }

  void Join(FakeAgent& a, const std::string& job, JobView& view,
            FuzzInput& in) {
    v1::AgentMessage m;
    v1::JoinJob* join = m.mutable_join();
    join->set_job(job);
    join->set_data_address(
        absl::StrCat(a.agent.node, ".example:", in.Bit() ? 7001 : 7000));
    join->set_local_size(1 + static_cast<int32_t>(in.Below(4)));
    const int32_t expected = 1 + static_cast<int32_t>(in.Below(4));
    join->set_expected_nodes(expected);
    join->set_min_nodes(static_cast<int32_t>(in.Below(expected + 1)));
    static constexpr int64_t kPartitions[] = {0, 8, 1 << 20, 12};
    join->set_partition_bytes(kPartitions[in.Below(4)]);
    if (in.Bit()) join->set_last_generation(view.generation);
    view.sent_join = *join;
    Send(a, m);
    view.sent_join_seq = a.agent.seq;
  }

  void Rejoin(FakeAgent& a, const JobView& view) {
    if (!view.has_membership) return;
    v1::AgentMessage m;
    v1::RejoinJob* rejoin = m.mutable_rejoin();
    *rejoin->mutable_membership() = view.membership;
    if (view.has_plan) *rejoin->mutable_plan() = view.plan;
    rejoin->set_completed_step(view.completed_step);
    rejoin->set_expected_nodes(view.join.expected_nodes());
    rejoin->set_min_nodes(view.join.min_nodes());
    rejoin->set_partition_bytes(view.join.partition_bytes());
    Send(a, m);
  }

  // Tensors from a small table, so that agents often agree and sometimes
  // do not (names, dtypes, shapes, ops and versions all vary).
  void Manifest(FakeAgent& a, const std::string& job, const JobView& view,
                FuzzInput& in) {
    v1::AgentMessage m;
    v1::Manifest* manifest = m.mutable_manifest();
    manifest->set_job(job);
    manifest->set_generation(in.Bit() ? view.generation : in.Int(1));
    const int count = static_cast<int>(in.Below(5));
    for (int i = 0; i < count; ++i) {
      v1::TensorSpec* t = manifest->add_tensors();
      const uint8_t b = in.Byte();
      t->set_name(absl::StrCat("t", b % 4));
      t->set_dtype(static_cast<v1::DataType>(1 + (b >> 2) % 3));
      t->add_shape(1 + in.Below(64));
      if ((b & 0x20) != 0) t->add_shape(1 + in.Below(8));
      t->set_op((b & 0x40) != 0 ? v1::COLLECTIVE_OP_BROADCAST
                                : v1::COLLECTIVE_OP_PUSH_PULL);
      t->set_version((b & 0x80) != 0 ? 1 : 0);
    }
    Send(a, m);
  }

  // A report for the agent's ranks in its membership (or any rank), with
  // steps moving forward from what it reported before.
  void Report(FakeAgent& a, const std::string& job, JobView& view,
              FuzzInput& in) {
    v1::AgentMessage m;
    v1::StepReport* report = m.mutable_step_report();
    report->set_job(job);
    report->set_generation(in.Bit() ? view.generation : in.Int(1));
    int32_t first = 0;
    int32_t ranks = 1;
    if (view.membership.self().node_name() == a.agent.node) {
      first = view.membership.self().rank_offset();
      ranks = view.membership.self().local_size();
    }
    if (in.Below(8) == 0) first = static_cast<int32_t>(in.Int(1));
    int64_t lowest = -1;
    for (int32_t r = first; r < first + ranks; ++r) {
      v1::RankProgress* p = report->add_ranks();
      p->set_rank(r);
      const int64_t done = view.completed_step + in.Below(4);
      p->set_completed_step(done);
      p->set_submitted_step(done + in.Below(3));
      lowest = r == first ? done : std::min(lowest, done);
    }
    const int pending = static_cast<int>(in.Below(3));
    for (int i = 0; i < pending; ++i) {
      v1::PendingTensor* p = report->add_pending();
      p->set_tensor_id(in.Below(5));
      p->set_step(lowest + 1 + in.Below(2));
      if (in.Bit()) p->add_submitted_ranks(first);
      p->set_waiting_ms(in.Int(2));
    }
    v1::AgentStats* stats = report->mutable_stats();
    stats->set_queue_depth(in.Below(16));
    stats->set_throughput_bytes_per_second(in.Int(2));
    stats->set_scheduling(in.Bit() ? "priority" : "fifo");
    if (in.Bit()) {
      v1::TensorLatency* l = stats->add_tensor_latencies();
      l->set_tensor_id(in.Below(5));
      l->set_count(in.Below(10));
      l->set_mean_us(in.Int(2));
      l->set_max_us(in.Int(2));
      l->set_last_step(lowest);
    }
    Send(a, m);
    // What the agent would rejoin with; the coordinator may have refused it.
    view.completed_step = std::max(view.completed_step, lowest);
  }

  void TimelineReply(FakeAgent& a, FuzzInput& in) {
    v1::AgentMessage m;
    v1::TimelineReply* reply = m.mutable_timeline_reply();
    reply->set_request_id(a.asked ? a.timeline_request.request_id()
                                  : in.Byte());
    reply->set_job(a.asked ? a.timeline_request.job() : JobName(0));
    const int count = static_cast<int>(in.Below(4));
    for (int i = 0; i < count; ++i) {
      v1::PartitionTrace* t = reply->add_partitions();
      t->set_tensor_id(in.Below(4));
      t->set_tensor(absl::StrCat("t", in.Below(4)));
      t->set_step(a.timeline_request.first_step() + in.Below(3));
      t->set_num_partitions(1 + in.Below(3));
      t->set_partition(in.Below(3));
      t->set_bytes(in.Int(2));
      t->set_submitted_us(in.Int(2));
      t->set_done_us(in.Int(3));
      t->set_ok(in.Bit());
    }
    reply->set_truncated(in.Bit());
    Send(a, m);
  }

  void Tick(FuzzInput& in) {
    const uint8_t b = in.Byte();
    absl::Duration d = options_.tick_interval;
    switch (b % 4) {
      case 0:
        d = absl::Milliseconds(10) * in.Byte();
        break;
      case 1:
        d = absl::Milliseconds(100) * in.Byte();
        break;
      case 2:
        d = absl::Seconds(1) * in.Byte();
        break;
      default:
        break;
    }
    clock_.Advance(d);
    // Agents keep their sessions alive unless the script says not to.
    if ((b & 4) == 0) {
      for (FakeAgent& a : agents_) {
        if (!a.connected) continue;
        v1::AgentMessage m;
        m.mutable_heartbeat();
        Send(a, m);
      }
    }
    coordinator_->Tick();
  }

  void Store(FuzzInput& in) {
    const uint8_t kind = in.Below(3);
    const std::string job = JobName(static_cast<int>(in.Below(kJobs)));
    v1::StoreScope scope;
    scope.set_job(job);
    const FakeAgent& a = agents_[in.Below(kAgents)];
    auto it = a.jobs.find(job);
    scope.set_generation(in.Bit() && it != a.jobs.end() ? it->second.generation
                                                        : in.Int(1));
    const std::string key = absl::StrCat("k", in.Below(4));
    // With TLS the caller's certificate names its node; without, nothing.
    const PeerIdentity caller =
        in.Bit() ? PeerIdentity{true, {a.agent.node}} : PeerIdentity{};
    if (kind == 0) {
      v1::StoreSetRequest request;
      *request.mutable_scope() = scope;
      request.set_key(key);
      request.set_value(in.String(16));
      coordinator_->StoreSet(request, caller, [](absl::Status) {});
    } else if (kind == 1) {
      v1::StoreGetRequest request;
      *request.mutable_scope() = scope;
      const int keys = 1 + static_cast<int>(in.Below(3));
      for (int i = 0; i < keys; ++i) {
        request.add_keys(absl::StrCat("k", in.Below(4)));
      }
      request.set_wait_timeout_ms(500 * in.Below(4));
      coordinator_->StoreGet(
          request, caller,
          [keys](absl::StatusOr<std::vector<std::string>> values) {
            if (values.ok() && static_cast<int>(values->size()) != keys) {
              Broken(absl::StrCat("StoreGet of ", keys, " keys answered ",
                                  values->size(), " values"));
            }
          });
    } else {
      v1::StoreAddRequest request;
      *request.mutable_scope() = scope;
      request.set_key(key);
      request.set_delta(in.Int(1));
      coordinator_->StoreAdd(request, caller, [](absl::StatusOr<int64_t>) {});
    }
  }

  void Status(FuzzInput& in) {
    const std::string job = JobName(static_cast<int>(in.Below(kJobs)));
    switch (in.Below(4)) {
      case 0:
        coordinator_->ListJobs();
        break;
      case 1: {
        absl::StatusOr<v1::JobStatus> whole = coordinator_->GetJob(job);
        if (whole.ok()) {
          CheckPages(*whole, 1 + static_cast<int32_t>(in.Below(3)));
        }
        break;
      }
      case 2:
        coordinator_->GetTensors(job).IgnoreError();
        break;
      default: {
        v1::GetTimelineRequest request;
        request.set_job(job);
        request.set_first_step(in.Int(1));
        request.set_last_step(request.first_step() + in.Int(1));
        coordinator_->GetTimeline(
            request, [request](absl::StatusOr<v1::Timeline> timeline) {
              if (timeline.ok() && timeline->job() != request.job()) {
                Broken(absl::StrCat("GetTimeline of job ", request.job(),
                                    " answered for job ", timeline->job()));
              }
            });
        break;
      }
    }
  }

  // Status.GetJob's pages of `size` members, joined, are `whole`'s members
  // in its order: where a page starts (found without walking the members)
  // agrees with the whole list.
  void CheckPages(const v1::JobStatus& whole, int32_t size) {
    std::vector<std::string> expected, paged;
    for (const v1::MemberStatus& m : whole.members()) {
      expected.push_back(m.node_name());
    }
    v1::GetJobRequest request;
    request.set_job(whole.job());
    request.set_page_size(size);
    for (int pages = 0; pages <= whole.members_size(); ++pages) {
      absl::StatusOr<v1::JobStatus> page = coordinator_->GetJob(request);
      if (!page.ok() || page->total_members() != whole.members_size()) {
        Broken(absl::StrCat(
            "a GetJob page of job ", whole.job(), " answered ",
            page.ok() ? absl::StrCat(page->total_members(), " total members")
                      : page.status().ToString(),
            "; the whole job has ", whole.members_size()));
      }
      for (const v1::MemberStatus& m : page->members()) {
        paged.push_back(m.node_name());
      }
      if (page->next_page_token().empty()) break;
      request.set_page_token(page->next_page_token());
    }
    if (paged != expected) {
      Broken(absl::StrCat("GetJob pages of ", size, " members of job ",
                          whole.job(), " list ", absl::StrJoin(paged, ","),
                          "; the whole job lists ",
                          absl::StrJoin(expected, ",")));
    }
  }

  // A new coordinator process: the agents that were connected reconnect
  // and rejoin every job from the membership they were last sent, the
  // members of each job's current generation first (a stale rejoin that
  // comes first rebuilds the stale generation: see "Not fixed" in
  // docs/fuzzing.md).
  void Restart() {
    std::map<std::string, JobSnapshot> whole;
    const v1::ListJobsResponse jobs = coordinator_->ListJobs();
    for (const v1::JobStatus& job : jobs.jobs()) {
      if (job.state() == v1::JOB_STATE_RUNNING && FullyHeld(job)) {
        whole[job.job()] = {job.generation(), Members(job)};
      }
    }
    coordinator_.reset();
    coordinator_ = std::make_unique<Coordinator>(options_, &clock_, &secrets_);
    invariants_.NewProcess();
    for (FakeAgent& a : agents_) {
      if (a.connected) OpenSession(a);
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (FakeAgent& a : agents_) {
        if (!a.connected) continue;
        for (auto& [job, view] : a.jobs) {
          if (!view.has_membership) continue;
          auto it = whole.find(job);
          // A member of the job's current generation. Same generation is
          // not enough: a restarted coordinator numbers a new run of a name
          // from 1 again, so a node that missed the old run's end may hold
          // another membership under the same generation (docs/fuzzing.md).
          const bool current =
              it != whole.end() &&
              view.membership.generation() == it->second.generation &&
              std::any_of(it->second.members.begin(), it->second.members.end(),
                          [&](const auto& m) {
                            return std::get<0>(m) == a.agent.node;
                          });
          if (current == (pass == 0)) Rejoin(a, view);
        }
      }
    }
    for (const auto& [job, before] : whole) {
      if (trace_) {
        std::fprintf(stderr, "restart: job %s generation %lld checked\n",
                     job.c_str(), static_cast<long long>(before.generation));
      }
      absl::StatusOr<v1::JobStatus> after = coordinator_->GetJob(job);
      if (!after.ok()) {
        Broken(absl::StrCat("job ", job, " generation ", before.generation,
                            " is not back after a restart with every member "
                            "rejoining: ",
                            after.status().ToString()));
      }
      if (after->state() != v1::JOB_STATE_RUNNING ||
          after->generation() != before.generation ||
          Members(*after) != before.members) {
        Broken(absl::StrCat(
            "job ", job, " was running generation ", before.generation,
            " and after a restart with every member rejoining it is ",
            after->state_reason(), " at generation ", after->generation(),
            " with ", after->members_size(), " members"));
      }
      for (const FakeAgent& a : agents_) {
        if (!a.connected) continue;  // its channel is the old process's
        for (const v1::CoordinatorMessage& m : a.agent.channel->messages) {
          if ((m.has_membership() && m.membership().job() == job) ||
              (m.has_generation_aborted() &&
               m.generation_aborted().job() == job)) {
            Broken(absl::StrCat("job ", job,
                                " changed generation while its members "
                                "rejoined a restarted coordinator"));
          }
        }
      }
    }
  }

  // Every member of `job`'s generation is connected and holds that very
  // membership (it will rejoin with it).
  bool FullyHeld(const v1::JobStatus& job) const {
    for (const v1::MemberStatus& m : job.members()) {
      const FakeAgent* holder = nullptr;
      for (const FakeAgent& a : agents_) {
        if (a.agent.node == m.node_name()) holder = &a;
      }
      if (holder == nullptr || !holder->connected || !m.connected()) {
        return false;
      }
      auto it = holder->jobs.find(job.job());
      if (it == holder->jobs.end() || !it->second.has_membership ||
          it->second.membership.generation() != job.generation()) {
        return false;
      }
    }
    return job.members_size() > 0;
  }

  // BATON_FUZZ_TRACE=1: each action and its bytes on stderr, to read a
  // crashing input (docs/fuzzing.md).
  void Trace(int n, uint8_t op, const FuzzInput& in, size_t start) const {
    static constexpr const char* kNames[] = {
        "connect",  "join",   "rejoin",      "leave",          "heartbeat",
        "manifest", "report", "admit_joins", "timeline_reply", "close_session",
        "tick",     "store",  "status",      "restart"};
    std::string bytes;
    for (size_t i = start; i < in.pos(); ++i) {
      absl::StrAppend(&bytes, " ", in.data()[i]);
    }
    std::fprintf(stderr, "action %d: %s [%s ]\n", n, kNames[op], bytes.c_str());
    for (const FakeAgent& a : agents_) {
      if (a.agent.channel == nullptr) continue;
      const auto& messages = a.agent.channel->messages;
      for (size_t i = a.read; i < messages.size(); ++i) {
        std::fprintf(stderr, "  to %s: %s\n", a.agent.node.c_str(),
                     messages[i].ShortDebugString().c_str());
      }
    }
  }

  // The invariants, after every action.
  void Check() {
    for (FakeAgent& a : agents_) {
      if (a.agent.channel == nullptr) continue;
      const auto& messages = a.agent.channel->messages;
      for (; a.read < messages.size(); ++a.read) Observe(a, messages[a.read]);
      if (a.agent.channel->closed) a.connected = false;
    }
    const v1::ListJobsResponse jobs = coordinator_->ListJobs();
    for (const v1::JobStatus& job : jobs.jobs()) {
      invariants_.CheckStatus(job);
      coordinator_->GetTensors(job.job()).IgnoreError();
    }
  }

  void Observe(FakeAgent& a, const v1::CoordinatorMessage& m) {
    switch (m.body_case()) {
      case v1::CoordinatorMessage::kMembership: {
        const v1::Membership& membership = m.membership();
        invariants_.CheckMembership(a.agent.node, membership);
        JobView& view = a.jobs[membership.job()];
        view.has_membership = true;
        view.membership = membership;
        view.generation = membership.generation();
        break;
      }
      case v1::CoordinatorMessage::kGenerationAborted:
        a.jobs[m.generation_aborted().job()].generation =
            m.generation_aborted().new_generation();
        break;
      case v1::CoordinatorMessage::kPlan: {
        const v1::TensorPlan& plan = m.plan();
        invariants_.CheckPlan(plan);
        JobView& view = a.jobs[plan.job()];
        view.has_plan = true;
        view.plan = plan;
        break;
      }
      case v1::CoordinatorMessage::kJoinAccepted: {
        JobView& view = a.jobs[m.join_accepted().job()];
        if (view.sent_join_seq != 0 && m.reply_to() == view.sent_join_seq) {
          view.join = view.sent_join;
        }
        break;
      }
      case v1::CoordinatorMessage::kJobEnded:
        a.jobs.erase(m.job_ended().job());
        break;
      case v1::CoordinatorMessage::kError:
        // A real agent drops a membership the coordinator calls stale and
        // joins again.
        if (m.error().code() == static_cast<int>(absl::StatusCode::kAborted) &&
            !m.error().job().empty()) {
          auto it = a.jobs.find(m.error().job());
          if (it != a.jobs.end()) it->second.has_membership = false;
        }
        break;
      case v1::CoordinatorMessage::kTimelineRequest:
        a.asked = true;
        a.timeline_request = m.timeline_request();
        break;
      default:
        break;
    }
  }

  const bool trace_ = std::getenv("BATON_FUZZ_TRACE") != nullptr;
  FakeClock clock_;
  CountingSecretSource secrets_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  FakeAgent agents_[kAgents];
  uint64_t next_session_ = 1;
  int instances_ = 0;

  CoordinatorInvariants invariants_;
};

}  // namespace
}  // namespace baton::coordinator

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  baton::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::fuzz::FuzzInput in(data, size);
  baton::coordinator::Driver driver;
  driver.Run(in);
  return 0;
}
