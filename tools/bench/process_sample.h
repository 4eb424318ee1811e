// The coordinator's process as /proc shows it, and this process's own CPU
// time, for the load generator's summary.

#pragma once

namespace baton::bench {

// The coordinator process as /proc shows it.
struct ProcessSample {
  bool ok = false;
  double rss_mib = 0;
  double hwm_mib = 0;
  double cpu_s = 0;
};

// Samples `pid` from /proc; not ok when pid <= 0 or /proc cannot be read.
ProcessSample SampleProcess(int pid);

// User plus system CPU seconds this process has used.
double OwnCpuSeconds();

}  // namespace baton::bench
