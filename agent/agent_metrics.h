#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace baton::agent {

// One job's Prometheus series on this node (docs/operations.md, "Metrics").
// Obtained from AgentMetrics::ForJob; every AgentJob of that name on this
// node shares it, so counters keep counting across a job attached again.
//
// Thread-safe: the job's thread updates it, scrapes read it.
class JobMetrics {
 public:
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // An operation on `tensor` completed: `latency` from its first local
  // enqueue to its completion, `bytes` the tensor's size.
  void OperationCompleted(const std::string& tensor,
                          std::chrono::steady_clock::duration latency,
                          int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // An operation failed (its trainers were told why).
  void OperationFailed();
  // A trainer's enqueue was refused before it became an operation.
  void EnqueueRefused();
  // A negotiation round of the job's data plane: this node's exchange took
  // `exchange`; `started`: this node had news of its own (Scheduler::
  // Callbacks::round_exchanged).
  void NegotiationRound(std::chrono::steady_clock::duration exchange,
                        bool started);
  // A collective of the job's data plane left `bytes` out (blocks of zeros).
  void BytesSkipped(int64_t bytes);
  // Sampled state: the data plane's queue depth and credit in use (0 and 0
  // without a data plane), and the trainers attached and not detached.
  void SetDataPlane(int64_t queue_depth, int64_t credit_in_use_bytes);
  void SetTrainersAttached(int trainers);

 private:
  friend class AgentMetrics;
  struct Families;

  JobMetrics(std::string job, std::shared_ptr<const Families> families);
  // Takes this job's series out of the registry; nothing may use it after.
  void Remove() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction. `families_` keeps the registry alive: an
  // AgentJob may outlive the Agent that created it.
  const std::string job_;
  const std::shared_ptr<const Families> families_;
  prometheus::Counter& bytes_;
  prometheus::Counter& skipped_;
  prometheus::Counter& ok_;
  prometheus::Counter& failed_;
  prometheus::Counter& refused_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& credit_in_use_;
  prometheus::Gauge& trainers_;
  prometheus::Histogram& rounds_started_;
  prometheus::Histogram& rounds_joined_;

  absl::Mutex mu_;
  // By tensor name, created at the tensor's first completion.
  absl::flat_hash_map<std::string, prometheus::Histogram*> latency_
      ABSL_GUARDED_BY(mu_);
};

// The agent's metrics: a registry to serve (registry()) and one JobMetrics
// per job name. A job's series outlive its AgentJobs by `retention`, so
// that a scrape after the job ended still sees its final counts; then they
// are removed, so a long-running agent does not keep the series of every job
// it ever ran.
//
// Thread-safe.
class AgentMetrics {
 public:
  explicit AgentMetrics(absl::Duration retention);
  ~AgentMetrics();
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  std::shared_ptr<prometheus::Registry> registry() const;

  // The series of `job`, created on first use. Hold the pointer while the
  // job runs: series are only removed while nobody holds them.
  std::shared_ptr<JobMetrics> ForJob(const std::string& job)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the series of jobs that nobody held for `retention` up to
  // `now`. Call periodically.
  void RemoveIdle(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static std::shared_ptr<const JobMetrics::Families> NewFamilies();

  struct Entry {
    std::shared_ptr<JobMetrics> metrics;
    // When nobody but this map was first seen holding it; the infinite
    // future: held.
    absl::Time idle_since = absl::InfiniteFuture();
  };

  // Constant after construction.
  const absl::Duration retention_;
  const std::shared_ptr<const JobMetrics::Families> families_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::agent
