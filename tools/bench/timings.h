#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string_view>
#include <vector>

namespace baton::bench {

// Prints one JSON line summarizing per-iteration times of an allreduce of
// `bytes` over `ranks` ranks: percentiles, the mean, the share of iterations
// over 2 ms (the tail that makes a mean differ from the median) and the bus
// bandwidth of the median (2 (n-1)/n bytes per rank moved per allreduce, as
// nccl-tests defines it).
inline void PrintTimings(const char* path, int64_t bytes, int ranks,
                         std::vector<int64_t> micros) {
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double q) {
    return micros[std::min(micros.size() - 1,
                           static_cast<size_t>(q * micros.size()))];
  };
  const int64_t median = at(0.5);
  int64_t total = 0;
  size_t over_2ms = 0;
  for (int64_t us : micros) {
    total += us;
    if (us > 2000) ++over_2ms;
  }
  const double mean = static_cast<double>(total) / micros.size();
  const double factor = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0;
  const double busbw_gbps =
      median > 0 ? factor * static_cast<double>(bytes) / median / 1e3 : 0;
  std::printf(
      "{\"path\":\"%s\",\"bytes\":%" PRId64
      ",\"ranks\":%d,\"iterations\":%zu,"
      "\"p50_us\":%" PRId64 ",\"p99_us\":%" PRId64 ",\"min_us\":%" PRId64
      ",\"mean_us\":%.0f,\"over_2ms\":%.3f,\"busbw_gbps\":%.3f}\n",
      path, bytes, ranks, micros.size(), median, at(0.99), micros.front(), mean,
      static_cast<double>(over_2ms) / micros.size(), busbw_gbps);
  std::fflush(stdout);
}

// busbw / algbw of tools/bench/collectives' `op` on `nodes` ranks, where
// algbw = bytes / time and bytes is the op's size as
// tools/bench/collectives/measurement.h defines it: the bytes each rank's
// link carries, as nccl-tests counts them. An allreduce 2(n-1)/n, a
// broadcast 1; an allgather n-1 (nccl-tests: the gathered n x bytes times
// (n-1)/n); a reduce-scatter of the whole tensor (n-1)/n; an alltoall of the
// whole tensor (n-1)/n (all but the rank's own block leave it).
inline double CollectiveBusFactor(std::string_view op, int nodes) {
  if (nodes < 2) return 1.0;
  if (op == "allreduce") return 2.0 * (nodes - 1) / nodes;
  if (op == "allgather") return nodes - 1.0;
  if (op == "reducescatter" || op == "alltoall") return (nodes - 1.0) / nodes;
  return 1.0;
}

// Prints one row of tools/bench/collectives (JSON, one line): the time per
// iteration of `op` of `bytes` on `nodes` ranks of `system`, over runs of
// `iterations` each (`run_seconds`: total / I per run, not empty): the
// median and, for the spread, min and max. Bandwidths are those of the
// median in GB/s (1e9 bytes/s): algbw = bytes / time, busbw = algbw x
// CollectiveBusFactor.
inline void PrintCollectiveRow(const char* system, const char* op, int nodes,
                               int64_t bytes, int iterations,
                               std::vector<double> run_seconds) {
  std::sort(run_seconds.begin(), run_seconds.end());
  const size_t n = run_seconds.size();
  const double median = n % 2 == 1
                            ? run_seconds[n / 2]
                            : (run_seconds[n / 2 - 1] + run_seconds[n / 2]) / 2;
  const double algbw_gbps =
      median > 0 ? static_cast<double>(bytes) / median / 1e9 : 0;
  const double factor = CollectiveBusFactor(op, nodes);
  std::printf(
      "{\"bench\":\"collectives\",\"system\":\"%s\",\"op\":\"%s\","
      "\"nodes\":%d,\"bytes\":%" PRId64
      ",\"iterations\":%d,\"runs\":%zu,\"median_s\":%.9g,"
      "\"min_s\":%.9g,\"max_s\":%.9g,\"algbw_gbps\":%.6g,"
      "\"busbw_gbps\":%.6g}\n",
      system, op, nodes, bytes, iterations, n, median, run_seconds.front(),
      run_seconds.back(), algbw_gbps, algbw_gbps * factor);
  std::fflush(stdout);
}

}  // namespace baton::bench
