#include "agent/agent_metrics.h"

#include <utility>

#include "common/metrics.h"

namespace baton::agent {
namespace {

// Enqueue-to-completion latency buckets, in seconds: from a small tensor on
// one node (~100 us) to a collective near --op_timeout_ms.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const buckets =
      new prometheus::Histogram::BucketBoundaries{
          0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *buckets;
}

// Negotiation round buckets, in seconds: from a round on loopback (~50 us)
// to one that waits for a slow node.
const prometheus::Histogram::BucketBoundaries& RoundBuckets() {
  static const auto* const buckets =
      new prometheus::Histogram::BucketBoundaries{
          0.00002, 0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0004,
          0.0005,  0.00075, 0.001,  0.0015,  0.002,  0.003,  0.005,
          0.0075,  0.01,    0.025,  0.05,    0.1,    0.25,   1};
  return *buckets;
}

}  // namespace

// The families live in `registry`, which owns them.
struct JobMetrics::Families {
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Family<prometheus::Histogram>& latency;
  prometheus::Family<prometheus::Counter>& bytes;
  prometheus::Family<prometheus::Counter>& skipped;
  prometheus::Family<prometheus::Counter>& operations;
  prometheus::Family<prometheus::Gauge>& queue_depth;
  prometheus::Family<prometheus::Gauge>& credit_in_use;
  prometheus::Family<prometheus::Gauge>& trainers;
  prometheus::Family<prometheus::Histogram>& rounds;
};

JobMetrics::JobMetrics(std::string job,
                       std::shared_ptr<const Families> families)
    : job_(std::move(job)),
      families_(std::move(families)),
      bytes_(families_->bytes.Add({{kJobLabel, job_}})),
      skipped_(families_->skipped.Add({{kJobLabel, job_}})),
      ok_(families_->operations.Add({{kJobLabel, job_}, {"result", "ok"}})),
      failed_(
          families_->operations.Add({{kJobLabel, job_}, {"result", "failed"}})),
      refused_(families_->operations.Add(
          {{kJobLabel, job_}, {"result", "refused"}})),
      queue_depth_(families_->queue_depth.Add({{kJobLabel, job_}})),
      credit_in_use_(families_->credit_in_use.Add({{kJobLabel, job_}})),
      trainers_(families_->trainers.Add({{kJobLabel, job_}})),
      rounds_started_(families_->rounds.Add(
          {{kJobLabel, job_}, {"started_by", "this_node"}}, RoundBuckets())),
      rounds_joined_(families_->rounds.Add(
          {{kJobLabel, job_}, {"started_by", "peer"}}, RoundBuckets())) {}

void JobMetrics::OperationCompleted(const std::string& tensor,
                                    std::chrono::steady_clock::duration latency,
                                    int64_t bytes) {
  prometheus::Histogram* histogram = nullptr;
  {
    absl::MutexLock lock(&mu_);
    prometheus::Histogram*& slot = latency_[tensor];
    if (slot == nullptr) {
      slot = &families_->latency.Add({{kJobLabel, job_}, {"tensor", tensor}},
                                     LatencyBuckets());
    }
    histogram = slot;
  }
  histogram->Observe(std::chrono::duration<double>(latency).count());
  bytes_.Increment(static_cast<double>(bytes));
  ok_.Increment();
}

void JobMetrics::OperationFailed() { failed_.Increment(); }

void JobMetrics::EnqueueRefused() { refused_.Increment(); }

void JobMetrics::NegotiationRound(std::chrono::steady_clock::duration exchange,
                                  bool started) {
  (started ? rounds_started_ : rounds_joined_)
      .Observe(std::chrono::duration<double>(exchange).count());
}

void JobMetrics::BytesSkipped(int64_t bytes) {
  skipped_.Increment(static_cast<double>(bytes));
}

void JobMetrics::SetDataPlane(int64_t queue_depth,
                              int64_t credit_in_use_bytes) {
  queue_depth_.Set(static_cast<double>(queue_depth));
  credit_in_use_.Set(static_cast<double>(credit_in_use_bytes));
}

void JobMetrics::SetTrainersAttached(int trainers) { trainers_.Set(trainers); }

void JobMetrics::Remove() {
  absl::MutexLock lock(&mu_);
  for (auto& [tensor, histogram] : latency_) {
    families_->latency.Remove(histogram);
  }
  latency_.clear();
  families_->bytes.Remove(&bytes_);
  families_->skipped.Remove(&skipped_);
  for (prometheus::Counter* counter : {&ok_, &failed_, &refused_}) {
    families_->operations.Remove(counter);
  }
  families_->queue_depth.Remove(&queue_depth_);
  families_->credit_in_use.Remove(&credit_in_use_);
  families_->trainers.Remove(&trainers_);
  families_->rounds.Remove(&rounds_started_);
  families_->rounds.Remove(&rounds_joined_);
}

std::shared_ptr<const JobMetrics::Families> AgentMetrics::NewFamilies() {
  auto registry = std::make_shared<prometheus::Registry>();
  return std::make_shared<const JobMetrics::Families>(JobMetrics::Families{
      registry,
      prometheus::BuildHistogram()
          .Name("baton_tensor_latency_seconds")
          .Help("Enqueue-to-completion latency of the tensor's operations on "
                "this node: from the first local trainer's enqueue to the "
                "result being visible to every local trainer.")
          .Register(*registry),
      prometheus::BuildCounter()
          .Name("baton_data_bytes_total")
          .Help("Bytes of the tensors whose push-pull or broadcast completed "
                "on this node.")
          .Register(*registry),
      prometheus::BuildCounter()
          .Name("baton_data_skipped_bytes_total")
          .Help("Bytes this node's allreduces did not send because they were "
                "in blocks of zeros (--skip_zero_blocks), less the bitmaps "
                "that say so.")
          .Register(*registry),
      prometheus::BuildCounter()
          .Name("baton_operations_total")
          .Help("Operations of the job on this node by result: ok, failed "
                "(the trainers were told why), refused (an enqueue refused "
                "before it became an operation).")
          .Register(*registry),
      prometheus::BuildGauge()
          .Name("baton_queue_depth")
          .Help("Operations the job's data plane holds plus partitions "
                "waiting for credit (sampled every report interval).")
          .Register(*registry),
      prometheus::BuildGauge()
          .Name("baton_credit_in_use_bytes")
          .Help("Bytes of partitions in flight on the job's data plane, out "
                "of --credit_bytes (sampled every report interval).")
          .Register(*registry),
      prometheus::BuildGauge()
          .Name("baton_trainers_attached")
          .Help("Trainers of the job attached to this agent.")
          .Register(*registry),
      prometheus::BuildHistogram()
          .Name("baton_negotiation_round_seconds")
          .Help("The job's negotiation rounds across nodes, as long as this "
                "node's exchange took: started_by=\"this_node\" when this "
                "node had news of its own (the whole round, from its send to "
                "the result), \"peer\" when another node's round woke it "
                "(from its joining on).")
          .Register(*registry),
  });
}

AgentMetrics::AgentMetrics(absl::Duration retention)
    : retention_(retention), families_(NewFamilies()) {}

std::shared_ptr<prometheus::Registry> AgentMetrics::registry() const {
  return families_->registry;
}

AgentMetrics::~AgentMetrics() = default;

std::shared_ptr<JobMetrics> AgentMetrics::ForJob(const std::string& job) {
  absl::MutexLock lock(&mu_);
  Entry& entry = jobs_[job];
  if (entry.metrics == nullptr) {
    entry.metrics = std::shared_ptr<JobMetrics>(new JobMetrics(job, families_));
  }
  entry.idle_since = absl::InfiniteFuture();
  return entry.metrics;
}

void AgentMetrics::RemoveIdle(absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Entry& entry = it->second;
    if (entry.metrics.use_count() > 1) {
      entry.idle_since = absl::InfiniteFuture();
      ++it;
      continue;
    }
    if (entry.idle_since == absl::InfiniteFuture()) entry.idle_since = now;
    if (now - entry.idle_since < retention_) {
      ++it;
      continue;
    }
    entry.metrics->Remove();
    jobs_.erase(it++);
  }
}

}  // namespace baton::agent
