#include "agent/step_reporter.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace baton::agent {

StepReporter::StepReporter(std::string job, const JobEnvironment& env,
                           const JobTrainers* trainers,
                           const JobMembership* membership,
                           JobOperations* operations)
    : job_(std::move(job)),
      env_(env),
      clock_(*env.clock),
      trainers_(*trainers),
      membership_(*membership),
      operations_(*operations),
      reported_at_(clock_.Now()) {}

void StepReporter::Send() {
  if (!membership_.membership() ||
      membership_.state() != JobMembership::State::kRunning) {
    return;
  }
  const int32_t rank_offset = membership_.rank_offset();
  const auto& ops = operations_.ops();
  v1::AgentMessage message;
  v1::StepReport* report = message.mutable_step_report();
  report->set_job(job_);
  report->set_generation(membership_.generation());
  // Every local rank runs every step of a tensor, so a step pending here is
  // one no local rank has completed, whether or not it submitted it: the
  // rank that holds a step back must not look further along than the ranks
  // that wait for it.
  int64_t oldest_pending = std::numeric_limits<int64_t>::max();
  for (const auto& [id, pending] : ops) {
    oldest_pending = std::min(oldest_pending, pending.step);
  }
  for (int32_t r = 0; r < trainers_.size(); ++r) {
    int64_t completed = trainers_.trainer(r).completed_step;
    if (oldest_pending != std::numeric_limits<int64_t>::max()) {
      completed = std::min(completed, oldest_pending - 1);
    }
    int64_t submitted = -1;
    for (int32_t i = 0; i < trainers_.tensor_count(); ++i) {
      submitted = std::max(submitted, trainers_.tensor(i).last_step[r]);
    }
    v1::RankProgress* progress = report->add_ranks();
    progress->set_rank(rank_offset + r);
    progress->set_completed_step(completed);
    progress->set_submitted_step(submitted);
  }
  const absl::Time now = clock_.Now();
  for (const auto& [id, pending] : ops) {
    const LocalTensor& tensor = trainers_.tensor(pending.index);
    if (tensor.tensor_id < 0) continue;
    v1::PendingTensor* p = report->add_pending();
    p->set_tensor_id(static_cast<uint32_t>(tensor.tensor_id));
    p->set_step(pending.step);
    for (size_t r = 0; r < pending.ranks.size(); ++r) {
      if (pending.ranks[r].present) {
        p->add_submitted_ranks(rank_offset + static_cast<int32_t>(r));
      }
    }
    // Never below 0, even if the wall clock stepped back meanwhile.
    p->set_waiting_ms(absl::ToInt64Milliseconds(
        std::max(now - pending.first_enqueued, absl::ZeroDuration())));
  }
  v1::AgentStats* stats = report->mutable_stats();
  const SchedulingMode mode = trainers_.mode();
  stats->set_scheduling(SchedulingModeName(mode));
  stats->set_credit_bytes(env_.config->credit_bytes);
  if (const Scheduler* data_plane = membership_.data_plane()) {
    const Scheduler::Stats s = data_plane->stats();
    stats->set_queue_depth(s.queue_depth);
    stats->set_bytes_in_flight(s.bytes_in_flight);
    if (mode == SchedulingMode::kPriority) {
      stats->set_credit_bytes(s.credit_bytes);
      stats->set_partition_bytes(s.partition_bytes);
      stats->set_partition_tuned(s.partition_tuned);
      stats->set_credit_tuned(s.credit_tuned);
    }
    const double seconds = absl::ToDoubleSeconds(now - reported_at_);
    const double interval = absl::ToDoubleSeconds(
        absl::FromChrono(env_.coordinator->report_interval()));
    // A report soon after the previous one (the last one before leaving)
    // covers too short a moment to measure: it repeats the last rate.
    if (seconds >= interval / 2 && s.bytes_done >= reported_bytes_done_) {
      throughput_ =
          static_cast<double>(s.bytes_done - reported_bytes_done_) / seconds;
    }
    reported_bytes_done_ = s.bytes_done;
  }
  // Without a data plane (stopped, between generations) the last rate
  // stands, rather than a 0 that says nothing.
  stats->set_throughput_bytes_per_second(throughput_);
  absl::flat_hash_map<uint32_t, JobOperations::Latency> latencies =
      operations_.TakeLatencies();
  std::vector<uint32_t> ids;
  for (const auto& [id, latency] : latencies) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    const JobOperations::Latency& l = latencies[id];
    v1::TensorLatency* out = stats->add_tensor_latencies();
    out->set_tensor_id(id);
    out->set_count(l.count);
    out->set_mean_us(l.total_us / l.count);
    out->set_max_us(l.max_us);
    out->set_last_step(l.last_step);
  }
  reported_at_ = now;
  env_.coordinator->Send(std::move(message));
}

}  // namespace baton::agent
