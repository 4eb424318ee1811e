#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace baton::coordinator {

// Every tunable of the coordinator; main.cc fills it from flags.
struct CoordinatorOptions {
  // Agents send a heartbeat this often when otherwise silent.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // A session silent this long is lost. With the tick, a lost node is
  // detected within liveness_timeout + tick_interval.
  absl::Duration liveness_timeout = absl::Seconds(6);
  // Agents send step reports this often.
  absl::Duration report_interval = absl::Seconds(1);
  // How often the control loop checks deadlines.
  absl::Duration tick_interval = absl::Milliseconds(100);
  // A tensor waited on this long by some ranks is a stall.
  absl::Duration stall_threshold = absl::Seconds(10);
  // A re-forming job that is not whole again within this fails.
  absl::Duration reform_timeout = absl::Seconds(60);
  // A node that joins a running job below its node count waits at most this
  // long for a member's trainers to reach a commit (baton.torch.elastic)
  // before the job re-forms to admit it.
  absl::Duration join_wait = absl::Seconds(30);
  // Ended jobs stay visible in status this long.
  absl::Duration job_retention = absl::Minutes(10);
  // Partition size of jobs that do not ask for one.
  int64_t partition_bytes = int64_t{4} << 20;
  // Recent events kept per job.
  int events_per_job = 100;
  // Agents are told to reconnect after this long when the coordinator shuts
  // down.
  absl::Duration shutdown_retry_after = absl::Seconds(1);
  // Completion queues (each with a thread) the agent sessions are spread
  // over.
  int session_queues = 8;
};

}  // namespace baton::coordinator
