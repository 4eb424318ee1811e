#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "baton/v1/status.pb.h"
#include "coordinator/bucket_histogram.h"
#include "coordinator/control_loop.h"
#include "coordinator/coordinator.h"
#include "coordinator/reform_log.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace baton::coordinator {

// The coordinator's Prometheus metrics (docs/operations.md, "Metrics"),
// computed at each scrape from the state the control loop owns: the scrape's
// thread posts a task that reads the coordinator on the loop, and waits for
// it. The values are those batonctl's status shows at the same moment.
//
// Thread-safe: Collect runs on the metrics endpoint's threads. A loop that
// does not answer within `timeout` makes an empty scrape and a warning,
// never a scraper blocked for good.
class CoordinatorMetrics : public prometheus::Collectable {
 public:
  // What one scrape reads from the coordinator, on the loop thread.
  struct Snapshot {
    int connected_agents = 0;
    // Each job's own fields, without members.
    v1::ListJobsResponse jobs;
    // By job name.
    absl::flat_hash_map<std::string, ReformHistogram> reform_seconds;
    // By job name, of running jobs: each rank's lag, indexed by rank.
    absl::flat_hash_map<std::string, std::vector<int64_t>> rank_lags;
    MessageHistogram message_seconds;
  };

  // `loop` and `coordinator` must outlive every scrape: destroy the
  // endpoint serving this before them.
  CoordinatorMetrics(ControlLoop* loop, const Coordinator* coordinator,
                     absl::Duration timeout = absl::Seconds(5));

  std::vector<prometheus::MetricFamily> Collect() const override;

  // Call on the loop thread.
  static Snapshot Take(const Coordinator& coordinator);
  // The metric families of `snapshot`, each with its help text and type.
  static std::vector<prometheus::MetricFamily> Families(
      const Snapshot& snapshot);

 private:
  // Constant after construction.
  ControlLoop* const loop_;
  const Coordinator* const coordinator_;
  const absl::Duration timeout_;
};

}  // namespace baton::coordinator
