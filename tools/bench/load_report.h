// The load generator's results: what one run measured, and its report
// (a human summary, and one JSON line for run_coordinator_load's table).

#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/metrics_scrape.h"
#include "tools/bench/load_recorder.h"
#include "tools/bench/process_sample.h"
#include "tools/bench/rejoin_after_restart.h"
#include "tools/bench/status_probe.h"

namespace baton::bench {

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
  // --expected_nodes above --nodes: the job forms and never seals.
  bool forming = false;
  // Agents that heartbeat at every interval (their round trips are timed).
  int probes = 0;
  std::vector<int64_t> round_trips_us;  // Sorted.
  int64_t window_heartbeats = 0;
  double ticker_lag_ms = 0;
  LoadRecorder::Counters counters;
  std::vector<std::string> texts;
  ProcessSample coordinator;
  double steady_cpu_pct = -1;
  double client_cpu_s = 0;
  StatusProbe::Summary status;
  // The coordinator's handling of the steady state's messages (empty
  // without --coordinator_metrics).
  ScrapedHistogram handling;
  RestartResults restart;
};

// What the report says about the run's setting.
struct ReportContext {
  std::string coordinator;
  int duration_s = 0;
  int seal_timeout_s = 0;
  int expected_nodes = 0;
  // Also print the JSON line on stdout.
  bool json = false;
};

// The `q` quantile of sorted values; -1 when there are none.
double Percentile(const std::vector<double>& sorted, double q);
double PercentileMs(const std::vector<int64_t>& sorted_us, double q);

// The summary on `human`; with context.json, the JSON line on stdout.
void PrintResults(const Results& r, const ReportContext& context, FILE* human);

}  // namespace baton::bench
