#include "agent/job_data_plane.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log_context.h"
#include "glog/logging.h"

namespace baton::agent {

JobDataPlane::JobDataPlane(std::string job, const JobEnvironment& env,
                           JobTrainers* trainers, Callbacks callbacks)
    : job_(std::move(job)),
      env_(env),
      config_(*env.config),
      clock_(*env.clock),
      trainers_(*trainers),
      callbacks_(std::move(callbacks)) {
  if (!config_.launch_trace_dir.empty()) {
    const std::string path = absl::StrCat(config_.launch_trace_dir, "/", job_,
                                          ".", config_.node_name, ".launches");
    launch_trace_ = std::fopen(path.c_str(), "a");
    if (launch_trace_ == nullptr) {
      LOG(ERROR) << LogPrefix() << "cannot open launch trace " << path;
    }
  }
}

JobDataPlane::~JobDataPlane() {
  Stop();
  if (launch_trace_ != nullptr) std::fclose(launch_trace_);
}

void JobDataPlane::Stop() {
  for (std::thread& t : connectors_) t.join();
  connectors_.clear();
  data_plane_.reset();
  retired_.clear();
}

void JobDataPlane::SetPlan(const v1::TensorPlan& plan) {
  partition_bytes_ = plan.partition_bytes();
  known_tensors_ = plan.tensors_size();
  has_cuda_ = false;
  for (const v1::TensorPlanEntry& entry : plan.tensors()) {
    has_cuda_ = has_cuda_ || entry.spec().memory() == v1::MEMORY_KIND_CUDA;
  }
  // Ids are dense from 0; the data plane negotiates over the ids every
  // node knows.
  if (data_plane_) data_plane_->SetKnownTensors(known_tensors_);
  MaybeConnectDevices();
}

std::string JobDataPlane::LinkKey(const std::string& purpose) const {
  return absl::StrCat(job_, "/", purpose);
}

std::string JobDataPlane::LogPrefix() const {
  return baton::LogPrefix(
      {job_, membership_ ? membership_->generation() : 0, config_.node_name});
}

void JobDataPlane::Connect(const v1::Membership& m) {
  membership_ = m;
  stopped_.reset();
  ConnectRequest request;
  request.node_rank = m.self().node_rank();
  request.num_nodes = m.num_nodes();
  request.prefix = m.store_prefix() +
                   (absl::EndsWith(m.store_prefix(), "/") ? "" : "/") + "data";
  request.store = env_.store_factory(job_, m.generation());
  request.count = config_.data_channels;
  request.timeout = config_.op_timeout;
  request.reuse_key = LinkKey("data");
  request.secret = m.data_plane_secret();
  request.negotiation = config_.negotiation;
  const int64_t generation = m.generation();
  connectors_.emplace_back([this, request, generation]() mutable {
    // std::function needs a copyable task: share the move-only result.
    auto comms = std::make_shared<absl::StatusOr<DataConnections>>(
        absl::UnavailableError("not connected"));
    // Node rank 0's --data_channels holds for everyone, so agents started
    // with different values still build the same communicators.
    const LinkCounts before = env_.transport->link_counts();
    absl::StatusOr<int> channels = AgreeOnChannels(request);
    // And its negotiation wire (--negotiation).
    absl::StatusOr<NegotiationChoice> wire =
        channels.ok() ? AgreeOnNegotiation(request) : channels.status();
    if (wire.ok()) request.negotiation = *wire;
    absl::StatusOr<std::unique_ptr<NegotiationWire>> negotiation =
        wire.ok() ? env_.transport->ConnectNegotiation(request) : wire.status();
    if (negotiation.ok()) {
      request.count = *channels;
      absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> data =
          env_.transport->Connect(request);
      if (data.ok()) {
        const LinkCounts after = env_.transport->link_counts();
        *comms = DataConnections{
            std::move(negotiation).value(),
            std::move(data).value(),
            {after.kept - before.kept, after.made - before.made}};
      } else {
        *comms = data.status();
      }
    } else {
      *comms = negotiation.status();
    }
    callbacks_.post([this, generation, comms] {
      OnConnected(generation, std::move(*comms));
    });
  });
}

absl::StatusOr<int> JobDataPlane::AgreeOnChannels(
    const ConnectRequest& request) const {
  absl::StatusOr<std::string> published = NodeRankZeroValue(
      request, "channels", std::to_string(config_.data_channels));
  if (!published.ok()) return published.status();
  int channels = 0;
  if (!absl::SimpleAtoi(*published, &channels) || channels < 1 ||
      channels > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("node rank 0 published \"", *published,
                     "\" as its data channel count; expected 1..16"));
  }
  if (channels != config_.data_channels) {
    // On a connector thread: membership_ (the generation) is not ours to
    // read here.
    LOG(WARNING) << baton::LogPrefix({job_, 0, config_.node_name})
                 << "using node rank 0's " << channels
                 << " data channels instead of --data_channels="
                 << config_.data_channels;
  }
  return channels;
}

