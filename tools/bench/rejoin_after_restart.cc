#include "tools/bench/rejoin_after_restart.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/bench/status_probe.h"

namespace baton::bench {

RestartResults RestartAndRejoin(
    const RestartOptions& options,
    std::vector<std::unique_ptr<SimulatedAgent>>& agents,
    std::vector<std::unique_ptr<v1::Coordinator::Stub>>& stubs,
    LoadRecorder& recorder, StatusClient& status_client, int64_t generation) {
  const int nodes = static_cast<int>(agents.size());
  RestartResults result;
  result.asked = true;
  result.generation_before = generation;
  const absl::Duration limit = options.timeout;
  const std::string seconds = absl::FormatDuration(limit);
  recorder.ExpectRestart();
  std::fprintf(stderr,
               "baton-coordinator-load: ready for the coordinator restart "
               "(waiting for %s)\n",
               options.file.c_str());
  std::fflush(stderr);
  if (!recorder.AwaitEnded(nodes, absl::Now() + limit)) {
    result.failure = absl::StrCat("the agents' streams did not end within ",
                                  seconds, ": was the coordinator killed?");
    return result;
  }
  recorder.RestartOver();
  int pid = 0;
  int64_t start_ms = 0;
  for (const absl::Time deadline = absl::Now() + limit; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(10))) {
    std::ifstream in(options.file);
    if (in >> pid >> start_ms) break;
    pid = 0;
  }
  if (pid <= 0) {
    result.failure = absl::StrCat("no \"PID START_UNIX_MS\" in ", options.file,
                                  " within ", seconds);
    return result;
  }
  const absl::Time started = absl::FromUnixMillis(start_ms);
  const double client_before = OwnCpuSeconds();
  const absl::Time stream_deadline =
      absl::Now() + 2 * limit + options.stream_time;
  for (size_t i = 0; i < agents.size(); ++i) {
    agents[i]->Reconnect(stubs[i / options.agents_per_channel].get(),
                         stream_deadline);
  }
  const bool all = recorder.AwaitRejoined(nodes, absl::Now() + limit);
  const LoadRecorder::Snapshot s = recorder.Take();
  result.rejoins = s.rejoined.count;
  result.reaccepted = s.reaccepted.count;
  if (s.reaccepted.count > 0) {
    result.reaccept_s = absl::ToDoubleSeconds(s.reaccepted.last - started);
  }
  if (s.rejoined.count > 0) {
    result.first_rejoin_s = absl::ToDoubleSeconds(s.rejoined.first - started);
    result.rejoin_s = absl::ToDoubleSeconds(s.rejoined.last - started);
  }
  if (!all) {
    result.failure = absl::StrCat("only ", s.rejoined.count, " of ", nodes,
                                  " agents rejoined within ", seconds);
    return result;
  }
  // Running again as status shows it: every member connected.
  bool running = false;
  for (const absl::Time deadline = absl::Now() + limit;
       !running && absl::Now() < deadline;) {
    const JobFetch fetch =
        FetchJob(status_client, options.job, options.page_size);
    if (!fetch.status.ok()) {
      result.failure = fetch.status.ToString();
    } else {
      result.connected_after = static_cast<int>(std::count_if(
          fetch.job.members().begin(), fetch.job.members().end(),
          [](const v1::MemberStatus& m) { return m.connected(); }));
      result.generation_after = fetch.job.generation();
      running = fetch.job.state() == v1::JOB_STATE_RUNNING &&
                result.connected_after == nodes;
    }
    if (running) {
      result.running_again_s = absl::ToDoubleSeconds(absl::Now() - started);
    } else {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  result.client_cpu_s = OwnCpuSeconds() - client_before;
  result.coordinator = SampleProcess(pid);
  // The new process's CPU since its start.
  if (result.coordinator.ok)
    result.coordinator_cpu_s = result.coordinator.cpu_s;
  if (!running) {
    result.failure = absl::StrCat(
        "the job did not run with every member connected within ", seconds,
        " of the rejoins (", result.connected_after, " connected)",
        result.failure.empty() ? "" : ": ", result.failure);
    return result;
  }
  if (result.generation_after != result.generation_before) {
    result.failure =
        absl::StrCat("the generation changed from ", result.generation_before,
                     " to ", result.generation_after);
    return result;
  }
  result.failure.clear();
  result.rejoined = true;
  return result;
}

}  // namespace baton::bench
