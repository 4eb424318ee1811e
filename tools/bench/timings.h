#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace baton::bench {

// Prints one JSON line summarizing per-iteration times of an allreduce of
// `bytes` over `ranks` ranks: percentiles and the bus bandwidth of the median
// (2 (n-1)/n bytes per rank moved per allreduce, as nccl-tests defines it).
inline void PrintTimings(const char* path, int64_t bytes, int ranks,
                         std::vector<int64_t> micros) {
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double q) {
    return micros[std::min(micros.size() - 1,
                           static_cast<size_t>(q * micros.size()))];
  };
  const int64_t median = at(0.5);
  const double factor = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0;
  const double busbw_gbps =
      median > 0 ? factor * static_cast<double>(bytes) / median / 1e3 : 0;
  std::printf("{\"path\":\"%s\",\"bytes\":%" PRId64
              ",\"ranks\":%d,\"iterations\":%zu,"
              "\"p50_us\":%" PRId64 ",\"p99_us\":%" PRId64
              ",\"min_us\":%" PRId64 ",\"busbw_gbps\":%.3f}\n",
              path, bytes, ranks, micros.size(), median, at(0.99),
              micros.front(), busbw_gbps);
  std::fflush(stdout);
}

}  // namespace baton::bench
