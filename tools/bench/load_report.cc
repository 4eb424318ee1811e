#include "tools/bench/load_report.h"

namespace baton::bench {

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return -1;
  return sorted[static_cast<size_t>(q * (sorted.size() - 1) + 0.5)];
}

double PercentileMs(const std::vector<int64_t>& sorted_us, double q) {
  if (sorted_us.empty()) return -1;
  const size_t i = static_cast<size_t>(q * (sorted_us.size() - 1) + 0.5);
  return sorted_us[i] / 1000.0;
}

void PrintResults(const Results& r, const ReportContext& context, FILE* human) {
  const double p50 = PercentileMs(r.round_trips_us, 0.50);
  const double p99 = PercentileMs(r.round_trips_us, 0.99);
  const double max = PercentileMs(r.round_trips_us, 1.0);
  const long long samples = static_cast<long long>(r.round_trips_us.size());
  const LoadRecorder::Counters& c = r.counters;
  const long long errors = c.errors + c.stream_failures;
  std::fprintf(human, "coordinator load: %d nodes on %d channels against %s\n",
               r.nodes, r.channels, context.coordinator.c_str());
  std::fprintf(human,
               "  sessions accepted after %.3f s (first to last %.3f s)\n",
               r.accept_s, r.accept_spread_s);
  if (r.forming) {
    std::fprintf(human,
                 "  forming job (expects %d nodes, never sealed): %d joins "
                 "accepted within %.3f s of the first JoinJob\n",
                 context.expected_nodes, r.joins_accepted, r.seal_s);
  }
  if (r.sealed) {
    std::fprintf(human,
                 "  time to seal %.3f s from the first JoinJob to the last "
                 "membership (the coordinator's seal event: %.3f s); CPU "
                 "meanwhile: coordinator %.2f s, load generator %.2f s\n",
                 r.seal_s, r.coordinator_seal_s, r.seal_coordinator_cpu_s,
                 r.seal_client_cpu_s);
  }
  if (r.sealed || r.forming) {
    std::fprintf(human,
                 "  heartbeat round trip in steady state (%d agents "
                 "heartbeating): p50 %.2f ms, p99 %.2f ms, max %.2f ms (%lld "
                 "samples, %lld unanswered)\n",
                 r.probes, p50, p99, max, samples,
                 static_cast<long long>(r.window_heartbeats) - samples);
  } else {
    std::fprintf(human,
                 "  NOT SEALED within %d s: %d of %d joins accepted, %d of %d "
                 "memberships received\n",
                 context.seal_timeout_s, r.joins_accepted, r.nodes,
                 r.memberships, r.nodes);
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
  const double handling_p50 = r.handling.Quantile(0.5).value_or(-1);
  const double handling_p99 = r.handling.Quantile(0.99).value_or(-1);
  const double within_10ms = r.handling.FractionAtMost(0.01).value_or(-1);
  if (r.handling.total() > 0) {
    std::fprintf(human,
                 "  the coordinator's message handling in steady state "
                 "(baton_agent_message_seconds, %llu messages): p50 %.2f ms, "
                 "p99 %.2f ms (interpolated in its buckets), %.2f%% within "
                 "10 ms\n",
                 static_cast<unsigned long long>(r.handling.total()),
                 handling_p50 * 1000, handling_p99 * 1000, 100 * within_10ms);
  }
  const StatusProbe::Summary& st = r.status;
  if (st.fetches > 0) {
    std::fprintf(human,
                 "  whole status (Status.GetJob, %d pages, %d members, %.1f "
                 "KiB) in steady state: p50 %.1f ms, max %.1f ms over %d "
                 "fetches (%d failed%s%s); a page: p50 %.1f ms, max %.1f ms\n",
                 st.pages_per_fetch, st.members, st.bytes_per_fetch / 1024.0,
                 Percentile(st.fetch_ms, 0.5), Percentile(st.fetch_ms, 1.0),
                 st.fetches, st.failures, st.failures > 0 ? ": " : "",
                 st.first_failure.c_str(), Percentile(st.page_ms, 0.5),
                 Percentile(st.page_ms, 1.0));
  }
  const RestartResults& rs = r.restart;
  if (rs.asked) {
    if (rs.rejoined) {
      std::fprintf(
          human,
          "  coordinator restart: from its start, sessions accepted again "
          "after %.3f s, every rejoin accepted after %.3f s, the job running "
          "with %d of %d members connected at generation %lld (before: "
          "%lld) after %.3f s; CPU meanwhile: coordinator %.2f s, load "
          "generator %.2f s; coordinator RSS then %.1f MiB\n",
          rs.reaccept_s, rs.rejoin_s, rs.connected_after, r.nodes,
          static_cast<long long>(rs.generation_after),
          static_cast<long long>(rs.generation_before), rs.running_again_s,
          rs.coordinator_cpu_s, rs.client_cpu_s, rs.coordinator.rss_mib);
    } else {
      std::fprintf(human,
                   "  coordinator restart FAILED: %s (from its start: %d of %d "
                   "sessions accepted again by %.3f s, %d rejoins accepted "
                   "from %.3f s to %.3f s)\n",
                   rs.failure.c_str(), rs.reaccepted, r.nodes, rs.reaccept_s,
                   rs.rejoins, rs.first_rejoin_s, rs.rejoin_s);
    }
  }
  if (!context.json) return;
  std::printf(
      "{\"nodes\":%d,\"channels\":%d,\"duration_s\":%d,\"forming\":%s,"
      "\"sealed\":%s,"
      "\"memberships\":%d,\"accept_s\":%.4f,\"seal_s\":%.4f,"
      "\"coordinator_seal_s\":%.3f,\"seal_coordinator_cpu_s\":%.2f,"
      "\"seal_client_cpu_s\":%.2f,\"latency_samples\":%lld,"
      "\"unanswered\":%lld,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,"
      "\"ticker_lag_max_ms\":%.1f,\"heartbeats\":%lld,\"reports\":%lld,"
      "\"errors\":%lld,\"error_messages\":%lld,\"stream_failures\":%lld,"
      "\"clean_closes\":%lld,\"aborted_generations\":%lld,\"rss_mib\":%.1f,"
      "\"hwm_mib\":%.1f,\"cpu_s\":%.2f,\"steady_cpu_pct\":%.1f,"
      "\"client_cpu_s\":%.2f,\"probes\":%d,\"handled_messages\":%llu,"
      "\"handling_p50_ms\":%.3f,\"handling_p99_ms\":%.3f,"
      "\"handling_within_10ms\":%.4f,",
      r.nodes, r.channels, context.duration_s, r.forming ? "true" : "false",
      r.sealed ? "true" : "false", r.memberships, r.accept_s, r.seal_s,
      r.coordinator_seal_s, r.seal_coordinator_cpu_s, r.seal_client_cpu_s,
      samples, static_cast<long long>(r.window_heartbeats) - samples, p50, p99,
      max, r.ticker_lag_ms, static_cast<long long>(c.heartbeats),
      static_cast<long long>(c.reports), errors,
      static_cast<long long>(c.errors),
      static_cast<long long>(c.stream_failures),
      static_cast<long long>(c.clean_closes),
      static_cast<long long>(c.aborted_generations), r.coordinator.rss_mib,
      r.coordinator.hwm_mib, r.coordinator.cpu_s, r.steady_cpu_pct,
      r.client_cpu_s, r.probes,
      static_cast<unsigned long long>(r.handling.total()),
      r.handling.total() > 0 ? handling_p50 * 1000 : -1,
      r.handling.total() > 0 ? handling_p99 * 1000 : -1, within_10ms);
  std::printf(
      "\"status_fetches\":%d,\"status_failures\":%d,\"status_pages\":%d,"
      "\"status_members\":%d,\"status_kib\":%.1f,\"status_p50_ms\":%.2f,"
      "\"status_max_ms\":%.2f,\"status_page_p50_ms\":%.2f,"
      "\"status_page_max_ms\":%.2f,\"restart\":%s,\"rejoined\":%s,"
      "\"rejoins\":%d,\"reaccepted\":%d,\"reaccept_s\":%.3f,"
      "\"first_rejoin_s\":%.3f,\"rejoin_s\":%.3f,"
      "\"running_again_s\":%.3f,\"generation_before\":%lld,"
      "\"generation_after\":%lld,\"connected_after\":%d,"
      "\"rejoin_coordinator_cpu_s\":%.2f,\"rejoin_client_cpu_s\":%.2f,"
      "\"restarted_rss_mib\":%.1f}\n",
      st.fetches, st.failures, st.pages_per_fetch, st.members,
      st.bytes_per_fetch / 1024.0, Percentile(st.fetch_ms, 0.5),
      Percentile(st.fetch_ms, 1.0), Percentile(st.page_ms, 0.5),
      Percentile(st.page_ms, 1.0), rs.asked ? "true" : "false",
      rs.rejoined ? "true" : "false", rs.rejoins, rs.reaccepted, rs.reaccept_s,
      rs.first_rejoin_s, rs.rejoin_s, rs.running_again_s,
      static_cast<long long>(rs.generation_before),
      static_cast<long long>(rs.generation_after), rs.connected_after,
      rs.coordinator_cpu_s, rs.client_cpu_s, rs.coordinator.rss_mib);
}

}  // namespace baton::bench
