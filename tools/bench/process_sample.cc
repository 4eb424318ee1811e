// ProcessSample: /proc and getrusage readings for the load generator.

#include "tools/bench/process_sample.h"

#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace baton::bench {

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

}  // namespace baton::bench
