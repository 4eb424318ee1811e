// What one Status.GetJob page costs the control loop (issue 20): the real
// Coordinator in process on a fake clock, as the unit tests drive it, with
// 1,000 or 10,000 member nodes that each reported a step.
//
//   baton-bench-get-job-page [--benchmark_filter=...]
//
// BM_Page: one page of the default size (1000 members), the job's last (by
// its page token), of a running job or of a forming one (members not yet
// sealed, ordered by name). BM_AllPages: every page of the job, one after
// the other, as batonctl fetches it. BM_ListJobs: Status.ListJobs as the
// RPC answers it (the job's first page) against every member (what it
// answered before, and what the metrics still read). The job is built once per
// size and state; only the GetJob calls are timed.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "coordinator/agent_channel.h"
#include "coordinator/coordinator.h"
#include "coordinator/secret_source.h"
#include "glog/logging.h"

namespace baton::coordinator {
namespace {

constexpr int64_t kPageSize = 1000;
constexpr int kTensors = 4;

// An agent's session that drops what the coordinator sends it.
class DiscardingChannel : public AgentChannel {
 public:
  void Send(OutboundMessage /*message*/) override {}
  void Close(const absl::Status& /*status*/) override {}
};

// A coordinator holding one job of `members` nodes (one trainer each):
// sealed and running, each node past a step report with tensor latencies,
// or still forming (it waits for one more node).
class Job {
 public:
  Job(int members, bool running)
      : coordinator_(CoordinatorOptions(), &clock_, &secrets_) {
    auto channel = std::make_shared<DiscardingChannel>();
    const int expected = running ? members : members + 1;
    for (int k = 0; k < members; ++k) {
      const SessionId id(k + 1);
      coordinator_.OnSessionOpened(id, channel, PeerIdentity());
      v1::AgentMessage hello;
      hello.set_seq(1);
      hello.mutable_hello()->set_node_name(absl::StrCat("node-", k));
      hello.mutable_hello()->set_agent_instance(absl::StrCat("i-", k));
      coordinator_.OnAgentMessage(id, hello);
      v1::AgentMessage join;
      join.set_seq(2);
      join.mutable_join()->set_job("job");
      join.mutable_join()->set_data_address(absl::StrCat("node-", k, ":7000"));
      join.mutable_join()->set_local_size(1);
      join.mutable_join()->set_expected_nodes(expected);
      coordinator_.OnAgentMessage(id, join);
    }
    if (!running) return;
    const absl::StatusOr<v1::JobStatus> whole = coordinator_.GetJob("job");
    if (!whole.ok() || whole->state() != v1::JOB_STATE_RUNNING) {
      std::fprintf(stderr, "the job of %d members did not seal\n", members);
      std::exit(1);
    }
    for (const v1::MemberStatus& member : whole->members()) {
      // Sessions were opened in the order of the names' numbers.
      const int k = std::atoi(member.node_name().c_str() + 5);
      v1::AgentMessage message;
      message.set_seq(3);
      v1::StepReport* report = message.mutable_step_report();
      report->set_job("job");
      report->set_generation(whole->generation());
      v1::RankProgress* progress = report->add_ranks();
      progress->set_rank(member.rank_offset());
      progress->set_completed_step(10);
      progress->set_submitted_step(11);
      v1::AgentStats* stats = report->mutable_stats();
      stats->set_throughput_bytes_per_second(1e9);
      stats->set_scheduling("priority");
      for (uint32_t t = 0; t < kTensors; ++t) {
        v1::TensorLatency* latency = stats->add_tensor_latencies();
        latency->set_tensor_id(t);
        latency->set_count(1);
        latency->set_mean_us(1000);
        latency->set_max_us(1000);
        latency->set_last_step(10);
      }
      coordinator_.OnAgentMessage(SessionId(k + 1), message);
    }
  }

