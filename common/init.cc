#include "common/init.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace baton {

absl::Status ApplyEnvironmentOverrides() {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const gflags::CommandLineFlagInfo& flag : flags) {
    const std::string variable =
        absl::StrCat("BATON_", absl::AsciiStrToUpper(flag.name));
    const char* value = std::getenv(variable.c_str());
    if (value == nullptr) continue;
    if (gflags::SetCommandLineOption(flag.name.c_str(), value).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", variable, "=\"", value,
                       "\" is not a valid value for --", flag.name, " (",
                       flag.type, "): fix it or unset it"));
    }
  }
  return absl::OkStatus();
}

void InitProcess(int* argc, char*** argv, const char* usage) {
  gflags::SetUsageMessage(usage);
  if (absl::Status status = ApplyEnvironmentOverrides(); !status.ok()) {
    std::fprintf(stderr, "%s: %s\n", (*argv)[0],
                 std::string(status.message()).c_str());
    std::exit(2);
  }
  gflags::ParseCommandLineFlags(argc, argv, /*remove_flags=*/true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging((*argv)[0]);
  std::signal(SIGPIPE, SIG_IGN);
}

}  // namespace baton
