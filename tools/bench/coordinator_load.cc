// baton-coordinator-load: N simulated agents in one process against a running
// coordinator. Measures how long the job takes to seal, the heartbeat round
// trip in steady state, how long the job's whole status (every page of
// Status.GetJob) takes meanwhile, errors, and (given its pid) the
// coordinator's memory and CPU. With --restart_file, also how long every
// agent takes to rejoin a restarted coordinator. With --coordinator_metrics,
// how long the coordinator took to handle the agents' messages in steady
// state: its baton_agent_message_seconds histogram, scraped at the window's
// start and end.
//
// The agents send what real ones send: a step report every report interval
// once sealed, and a heartbeat only after a heartbeat interval without any
// other message (agent/coordinator_client.cc), so a sealed job sends no
// heartbeats. Every --probe_every'th agent heartbeats regardless, to time
// the round trip; --heartbeats=always makes every agent do so (as this
// generator did before, half again as many messages as real agents).
//
// Each agent is one AgentSession stream (on gRPC's async API, with its own
// outbound queue and one write in flight); agents are spread over several
// channels, each its own TCP connection, and over the completion queues of
// one CompletionQueuePool, each drained by its own thread. One ticker
// thread sends every agent's heartbeats and step reports.
//
// This file holds the flags, the run's phases and the report; the agents are
// in simulated_agent.h, their timers in ticker.h, what they observe in
// load_recorder.h and the status queries in status_probe.h.

#include <gflags/gflags.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "baton/v1/status.grpc.pb.h"
#include "common/completion_queue_pool.h"
#include "common/init.h"
#include "common/metrics_scrape.h"
#include "common/tls.h"
#include "common/tls_flags.h"
#include "tools/bench/load_recorder.h"
#include "tools/bench/load_report.h"
#include "tools/bench/membership_store.h"
#include "tools/bench/process_sample.h"
#include "tools/bench/rejoin_after_restart.h"
#include "tools/bench/simulated_agent.h"
#include "tools/bench/status_probe.h"
#include "tools/bench/ticker.h"

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
DEFINE_int32(completion_queues, 8,
             "gRPC completion queues (one thread each) the agents' streams "
             "are spread over, agent i on queue i % N. Debian's libgrpc "
             "searches a queue's outstanding operations linearly on every "
             "completion: more queues, shorter searches");
DEFINE_string(heartbeats, "idle",
              "\"idle\": an agent heartbeats only when it sent nothing else "
              "for the heartbeat interval, as a real agent does (none while "
              "it reports), except the --probe_every'th; \"always\": every "
              "agent heartbeats at every interval beside its reports");
DEFINE_int32(probe_every, 20,
             "With --heartbeats=idle, agent i heartbeats at every interval "
             "when i % N == 0, to time the round trip (0: no probes)");
DEFINE_string(coordinator_metrics, "",
              "The coordinator's /metrics URL (what it prints as \"metrics "
              "on URL\"): its message-handling histogram is scraped at the "
              "steady state's start and end and reported");
DEFINE_int32(expected_nodes, 0,
             "The job's expected_nodes (0: --nodes). Above --nodes the job "
             "never seals: the steady state then measures heartbeats and "
             "whole-status queries of a forming job of --nodes members");
DEFINE_int32(status_interval_ms, 1000,
             "In steady state, fetch the job's whole status (every page of "
             "Status.GetJob) this often and time it (0: never)");
DEFINE_int32(status_page_size, 0,
             "Members per Status.GetJob page (0: the coordinator's default)");
DEFINE_string(restart_file, "",
              "Restart scenario: after the steady state, say so on stderr "
              "(\"ready for the coordinator restart\"), wait for every "
              "stream to end (the coordinator killed) and for this file to "
              "hold \"PID START_UNIX_MS\" of the coordinator started again "
              "on the same address; then every agent reconnects and rejoins, "
              "and the time from that start until the job runs again with "
              "every member connected at the same generation is measured");