  // The page after `token` (the first for an empty one).
  absl::StatusOr<v1::JobStatus> Page(const std::string& token) const {
    v1::GetJobRequest request;
    request.set_job("job");
    request.set_page_size(kPageSize);
    request.set_page_token(token);
    return coordinator_.GetJob(request);
  }

  // The token of the page of the last kPageSize members.
  std::string LastPageToken() const {
    std::string token;
    for (int64_t seen = 0; seen < total() - kPageSize; seen += kPageSize) {
      token = Page(token)->next_page_token();
    }
    return token;
  }

  int64_t total() const { return Page("")->total_members(); }

  // Status.ListJobs as the RPC answers it (each job's first page), or with
  // every member (the coordinator's own callers, and the RPC before).
  v1::ListJobsResponse List(bool every_member) const {
    return every_member ? coordinator_.ListJobs()
                        : coordinator_.ListJobs(v1::ListJobsRequest());
  }

 private:
  FakeClock clock_;
  CountingSecretSource secrets_;
  Coordinator coordinator_;
};

// Built once per (members, running) and kept for every benchmark.
const Job& CachedJob(int members, bool running) {
  static auto* jobs = new std::map<std::pair<int, bool>, std::unique_ptr<Job>>;
  std::unique_ptr<Job>& job = (*jobs)[{members, running}];
  if (job == nullptr) job = std::make_unique<Job>(members, running);
  return *job;
}

void BM_Page(benchmark::State& state) {
  const Job& job = CachedJob(static_cast<int>(state.range(0)),
                             /*running=*/state.range(1) != 0);
  const std::string token = job.LastPageToken();
  for (auto _ : state) {
    absl::StatusOr<v1::JobStatus> page = job.Page(token);
    if (!page.ok() || page->members_size() != kPageSize) {
      state.SkipWithError("the page did not hold a full page of members");
      break;
    }
    benchmark::DoNotOptimize(page);
  }
  state.counters["members"] = static_cast<double>(state.range(0));
}

void BM_AllPages(benchmark::State& state) {
  const Job& job = CachedJob(static_cast<int>(state.range(0)),
                             /*running=*/state.range(1) != 0);
  for (auto _ : state) {
    int64_t members = 0;
    std::string token;
    do {
      absl::StatusOr<v1::JobStatus> page = job.Page(token);
      if (!page.ok()) break;
      members += page->members_size();
      token = page->next_page_token();
    } while (!token.empty());
    if (members != state.range(0)) {
      state.SkipWithError("the pages did not hold every member once");
      break;
    }
  }
  state.counters["members"] = static_cast<double>(state.range(0));
}

void BM_ListJobs(benchmark::State& state) {
  const Job& job = CachedJob(static_cast<int>(state.range(0)),
                             /*running=*/true);
  const bool every_member = state.range(1) != 0;
  const int64_t expected = every_member ? state.range(0) : kPageSize;
  for (auto _ : state) {
    v1::ListJobsResponse jobs = job.List(every_member);
    if (jobs.jobs_size() != 1 || jobs.jobs(0).members_size() != expected) {
      state.SkipWithError("ListJobs did not hold the members expected");
      break;
    }
    benchmark::DoNotOptimize(jobs);
  }
  state.counters["members"] = static_cast<double>(state.range(0));
}

// {members, running (1) or forming (0)}.
BENCHMARK(BM_Page)
    ->ArgNames({"members", "running"})
    ->ArgsProduct({{1000, 10000}, {1, 0}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AllPages)
    ->ArgNames({"members", "running"})
    ->ArgsProduct({{1000, 10000}, {1, 0}})
    ->Unit(benchmark::kMicrosecond);
// {members, every member (1) or each job's first page (0)}: a running job.
BENCHMARK(BM_ListJobs)
    ->ArgNames({"members", "every_member"})
    ->ArgsProduct({{1000, 10000}, {1, 0}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace baton::coordinator

int main(int argc, char** argv) {
  // No log line per join and seal while the jobs are built.
  FLAGS_minloglevel = google::GLOG_WARNING;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
