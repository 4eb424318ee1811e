#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/gpu_support.h"
#include "agent/links.h"
#include "agent/transport/transport.h"
#include "common/clock.h"

namespace baton::agent {

// Builds the rendezvous store of one (job, generation).
using StoreFactory = std::function<std::shared_ptr<KeyValueStore>(
    const std::string& job, int64_t generation)>;

// What the agent gives each of its jobs. The pointers outlive the job.
struct JobEnvironment {
  const AgentConfig* config = nullptr;
  CoordinatorLink* coordinator = nullptr;
  Transport* transport = nullptr;
  // Never null.
  const GpuSupport* gpus = nullptr;
  StoreFactory store_factory;
  // This job's metrics on this node (never null).
  std::shared_ptr<JobMetrics> metrics;
  // Every reading of time in the job; null: Clock::Real().
  Clock* clock = nullptr;
  // Called once from the job's thread when the job is over on this node;
  // the owner then destroys the job from another thread.
  std::function<void()> on_done;
};

}  // namespace baton::agent
