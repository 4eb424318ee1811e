// The load generator's restart scenario: the coordinator is killed and
// started again on its address; every simulated agent reconnects and
// rejoins with the membership it received, and the run measures how long
// the job takes to run again as it did.

#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "baton/status_client.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "tools/bench/load_recorder.h"
#include "tools/bench/process_sample.h"
#include "tools/bench/simulated_agent.h"

namespace baton::bench {

struct RestartOptions {
  // Where the script writes "PID START_UNIX_MS" of the new coordinator.
  std::string file;
  // For each wait: the kill, the file, the rejoins, the running job.
  absl::Duration timeout = absl::Seconds(120);
  std::string job;
  int32_t page_size = 0;
  int agents_per_channel = 256;
  // How long the new streams may last past the rejoins (the leave).
  absl::Duration stream_time = absl::Seconds(70);
};

// -1 where not measured. Times are from the new coordinator's start.
struct RestartResults {
  bool asked = false;
  // Every agent rejoined, and the job ran again with every member
  // connected at the generation it had before.
  bool rejoined = false;
  std::string failure;
  int rejoins = 0;
  int reaccepted = 0;
  // The last session accepted again; the first and the last RejoinJob
  // accepted (so far, when not every agent rejoined); status shows the job
  // running with every member connected.
  double reaccept_s = -1;
  double first_rejoin_s = -1;
  double rejoin_s = -1;
  double running_again_s = -1;
  int64_t generation_before = 0;
  int64_t generation_after = 0;
  int connected_after = 0;
  // The new coordinator's since its start; the load generator's from
  // the file until the job ran again.
  double coordinator_cpu_s = -1;
  double client_cpu_s = -1;
  ProcessSample coordinator;
};

// Runs the scenario once the steady state is over; the ticker must keep
// firing (heartbeats) throughout. `generation`: the job's before the kill.
RestartResults RestartAndRejoin(
    const RestartOptions& options,
    std::vector<std::unique_ptr<SimulatedAgent>>& agents,
    std::vector<std::unique_ptr<v1::Coordinator::Stub>>& stubs,
    LoadRecorder& recorder, StatusClient& status_client, int64_t generation);

}  // namespace baton::bench
