#include "common/init.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

namespace {

// Unknown flags and malformed values are usage errors (exit 2, one line);
// gflags alone would exit 1 for them.
absl::Status CheckFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
    name = name.substr(0, name.find('='));
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      const size_t equals = arg.find('=');
      if (equals != std::string::npos &&
          gflags::SetCommandLineOption(name.c_str(),
                                       arg.substr(equals + 1).c_str())
              .empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(arg, " is not a valid ", info.type, ": fix --", name));
      }
      continue;
    }
    // --nofoo clears the boolean flag foo.
    if (absl::StartsWith(name, "no") &&
        gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
        info.type == "bool") {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag ", arg.substr(0, arg.find('=')),
                     ": see --help for the flags this program takes"));
  }
  return absl::OkStatus();
}

// --help lists this program's own flags (with their defaults), not the
// logging library's; --helpfull lists everything.
void ShowHelpIfAsked(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg != "--help" && arg != "-help") continue;
    std::printf(
        "%s\n\nFlags (BATON_<FLAG> in the environment sets each; the "
        "command line wins):\n",
        gflags::ProgramUsage());
    std::vector<gflags::CommandLineFlagInfo> flags;
    gflags::GetAllFlags(&flags);
    for (const gflags::CommandLineFlagInfo& flag : flags) {
      if (!absl::StartsWith(flag.filename, BATON_SOURCE_DIR)) continue;
      std::printf("  --%s (%s)\n      type: %s  default: %s\n",
                  flag.name.c_str(), flag.description.c_str(),
                  flag.type.c_str(),
                  flag.type == "string"
                      ? absl::StrCat("\"", flag.default_value, "\"").c_str()
                      : flag.default_value.c_str());
    }
    std::exit(0);
  }
}

}  // namespace

void InitProcess(int* argc, char*** argv, const char* usage) {
  gflags::SetUsageMessage(usage);
  ShowHelpIfAsked(*argc, *argv);
  absl::Status status = CheckFlagNames(*argc, *argv);
  if (status.ok()) status = ApplyEnvironmentOverrides();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", (*argv)[0],
                 std::string(status.message()).c_str());
    std::exit(2);
  }
  gflags::ParseCommandLineFlags(argc, argv, /*remove_flags=*/true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging((*argv)[0]);
  std::signal(SIGPIPE, SIG_IGN);
}

sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

}  // namespace baton
