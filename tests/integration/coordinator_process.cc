#include "tests/integration/coordinator_process.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifndef BATON_COORDINATOR_BIN
#error "BATON_COORDINATOR_BIN must name the baton-coordinator binary"
#endif

namespace baton {

std::string CoordinatorProcess::BinaryPath() { return BATON_COORDINATOR_BIN; }

absl::Status CoordinatorProcess::Start(const std::vector<std::string>& flags,
                                       int port, absl::Duration timeout) {
  ChildProcess::Options options;
  options.argv = {BinaryPath(), "--listen", absl::StrCat("127.0.0.1:", port)};
  options.argv.insert(options.argv.end(), flags.begin(), flags.end());
  options.ready_prefix = "baton-coordinator listening on ";
  options.timeout = timeout;
  options.stderr_path = stderr_path_;
  if (absl::Status status = process_.Start(options); !status.ok()) {
    return status;
  }
  const std::string& address = process_.ready_line();
  int bound_port = 0;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &bound_port) ||
      bound_port <= 0) {
    process_.Kill();
    return absl::InternalError(absl::StrCat(
        "cannot parse the coordinator's address \"", address, "\""));
  }
  address_ = address;
  port_ = bound_port;
  return absl::OkStatus();
}

ProcessExit CoordinatorProcess::Terminate(absl::Duration timeout) {
  return process_.Terminate(timeout);
}

ProcessExit CoordinatorProcess::Kill() { return process_.Kill(); }

}  // namespace baton