DEFINE_int32(restart_timeout_s, 120,
             "Restart scenario: seconds for each of its waits (the kill, the "
             "file, every agent's rejoin)");

namespace baton::bench {
namespace {

constexpr char kUsage[] =
    "baton-coordinator-load: simulates --nodes agents against a running "
    "coordinator and reports time to seal, heartbeat round trip, errors and "
    "the coordinator's memory and CPU.\n"
    "Usage: baton-coordinator-load --coordinator=host:port [--nodes=N] "
    "[--duration_s=S] [--coordinator_pid=PID] [--json] [--print_status]";

// How long the reachability probe, the streams' ending after LeaveJob and
// Status.GetJob (each page) may take.
constexpr absl::Duration kReachTimeout = absl::Seconds(5);
constexpr absl::Duration kLeaveTimeout = absl::Seconds(60);
constexpr absl::Duration kStatusTimeout = absl::Seconds(10);

void RaiseFdLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    std::fprintf(stderr, "warning: could not raise the fd limit to %llu\n",
                 static_cast<unsigned long long>(limit.rlim_max));
  }
}

// Plaintext, or mutual TLS with --tls_cert/--tls_key/--tls_ca, where
// "{channel}" in the certificate and key paths stands for the channel's
// index: each channel's certificate names the simulated nodes it carries
// (sim-<i>, as DNS names), as each agent's names its node.
TlsFiles ChannelTlsFiles(int index) {
  TlsFiles files = TlsFilesFromFlags();
  for (std::string* path : {&files.cert, &files.key}) {
    *path = absl::StrReplaceAll(*path, {{"{channel}", absl::StrCat(index)}});
  }
  return files;
}

std::shared_ptr<grpc::Channel> NewChannel(int index) {
  grpc::ChannelArguments args;
  // A local subchannel pool and a distinct argument give every channel its
  // own TCP connection, as separate agent processes would have.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("baton.load.channel", index);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  // A channel carries hundreds of agents: at the seal the ping's answer
  // waits behind every one of their memberships (95 MB on a channel of 256
  // agents at 10,000 nodes), read by a generator that shares the machine's
  // cores with the coordinator. A real agent's connection carries its own.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 120000);
  // Back to a restarted coordinator as soon as a real agent would be
  // (agent/agent.cc, --reconnect_max_backoff_ms's default).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return grpc::CreateCustomChannel(
      FLAGS_coordinator, ChannelCredentials(ChannelTlsFiles(index)), args);
}

// The job's own fields (its events, generation, state) and the first
// three members, for PrintJob.
absl::Status GetJobSummary(StatusClient& client, v1::JobStatus* job) {
  v1::GetJobRequest request;
  request.set_job(FLAGS_job);
  request.set_page_size(3);
  absl::StatusOr<v1::JobStatus> page = client.GetJobPage(request);
  if (!page.ok()) return page.status();
  *job = *std::move(page);
  return absl::OkStatus();
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
               static_cast<long long>(job.global_step()), job.total_members());
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