void JobDataPlane::OnConnected(int64_t generation,
                               absl::StatusOr<DataConnections> comms) {
  if (!membership_ || membership_->generation() != generation) {
    return;  // retired, or a newer generation replaced it; the comms close
  }
  if (!comms.ok()) {
    if (comms.status().code() == absl::StatusCode::kAborted) return;
    // Whatever went wrong (peers missing, the store unreachable after a
    // coordinator restart), a new generation is the way out: treat it like a
    // transport failure.
    OnStopped(
        nullptr, generation,
        absl::Status(absl::StatusCode::kUnavailable,
                     absl::StrCat("connecting the data plane "
                                  "of generation ",
                                  generation, ": ", comms.status().message())));
    return;
  }
  SchedulerOptions options;
  options.job = job_;
  options.generation = generation;
  options.node_rank = membership_->self().node_rank();
  options.num_nodes = membership_->num_nodes();
  options.world_size = membership_->world_size();
  for (const v1::LocalSizeRun& run : membership_->local_sizes()) {
    options.local_sizes.insert(options.local_sizes.end(), run.nodes(),
                               run.local_size());
  }
  options.mode = trainers_.mode();
  options.credit_bytes = config_.credit_bytes;
  // Where tuning starts: the plan's size (the coordinator's
  // --partition_bytes), or its default before the plan arrived.
  options.partition_bytes =
      partition_bytes_ > 0 ? partition_bytes_ : int64_t{4} << 20;
  options.tune_partition_bytes = trainers_.TunesPartitions();
  options.tune_credit_bytes = config_.tune_credit_bytes;
  options.op_timeout = config_.op_timeout;
  options.launch_trace = launch_trace_;
  // --timeline_records=0: nothing is recorded, not even built.
  options.timeline = config_.timeline_records > 0 ? &timeline_ : nullptr;
  // Only node ranks 0 and 1 know every name: elsewhere errors name ranks.
  for (const v1::NodeInfo& node : membership_->nodes()) {
    options.node_names.push_back(node.node_name());
  }
  Scheduler::Callbacks callbacks;
  callbacks.op_done = callbacks_.op_done;
  callbacks.bytes_skipped = [metrics = env_.metrics](int64_t bytes) {
    metrics->BytesSkipped(bytes);
  };
  callbacks.round_exchanged = [metrics = env_.metrics](absl::Duration exchange,
                                                       bool started) {
    metrics->NegotiationRound(absl::ToChronoNanoseconds(exchange), started);
  };
  auto plane_ptr = std::make_shared<Scheduler*>(nullptr);
  callbacks.stopped = [this, plane_ptr, generation](absl::Status status) {
    callbacks_.post([this, plane_ptr, generation, status = std::move(status)] {
      OnStopped(*plane_ptr, generation, status);
    });
  };
  data_plane_ = std::make_unique<Scheduler>(
      std::move(options), std::move(comms->negotiation), std::move(comms->data),
      std::move(callbacks));
  *plane_ptr = data_plane_.get();
  if (known_tensors_ > 0) data_plane_->SetKnownTensors(known_tensors_);
  LOG(INFO) << LogPrefix() << "data plane of generation " << generation
            << " connected (" << comms->links.kept << " connections kept, "
            << comms->links.made << " made)";
  MaybeConnectDevices();
  callbacks_.submit_waiting();
}

void JobDataPlane::MaybeConnectDevices() {
  if (!data_plane_ || !has_cuda_ || !membership_ ||
      devices_generation_ == membership_->generation()) {
    return;
  }
  const int64_t generation = membership_->generation();
  devices_generation_ = generation;
  devices_failed_.reset();
  // The plan lists only tensors every local trainer declared, so every
  // trainer has its GPU by now.
  const std::vector<int> devices = trainers_.CudaDevices();
  if (env_.gpus->memory == nullptr ||
      std::find(devices.begin(), devices.end(), -1) != devices.end()) {
    OnDevicesConnected(generation,
                       absl::FailedPreconditionError(absl::StrCat(
                           "job \"", job_, "\" has CUDA tensors, but ",
                           env_.gpus->memory == nullptr
                               ? absl::StrCat("agent ", config_.node_name,
                                              " has no GPU transport: ",
                                              env_.gpus->unavailable)
                               : "not every local trainer declared one")));
    return;
  }
  const v1::Membership& m = *membership_;
  ConnectRequest request;
  request.node_rank = m.self().node_rank();
  request.num_nodes = m.num_nodes();
  request.prefix = m.store_prefix() +
                   (absl::EndsWith(m.store_prefix(), "/") ? "" : "/") + "gpu";
  request.store = env_.store_factory(job_, generation);
  request.count = 1;
  request.timeout = config_.op_timeout;
  request.secret = m.data_plane_secret();
  const GpuCrossNode cross_node = config_.gpu_cross_node;
  LOG(INFO) << LogPrefix() << "connecting the GPU communicators of "
            << devices.size()
            << " local GPUs (--gpu_cross_node=" << GpuCrossNodeName(cross_node)
            << ")";
  connectors_.emplace_back([this, request, generation, devices, cross_node] {
    auto group = std::make_shared<absl::StatusOr<DeviceGroup>>(
        absl::UnavailableError("not connected"));
    *group = [&]() -> absl::StatusOr<DeviceGroup> {
      auto transport = env_.gpus->transport(devices);
      if (!transport.ok()) return transport.status();
      DeviceGroup connected;
      connected.cross_node = cross_node;
      connected.memory = env_.gpus->memory.get();
      if (cross_node == GpuCrossNode::kNccl) {
        auto comms = (*transport)->ConnectDevices(request);
        if (!comms.ok()) return comms.status();
        connected.comm = std::move(comms->front());
        return connected;
      }
      auto local = (*transport)->ConnectLocal(request.timeout);
      if (!local.ok()) return local.status();
      connected.comm = std::move(*local);
      if (request.num_nodes > 1) {
        ConnectRequest host = request;
        host.prefix += "-host";
        host.reuse_key = LinkKey("gpu-host");
        auto comms = env_.transport->Connect(host);
        if (!comms.ok()) return comms.status();
        connected.host = std::move(comms->front());
      }
      return connected;
    }();
    callbacks_.post([this, generation, group] {
      OnDevicesConnected(generation, std::move(*group));
    });
  });
}

