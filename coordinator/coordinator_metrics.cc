#include "coordinator/coordinator_metrics.h"

#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "common/metrics.h"
#include "glog/logging.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace baton::coordinator {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily NewFamily(const char* name, const char* help, MetricType type) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

void AddSample(MetricFamily& family, std::vector<ClientMetric::Label> labels,
               double value) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (family.type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

template <class Histogram>
void AddHistogram(MetricFamily& family, std::vector<ClientMetric::Label> labels,
                  const Histogram& histogram) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.histogram.sample_count = histogram.count;
  metric.histogram.sample_sum = histogram.sum_seconds;
  for (size_t i = 0; i < Histogram::kBounds.size(); ++i) {
    metric.histogram.bucket.push_back(
        {histogram.cumulative[i], Histogram::kBounds[i]});
  }
  metric.histogram.bucket.push_back(
      {histogram.count, std::numeric_limits<double>::infinity()});
  family.metric.push_back(std::move(metric));
}

// JOB_STATE_REFORMING -> "reforming".
std::string StateLabel(v1::JobState state) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(ControlLoop* loop,
                                       const Coordinator* coordinator,
                                       absl::Duration timeout)
    : loop_(loop), coordinator_(coordinator), timeout_(timeout) {}

CoordinatorMetrics::Snapshot CoordinatorMetrics::Take(
    const Coordinator& coordinator) {
  Snapshot snapshot;
  snapshot.connected_agents = coordinator.ConnectedAgents();
  snapshot.message_seconds = coordinator.MessageSeconds();
  // On the control loop: nothing here may build the members, which at
  // 10,000 nodes would hold up every agent's message for tens of ms.
  snapshot.jobs = coordinator.JobSummaries();
  for (const v1::JobStatus& job : snapshot.jobs.jobs()) {
    snapshot.reform_seconds[job.job()] = coordinator.ReformSeconds(job.job());
    if (job.state() == v1::JOB_STATE_RUNNING) {
      snapshot.rank_lags[job.job()] = coordinator.RankLags(job.job());
    }
  }
  return snapshot;
}

std::vector<MetricFamily> CoordinatorMetrics::Collect() const {
  // Shared with the task: it may run after this scrape gave up on it.
  struct Pending {
    absl::Notification done;
    Snapshot snapshot;
  };
  auto pending = std::make_shared<Pending>();
  loop_->Post([pending, coordinator = coordinator_] {
    pending->snapshot = Take(*coordinator);
    pending->done.Notify();
  });
  if (!pending->done.WaitForNotificationWithTimeout(timeout_)) {
    LOG(WARNING) << "metrics scrape: the control loop did not answer within "
                 << timeout_ << "; this scrape has no metrics";
    return {};
  }
  return Families(pending->snapshot);
}

std::vector<MetricFamily> CoordinatorMetrics::Families(
    const Snapshot& snapshot) {
  MetricFamily agents = NewFamily(
      "baton_connected_agents",
      "Agents with an open session to the coordinator.", MetricType::Gauge);
  AddSample(agents, {}, snapshot.connected_agents);

  MetricFamily message_seconds = NewFamily(
      "baton_agent_message_seconds",
      "How long the agents' messages took from being read off their streams "
      "until the control loop had handled them, waiting for the loop "
      "included.",
      MetricType::Histogram);
  AddHistogram(message_seconds, {}, snapshot.message_seconds);

  MetricFamily jobs =
      NewFamily("baton_jobs",
                "Jobs the coordinator knows, by state (ended jobs stay for "
                "--job_retention_ms).",
                MetricType::Gauge);
  for (int state = v1::JobState_MIN; state <= v1::JobState_MAX; ++state) {
    if (!v1::JobState_IsValid(state) || state == v1::JOB_STATE_UNSPECIFIED) {
      continue;
    }
    int count = 0;
    for (const v1::JobStatus& job : snapshot.jobs.jobs()) {
      if (job.state() == state) ++count;
    }
    AddSample(jobs, {{"state", StateLabel(static_cast<v1::JobState>(state))}},
              count);
  }

  MetricFamily generation = NewFamily(
      "baton_job_generation",
      "The job's generation: the sealed one while running, else the one the "
      "next seal will have.",
      MetricType::Gauge);
  MetricFamily world_size = NewFamily(
      "baton_job_world_size",
      "Trainer ranks in the job's last sealed generation.", MetricType::Gauge);
  MetricFamily nodes = NewFamily(
      "baton_job_nodes", "Member nodes the job has now.", MetricType::Gauge);
  MetricFamily global_step = NewFamily(
      "baton_job_global_step",
      "Last step completed by every rank of the job; -1 before the first.",
      MetricType::Gauge);
  MetricFamily stalled = NewFamily(
      "baton_job_stalled_tensors",
      "Tensors some ranks submitted and others have not, for longer than "
      "--stall_threshold_ms.",
      MetricType::Gauge);
  MetricFamily lost = NewFamily(
      "baton_members_lost_total",
      "Member nodes the job lost (session ended or silent, left unfinished) "
      "since it was created.",
      MetricType::Counter);
  MetricFamily joined = NewFamily(
      "baton_members_joined_total",
      "Nodes that joined the job after its first seal (into a running or "
      "re-forming job).",
      MetricType::Counter);
  MetricFamily reform_seconds = NewFamily(
      "baton_reform_seconds",
      "How long the job's re-forms took, from the abort of the running "
      "generation until the next seal (re-forms that ended the job are not "
      "observed).",
      MetricType::Histogram);
  MetricFamily lag =
      NewFamily("baton_rank_lag_steps",
                "Steps the rank is behind the fastest rank of its job.",
                MetricType::Gauge);
  for (const v1::JobStatus& job : snapshot.jobs.jobs()) {
    const std::vector<ClientMetric::Label> labels = {{kJobLabel, job.job()}};
    AddSample(generation, labels, job.generation());
    AddSample(world_size, labels, job.world_size());
    AddSample(nodes, labels, job.total_members());
    AddSample(global_step, labels, job.global_step());
    AddSample(stalled, labels, job.stalls_size());
    AddSample(lost, labels, job.members_lost());
    AddSample(joined, labels, job.members_joined());
    auto it = snapshot.reform_seconds.find(job.job());
    AddHistogram(
        reform_seconds, labels,
        it == snapshot.reform_seconds.end() ? ReformHistogram() : it->second);
    if (auto lags = snapshot.rank_lags.find(job.job());
        lags != snapshot.rank_lags.end()) {
      for (size_t rank = 0; rank < lags->second.size(); ++rank) {
        AddSample(lag, {{kJobLabel, job.job()}, {"rank", absl::StrCat(rank)}},
                  lags->second[rank]);
      }
    }
  }

  std::vector<MetricFamily> families;
  for (MetricFamily* family :
       {&agents, &message_seconds, &jobs, &generation, &world_size, &nodes,
        &global_step, &stalled, &lost, &joined, &reform_seconds, &lag}) {
    // A family without samples (no jobs yet) is left out rather than
    // announced empty.
    if (!family->metric.empty()) families.push_back(std::move(*family));
  }
  return families;
}

}  // namespace baton::coordinator