// The coordinator's baton_agent_message_seconds now, from
// --coordinator_metrics; nullopt (said on stderr) without it or on failure.
std::optional<ScrapedHistogram> ScrapeHandling() {
  if (FLAGS_coordinator_metrics.empty()) return std::nullopt;
  absl::StatusOr<std::string> text =
      HttpGet(FLAGS_coordinator_metrics, kReachTimeout);
  absl::StatusOr<ScrapedHistogram> histogram =
      text.ok() ? ParseHistogram(*text, "baton_agent_message_seconds")
                : text.status();
  if (!histogram.ok()) {
    std::fprintf(stderr,
                 "baton-coordinator-load: cannot read the coordinator's "
                 "message handling from %s (--coordinator_metrics): %s\n",
                 FLAGS_coordinator_metrics.c_str(),
                 std::string(histogram.status().message()).c_str());
    return std::nullopt;
  }
  return *std::move(histogram);
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
      FLAGS_connect_timeout_s < 1 || FLAGS_completion_queues < 1 ||
      FLAGS_completion_queues > 256) {
    std::fprintf(stderr,
                 "baton-coordinator-load: --nodes must be in 1..100000 and "
                 "--completion_queues in 1..256; --duration_s, "
                 "--agents_per_channel, --seal_timeout_s and "
                 "--connect_timeout_s must be positive\n");
    return 2;
  }
  if (FLAGS_expected_nodes != 0 &&
      (FLAGS_expected_nodes < FLAGS_nodes || FLAGS_expected_nodes > 100000 ||
       !FLAGS_restart_file.empty())) {
    std::fprintf(stderr,
                 "baton-coordinator-load: --expected_nodes must be 0 or in "
                 "--nodes..100000, and the restart scenario needs a sealed "
                 "job (--expected_nodes 0)\n");
    return 2;
  }
  if ((FLAGS_heartbeats != "idle" && FLAGS_heartbeats != "always") ||
      FLAGS_probe_every < 0) {
    std::fprintf(stderr,
                 "baton-coordinator-load: --heartbeats must be \"idle\" or "
                 "\"always\" (got \"%s\") and --probe_every 0 or more\n",
                 FLAGS_heartbeats.c_str());
    return 2;
  }
  const int32_t expected_nodes =
      FLAGS_expected_nodes > 0 ? FLAGS_expected_nodes : FLAGS_nodes;
  // The certificate of channel 0 stands for all of them in the check.
  if (absl::Status checked = CheckTlsFiles(ChannelTlsFiles(0)); !checked.ok()) {
    std::fprintf(stderr, "baton-coordinator-load: %s\n",
                 std::string(checked.message()).c_str());
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
  ReportContext report;
  report.coordinator = FLAGS_coordinator;
  report.duration_s = FLAGS_duration_s;
  report.seal_timeout_s = FLAGS_seal_timeout_s;
  report.expected_nodes = expected_nodes;
  report.json = FLAGS_json;

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

  StatusClient status_client(FLAGS_coordinator, kStatusTimeout,
                             ChannelCredentials(ChannelTlsFiles(0)));
  status_client.set_page_size(FLAGS_status_page_size);
  LoadRecorder recorder;
  MembershipStore memberships;
  std::vector<std::unique_ptr<SimulatedAgent>> agents;
  // Declared after the agents, so shut down (every thread joined, after
  // every stream ended) before they are destroyed.
  CompletionQueuePool queues(FLAGS_completion_queues);
  queues.Start("load-cq");
  // Declared after the agents, so destroyed (its thread joined) first.
  Ticker ticker([&agents](int32_t agent, TimerKind kind) {
    agents[agent]->OnTimer(kind);
  });
  for (int i = 0; i < FLAGS_nodes; ++i) {
    const bool probe = FLAGS_heartbeats == "always" ||
                       (FLAGS_probe_every > 0 && i % FLAGS_probe_every == 0);
    results.probes += probe ? 1 : 0;
    agents.push_back(std::make_unique<SimulatedAgent>(
        i, expected_nodes, FLAGS_job, queues.queue(i % queues.size()),
        &recorder, &ticker, probe,
        FLAGS_restart_file.empty() ? nullptr : &memberships));
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
  results.forming = expected_nodes > FLAGS_nodes;
  if (results.forming) {
    results.forming = recorder.AwaitJoinsAccepted(
        FLAGS_nodes, join_start + absl::Seconds(FLAGS_seal_timeout_s));
  } else {
    results.sealed = recorder.AwaitMemberships(
        FLAGS_nodes, join_start + absl::Seconds(FLAGS_seal_timeout_s));
  }
  const ProcessSample after_seal = SampleProcess(FLAGS_coordinator_pid);
  results.seal_client_cpu_s = OwnCpuSeconds() - client_cpu_before_join;
  if (after_seal.ok) {
    results.seal_coordinator_cpu_s = after_seal.cpu_s - before_join.cpu_s;
  }
  if (!results.sealed && !results.forming) {
    results.coordinator = after_seal;
    ticker.Stop();
    Collect(recorder, ticker, &results);
    v1::JobStatus job;
    if (GetJobSummary(status_client, &job).ok() &&
        SealedAt(job) != absl::InfinitePast()) {
      results.coordinator_seal_s =
          absl::ToDoubleSeconds(SealedAt(job) - join_start);
    }
    PrintResults(results, report, human);
    std::fprintf(stderr,
                 "baton-coordinator-load: the job was not sealed within %d s "
                 "(--seal_timeout_s): %d of %d agents got their membership\n",
                 FLAGS_seal_timeout_s, results.memberships, FLAGS_nodes);
    CancelAll(agents, recorder);
    return 1;
  }
  const LoadRecorder::Snapshot joined = recorder.Take();
  results.seal_s = absl::ToDoubleSeconds(
      (results.forming ? joined.joins_accepted.last : joined.memberships.last) -
      join_start);

  // Steady state: heartbeats sent from now on are measured.
  const std::optional<ScrapedHistogram> handled_before = ScrapeHandling();
  const absl::Time window_end =
      recorder.OpenWindow(absl::Seconds(FLAGS_duration_s));
  if (FLAGS_status_interval_ms > 0) {
    StatusProbe probe(&status_client, FLAGS_job, FLAGS_status_page_size,
                      absl::Milliseconds(FLAGS_status_interval_ms));
    absl::SleepFor(window_end - absl::Now());
    probe.Stop();
    results.status = probe.Take();
  } else {
    absl::SleepFor(window_end - absl::Now());
  }
  results.coordinator = SampleProcess(FLAGS_coordinator_pid);
  if (const std::optional<ScrapedHistogram> handled_after = ScrapeHandling();
      handled_before.has_value() && handled_after.has_value()) {
    absl::StatusOr<ScrapedHistogram> handled =
        handled_after->Since(*handled_before);
    if (handled.ok()) {
      results.handling = *std::move(handled);
    } else {
      std::fprintf(stderr, "baton-coordinator-load: %s\n",
                   std::string(handled.status().message()).c_str());
    }
  }
  if (results.coordinator.ok) {
    results.steady_cpu_pct =
        100 * (results.coordinator.cpu_s - after_seal.cpu_s) / FLAGS_duration_s;
  }
  v1::JobStatus job;
  const absl::Status job_status = GetJobSummary(status_client, &job);
  if (job_status.ok() && SealedAt(job) != absl::InfinitePast()) {
    results.coordinator_seal_s =
        absl::ToDoubleSeconds(SealedAt(job) - join_start);
  }
  // Answers to the window's last heartbeats may still be on their way.
  absl::SleepFor(absl::Milliseconds(200));
  if (!FLAGS_restart_file.empty()) {
    // The agents keep heartbeating meanwhile, as the new coordinator's
    // liveness deadlines need.
    RestartOptions options;
    options.file = FLAGS_restart_file;
    options.timeout = absl::Seconds(FLAGS_restart_timeout_s);
    options.job = FLAGS_job;
    options.page_size = FLAGS_status_page_size;
    options.agents_per_channel = FLAGS_agents_per_channel;
    options.stream_time = kLeaveTimeout + kStatusTimeout;
    results.restart = RestartAndRejoin(options, agents, stubs, recorder,
                                       status_client, job.generation());
  }
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
  PrintResults(results, report, human);
  if (!job_status.ok()) {
    std::fprintf(human, "  Status.GetJob failed: %s\n",
                 job_status.ToString().c_str());
  } else if (FLAGS_print_status) {
    PrintJob(job, human);
  }
  std::fflush(nullptr);
  if (results.restart.asked && !results.restart.rejoined) {
    std::fprintf(stderr, "baton-coordinator-load: the restart failed: %s\n",
                 results.restart.failure.c_str());
    return 1;
  }
  return all_left ? 0 : 1;
}

}  // namespace
}  // namespace baton::bench

int main(int argc, char** argv) { return baton::bench::Main(argc, argv); }