void JobDataPlane::OnDevicesConnected(int64_t generation,
                                      absl::StatusOr<DeviceGroup> group) {
  if (!membership_ || membership_->generation() != generation || !data_plane_) {
    return;  // a newer generation replaced it; the group closes here
  }
  if (!group.ok()) {
    if (group.status().code() == absl::StatusCode::kAborted) return;
    const absl::Status status(
        group.status().code(),
        absl::StrCat("connecting the GPU communicators of job \"", job_,
                     "\" generation ", generation, ": ",
                     group.status().message()));
    LOG(WARNING) << LogPrefix() << status.message();
    devices_failed_ = status;
    callbacks_.submit_waiting();  // its CUDA operations fail now
    return;
  }
  data_plane_->AttachDevices(std::move(*group));
  LOG(INFO) << LogPrefix() << "GPU communicators of generation " << generation
            << " connected";
  callbacks_.submit_waiting();
}

void JobDataPlane::OnStopped(Scheduler* plane, int64_t generation,
                             absl::Status status) {
  if (plane != nullptr && plane != data_plane_.get()) return;  // retired
  if (!membership_ || membership_->generation() != generation) return;
  LOG(WARNING) << LogPrefix() << "data plane stopped: " << status.message();
  if (data_plane_) {
    data_plane_->Abort(status);
    retired_.push_back(std::move(data_plane_));
  }
  const bool transport = status.code() == absl::StatusCode::kUnavailable ||
                         status.code() == absl::StatusCode::kDeadlineExceeded;
  if (!transport) {
    // A node left or the nodes disagree: nothing to wait for, and nothing
    // more can run in this generation.
    // What the data plane holds it finishes itself (launched partitions
    // still complete); what never reached it fails here.
    stopped_ = status;
    callbacks_.fail_waiting(generation, status);
    return;
  }
  // A lost node usually explains this within the liveness bound; until then
  // failures are held so that they can name it.
  failure_ = status;
  failure_deadline_ =
      clock_.Now() + absl::FromChrono(env_.coordinator->liveness_timeout());
}

void JobDataPlane::Retire(const absl::Status& status) {
  if (data_plane_) {
    data_plane_->Abort(status);
    retired_.push_back(std::move(data_plane_));
  }
  membership_.reset();
  stopped_.reset();
  failure_.reset();
  callbacks_.release_held();
}

void JobDataPlane::Leave() {
  if (!data_plane_) return;
  // Every node stops after the round that carries this; the data plane
  // finishes on its own, without an abort.
  data_plane_->Leave();
  retired_.push_back(std::move(data_plane_));
}

void JobDataPlane::OnTimer(absl::Time now) {
  if (failure_ && now >= failure_deadline_) {
    // No lost node was announced: the failure is the data plane's own.
    // Report it to the trainers; the owner forces a new generation (the
    // communicators are rebuilt there).
    const absl::Status status = *std::exchange(failure_, std::nullopt);
    callbacks_.release_held();
    callbacks_.grace_ended(status);
  }
  // Retired data planes whose threads exited can go.
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [](const std::unique_ptr<Scheduler>& p) {
                                  return p->finished();
                                }),
                 retired_.end());
}

std::optional<absl::Time> JobDataPlane::failure_deadline() const {
  if (!failure_) return std::nullopt;
  return failure_deadline_;
}

const absl::Status* JobDataPlane::devices_failed() const {
  if (!devices_failed_ || !membership_ ||
      devices_generation_ != membership_->generation()) {
    return nullptr;
  }
  return &*devices_failed_;
}

}  // namespace baton::agent
