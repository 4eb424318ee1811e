#include "tests/integration/metrics_scrape.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace baton {

std::string SampleMismatches(
    const std::string& text,
    const std::vector<std::pair<std::string, double>>& expected) {
  std::string mismatches;
  for (const auto& [series, want] : expected) {
    const std::optional<double> got = SampleValue(text, series);
    if (got == want) continue;
    absl::StrAppend(&mismatches, series, ": want ", want, ", ",
                    got.has_value() ? absl::StrCat("got ", *got) : "absent",
                    "\n");
  }
  return mismatches;
}

absl::Status CheckWithPromtool(const std::string& text) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    return absl::NotFoundError(
        "promtool is not installed (apt-get install prometheus)");
  }
  char dir_pattern[] = "/tmp/baton-promtool.XXXXXX";
  const std::string dir = mkdtemp(dir_pattern);
  const std::string input = dir + "/metrics.txt";
  const std::string output = dir + "/promtool.out";
  std::ofstream(input) << text;
  const int status = std::system(
      absl::StrCat("promtool check metrics < ", input, " > ", output, " 2>&1")
          .c_str());
  std::stringstream report;
  report << std::ifstream(output).rdbuf();
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  if (status != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("promtool check metrics failed:\n", report.str()));
  }
  return absl::OkStatus();
}

}  // namespace baton
