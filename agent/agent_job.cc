#include "agent/agent_job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/scheduler/negotiation.h"
#include "common/grpc_util.h"
#include "common/log_context.h"
#include "common/thread_name.h"
#include "common/validation.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

v1::TrainerEvent ErrorEvent(uint64_t seq, const absl::Status& status) {
  v1::TrainerEvent event;
  event.set_reply_to(seq);
  event.mutable_error()->set_code(static_cast<int32_t>(status.code()));
  event.mutable_error()->set_message(std::string(status.message()));
  return event;
}

}  // namespace

AgentJob::AgentJob(std::string name, Environment env)
    : name_(std::move(name)), env_(std::move(env)), config_(*env_.config) {
  if (!config_.launch_trace_dir.empty()) {
    const std::string path = absl::StrCat(config_.launch_trace_dir, "/", name_,
                                          ".", config_.node_name, ".launches");
    launch_trace_ = std::fopen(path.c_str(), "a");
    if (launch_trace_ == nullptr) {
      LOG(ERROR) << JobLogPrefix() << "cannot open launch trace " << path;
    }
  }
  next_report_ = Clock::now();
  reported_at_ = Clock::now();
  // A new instance number per AgentJob: a job that ends and is attached
  // again under the same name never collides with the old one's names.
  static std::atomic<uint64_t> instances{0};
  shm_prefix_ =
      absl::StrCat("/baton.", config_.pid, ".", instances++, ".", name_, ".");
  auto doorbell = SharedMemory::Create(shm_prefix_ + "bell", 4096);
  if (doorbell.ok()) {
    doorbell_memory_ = std::move(*doorbell);
    doorbell_ = new (doorbell_memory_.data()) Doorbell();
  } else {
    LOG(WARNING) << JobLogPrefix() << "no shared-memory fast path ("
                 << doorbell.status().message()
                 << "); trainers enqueue over gRPC";
    doorbell_ = &local_doorbell_;
  }
  thread_ = std::thread([this] {
    SetThreadName("baton-job");
    Loop();
  });
}

AgentJob::~AgentJob() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  doorbell_->Ring();
  thread_.join();
  for (std::thread& t : connectors_) t.join();
  // Data planes report into ops_ through Post, which is closed now.
  data_plane_.reset();
  retired_.clear();
  for (auto& tensor : tensors_) {
    if (tensor && !tensor->unlinked) {
      SharedMemory::Unlink(tensor->memory.name()).IgnoreError();
    }
  }
  for (Trainer& trainer : trainers_) {
    if (trainer.mapping != nullptr) {
      SharedMemory::Unlink(trainer.mapping->memory.name()).IgnoreError();
    }
  }
  if (doorbell_ != &local_doorbell_) {
    SharedMemory::Unlink(doorbell_memory_.name()).IgnoreError();
  }
  if (launch_trace_ != nullptr) std::fclose(launch_trace_);
}

void AgentJob::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    tasks_.push_back(std::move(task));
  }
  doorbell_->Ring();
}

void AgentJob::Loop() {
  while (true) {
    // Taken before looking for work: a producer that publishes after the
    // look rings the bell, and the wait below returns at once.
    const uint32_t seen = doorbell_->Snapshot();
    std::deque<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    const bool drained = DrainChannels();
    const Clock::time_point now = Clock::now();
    OnTimer(now);
    if (!tasks.empty() || drained) continue;
    const Clock::time_point deadline =
        std::min(next_report_, data_plane_failure_ ? failure_deadline_
                                                   : Clock::time_point::max());
    doorbell_->Wait(seen, std::chrono::duration_cast<std::chrono::microseconds>(
                              deadline - now) +
                              std::chrono::microseconds(1));
  }
  // Fail what is left while the streams can still carry it.
  if (state_ != State::kDone) {
    End(absl::CancelledError(absl::StrCat("the agent is shutting down; job \"",
                                          name_, "\" stopped on node ",
                                          config_.node_name)));
  }
}

bool AgentJob::DrainChannels() {
  bool any = false;
  for (size_t r = 0; r < trainers_.size(); ++r) {
    Trainer& trainer = trainers_[r];
    if (trainer.mapping == nullptr || trainer.detached) continue;
    ChannelEntry entry;
    // Bounded: a trainer that keeps pushing cannot starve the others.
    for (uint64_t n = 0; n < ChannelRing::kCapacity &&
                         trainer.mapping->channel->requests.Pop(&entry);
         ++n) {
      any = true;
      v1::EnqueueRequest request;
      request.set_index(entry.index);
      request.set_step(entry.step);
      request.set_average((entry.flags & kChannelAverage) != 0);
      request.set_root_rank(static_cast<int32_t>(entry.value));
      HandleEnqueue(trainer.sink.get(), request, /*via_channel=*/true);
    }
  }
  return any;
}

void AgentJob::Attach(std::shared_ptr<TrainerSink> sink, uint64_t seq,
                      v1::AttachRequest request) {
  Post([this, sink = std::move(sink), seq, request = std::move(request)] {
    HandleAttach(sink, seq, request);
  });
}
void AgentJob::Declare(TrainerSink* sink, uint64_t seq,
                       v1::DeclareRequest request) {
  Post([this, sink, seq, request = std::move(request)] {
    HandleDeclare(sink, seq, request);
  });
}
void AgentJob::Enqueue(TrainerSink* sink, uint64_t seq,
                       v1::EnqueueRequest request) {
  (void)seq;
  Post([this, sink, request = std::move(request)] {
    HandleEnqueue(sink, request);
  });
}
void AgentJob::Detach(TrainerSink* sink, uint64_t seq,
                      v1::DetachRequest request) {
  (void)seq;
  Post([this, sink, request = std::move(request)] {
    HandleDetach(sink, request);
  });
}
void AgentJob::TrainerGone(TrainerSink* sink) {
  Post([this, sink] { HandleTrainerGone(sink); });
}
void AgentJob::OnCoordinatorMessage(v1::CoordinatorMessage message) {
  Post([this, message = std::move(message)] {
    HandleCoordinatorMessage(message);
  });
}
void AgentJob::OnCoordinatorSession(bool restarted) {
  Post([this, restarted] { HandleSession(restarted); });
}

int32_t AgentJob::RankOf(const TrainerSink* sink) const {
  for (size_t r = 0; r < trainers_.size(); ++r) {
    if (trainers_[r].sink.get() == sink && !trainers_[r].detached) {
      return static_cast<int32_t>(r);
    }
  }
  return -1;
}

void AgentJob::SendToAll(const v1::TrainerEvent& event) {
  for (Trainer& t : trainers_) {
    if (t.sink && !t.detached) t.sink->Send(event);
  }
}

void AgentJob::HandleAttach(std::shared_ptr<TrainerSink> sink, uint64_t seq,
                            const v1::AttachRequest& r) {
  (void)seq;
  const auto reject = [&](absl::Status status) { sink->Close(status); };
  if (r.local_size() < 1 || r.local_size() > 1024) {
    return reject(absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.local_size is ", r.local_size(),
        "; give the number of trainers of the job on this node, 1..1024")));
  }
  if (r.local_rank() < 0 || r.local_rank() >= r.local_size()) {
    return reject(absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.local_rank is ", r.local_rank(),
        "; it must be in 0..local_size-1 (local_size ", r.local_size(), ")")));
  }
  if (r.expected_nodes() < 1 || r.expected_nodes() > 100000) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("AttachRequest.expected_nodes is ", r.expected_nodes(),
                     "; give the job's node count, 1..100000")));
  }
  if (r.min_nodes() < 0 || r.min_nodes() > r.expected_nodes()) {
    return reject(absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.min_nodes is ", r.min_nodes(),
        "; it must be in 0..expected_nodes (", r.expected_nodes(), ")")));
  }
  if (r.partition_bytes() < 0 || r.partition_bytes() % 8 != 0) {
    return reject(absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.partition_bytes is ", r.partition_bytes(),
        "; give 0 (the coordinator's default) or a positive multiple of 8")));
  }
  if (!r.scheduling().empty() && r.scheduling() != "priority" &&
      r.scheduling() != "fifo") {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("AttachRequest.scheduling is \"", r.scheduling(),
                     "\"; give \"priority\", \"fifo\" or \"\" (the agent's "
                     "--scheduling)")));
  }
  if (state_ != State::kAttaching) {
    return reject(absl::FailedPreconditionError(absl::StrCat(
        "job \"", name_, "\" is already running on node ", config_.node_name,
        " with all its ", trainers_.size(),
        " local trainers; a trainer cannot attach to it again: restart the "
        "job's trainers on this node (or use another job name)")));
  }
  if (attached_ == 0) {
    params_ = r;
    trainers_.clear();
    trainers_.resize(r.local_size());
    mode_ = r.scheduling() == "fifo"       ? SchedulingMode::kFifo
            : r.scheduling() == "priority" ? SchedulingMode::kPriority
                                           : config_.scheduling;
  } else {
    const auto differs = [&](const char* field, auto mine, auto theirs) {
      return absl::InvalidArgumentError(
          absl::StrCat("AttachRequest.", field, " is ", mine,
                       " but the trainers already "
                       "attached to job \"",
                       name_, "\" on this node gave ", theirs,
                       ": every trainer of a job on one node must agree"));
    };
    if (r.local_size() != params_.local_size()) {
      return reject(
          differs("local_size", r.local_size(), params_.local_size()));
    }
    if (r.expected_nodes() != params_.expected_nodes()) {
      return reject(differs("expected_nodes", r.expected_nodes(),
                            params_.expected_nodes()));
    }
    if (r.min_nodes() != params_.min_nodes()) {
      return reject(differs("min_nodes", r.min_nodes(), params_.min_nodes()));
    }
    if (r.partition_bytes() != params_.partition_bytes()) {
      return reject(differs("partition_bytes", r.partition_bytes(),
                            params_.partition_bytes()));
    }
    if (r.scheduling() != params_.scheduling()) {
      return reject(differs("scheduling", "\"" + r.scheduling() + "\"",
                            "\"" + params_.scheduling() + "\""));
    }
  }
  Trainer& trainer = trainers_[r.local_rank()];
  if (trainer.sink) {
    return reject(absl::AlreadyExistsError(
        absl::StrCat("local rank ", r.local_rank(), " of job \"", name_,
                     "\" is already attached by process ", trainer.pid,
                     "; give every trainer on this node its own LOCAL_RANK")));
  }
  trainer.sink = std::move(sink);
  trainer.pid = r.pid();
  if (doorbell_ != &local_doorbell_) {
    auto channel =
        SharedMemory::Create(absl::StrCat(shm_prefix_, "ch", r.local_rank()),
                             sizeof(TrainerChannel));
    if (channel.ok()) {
      trainer.mapping = std::make_shared<ChannelMapping>();
      trainer.mapping->memory = std::move(*channel);
      trainer.mapping->channel =
          new (trainer.mapping->memory.data()) TrainerChannel();
    } else {
      LOG(WARNING) << JobLogPrefix() << "local rank " << r.local_rank()
                   << " enqueues over gRPC: " << channel.status().message();
    }
  }
  ++attached_;
  SampleMetrics();
  if (attached_ == params_.local_size()) {
    state_ = State::kJoining;
    SendJoin();
  }
}

void AgentJob::HandleDeclare(TrainerSink* sink, uint64_t seq,
                             const v1::DeclareRequest& request) {
  const int32_t rank = RankOf(sink);
  if (rank < 0) return;
  Trainer& trainer = trainers_[rank];
  // All or nothing: every declaration is checked, and every new tensor's
  // shared memory created (every CUDA buffer opened), before any is
  // recorded.
  const int32_t first = trainer.declared;
  std::vector<std::unique_ptr<LocalTensor>> created;
  std::vector<const v1::CudaBuffer*> cuda;
  const absl::Status matched = MatchCudaBuffers(request, &cuda);
  std::vector<std::shared_ptr<DeviceBuffer>> buffers(request.tensors_size());
  std::vector<std::unique_ptr<DeviceEvent>> events(request.tensors_size());
  int cuda_device = trainer.cuda_device;
  for (int i = 0; i < request.tensors_size(); ++i) {
    const v1::TensorSpec& spec = request.tensors(i);
    const int32_t index = first + i;
    const std::string what = absl::StrCat("DeclareRequest.tensors[", i, "]");
    absl::Status status = matched;
    // The coordinator's rules, so a bad declaration fails at the trainer's
    // declare call.
    if (status.ok()) status = ValidateTensorSpec(what, spec);
    if (status.ok() && cuda[i] != nullptr) {
      status = OpenCudaBuffer(rank, what, *cuda[i], TensorSizeBytes(spec),
                              &buffers[i], &events[i]);
      if (status.ok() && cuda_device >= 0 &&
          buffers[i]->local_device() != cuda_device) {
        status = absl::InvalidArgumentError(absl::StrCat(
            what, " (\"", spec.name(), "\") is on GPU ",
            env_.gpus->memory->devices()[buffers[i]->local_device()],
            " but local rank ", rank, "'s other CUDA tensors are on ",
            env_.gpus->memory->devices()[cuda_device],
            "; a trainer keeps all its CUDA tensors on one GPU"));
      }
      if (status.ok()) cuda_device = buffers[i]->local_device();
    }
    if (status.ok() && index < static_cast<int32_t>(tensors_.size())) {
      const std::string diff = DescribeDifference(spec, tensors_[index]->spec);
      if (!diff.empty()) {
        status = absl::InvalidArgumentError(absl::StrCat(
            what, " is declaration #", index, " of local rank ", rank,
            ", but another local rank declared #", index,
            " differently: ", diff,
            ". Every trainer must declare the same tensors in the same "
            "order"));
      }
    } else if (status.ok()) {
      for (int32_t j = 0; j < index && status.ok(); ++j) {
        const std::string& other = j < static_cast<int32_t>(tensors_.size())
                                       ? tensors_[j]->spec.name()
                                       : request.tensors(j - first).name();
        if (other == spec.name()) {
          status = absl::InvalidArgumentError(absl::StrCat(
              what, " declares \"", spec.name(),
              "\" a second time; tensor names are unique within a job"));
        }
      }
      if (status.ok()) {
        auto tensor = LocalTensor::Create(absl::StrCat(shm_prefix_, index),
                                          spec, params_.local_size());
        if (tensor.ok()) {
          created.push_back(std::move(*tensor));
        } else {
          status = tensor.status();
        }
      }
    }
    if (!status.ok()) {
      for (const auto& t : created) {
        if (!t->on_device()) {
          SharedMemory::Unlink(t->memory.name()).IgnoreError();
        }
      }
      trainer.sink->Send(ErrorEvent(
          seq, absl::Status(status.code(),
                            absl::StrCat(status.message(),
                                         " (nothing of this request was "
                                         "declared)"))));
      return;
    }
  }
  for (auto& tensor : created) {
    tensors_.push_back(std::move(tensor));
    op_of_tensor_.push_back(0);
    lease_of_tensor_.push_back(0);
  }
  trainer.cuda_device = cuda_device;
  v1::TrainerEvent reply;
  reply.set_reply_to(seq);
  v1::Declared* declared = reply.mutable_declared();
  for (int i = 0; i < request.tensors_size(); ++i) {
    const int32_t index = first + i;
    LocalTensor& tensor = *tensors_[index];
    ++tensor.declared_by;
    ++trainer.declared;
    v1::DeclaredTensor* out = declared->add_tensors();
    out->set_index(index);
    out->set_name(tensor.spec.name());
    out->set_size_bytes(tensor.size_bytes);
    if (tensor.on_device()) {
      tensor.device_buffers[rank] = std::move(buffers[i]);
      tensor.ready_events[rank] = std::move(events[i]);
      continue;
    }
    out->set_shm_name(tensor.memory.name());
    out->set_shm_bytes(static_cast<int64_t>(tensor.memory.size()));
    out->set_input_offset(tensor.input_offsets[rank]);
    out->set_output_offset(tensor.output_offset);
  }
  trainer.sink->Send(std::move(reply));
  SendManifest();
}

absl::Status AgentJob::MatchCudaBuffers(
    const v1::DeclareRequest& request,
    std::vector<const v1::CudaBuffer*>* buffers) const {
  buffers->assign(request.tensors_size(), nullptr);
  for (int j = 0; j < request.cuda_buffers_size(); ++j) {
    const v1::CudaBuffer& buffer = request.cuda_buffers(j);
    const int32_t i = buffer.index();
    const std::string what =
        absl::StrCat("DeclareRequest.cuda_buffers[", j, "].index (", i, ")");
    if (i < 0 || i >= request.tensors_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not a tensor of this request (0..",
                       request.tensors_size() - 1, ")"));
    }
    if (request.tensors(i).memory() != v1::MEMORY_KIND_CUDA) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " names \"", request.tensors(i).name(),
                       "\", which is declared in host memory; give a "
                       "CudaBuffer only for MEMORY_KIND_CUDA tensors"));
    }
    if ((*buffers)[i] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " names \"", request.tensors(i).name(),
          "\" a second time; give one CudaBuffer per CUDA tensor"));
    }
    (*buffers)[i] = &buffer;
  }
  for (int i = 0; i < request.tensors_size(); ++i) {
    if (request.tensors(i).memory() != v1::MEMORY_KIND_CUDA) continue;
    if (env_.gpus->memory == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DeclareRequest.tensors[", i, "] (\"", request.tensors(i).name(),
          "\") is a CUDA tensor, but agent ", config_.node_name,
          " has no GPU transport: ", env_.gpus->unavailable,
          ". Run CUDA trainers next to an agent that sees their GPUs, or "
          "move the tensor to host memory"));
    }
    if ((*buffers)[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeclareRequest.tensors[", i, "] (\"", request.tensors(i).name(),
          "\") is a CUDA tensor without a CudaBuffer; give one in "
          "DeclareRequest.cuda_buffers with index ",
          i));
    }
  }
  return absl::OkStatus();
}

absl::Status AgentJob::OpenCudaBuffer(
    int32_t rank, const std::string& what, const v1::CudaBuffer& buffer,
    int64_t bytes, std::shared_ptr<DeviceBuffer>* opened,
    std::unique_ptr<DeviceEvent>* event) const {
  DeviceBufferSpec spec;
  spec.pci_bus_id = buffer.pci_bus_id();
  spec.memory_handle = buffer.memory_handle();
  spec.offset = buffer.offset();
  // An empty tensor still maps its allocation (CUDA has no empty buffers).
  spec.bytes = std::max<int64_t>(bytes, 1);
  spec.event_handle = buffer.event_handle();
  const auto context = [&](const absl::Status& status) {
    return absl::Status(
        status.code(),
        absl::StrCat(what, " of local rank ", rank, ": ", status.message()));
  };
  auto memory = env_.gpus->memory->Open(spec);
  if (!memory.ok()) return context(memory.status());
  auto ready = env_.gpus->memory->OpenEvent(spec);
  if (!ready.ok()) return context(ready.status());
  for (size_t r = 0; r < trainers_.size(); ++r) {
    if (static_cast<int32_t>(r) != rank &&
        trainers_[r].cuda_device == (*memory)->local_device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of local rank ", rank, " is on GPU ",
          env_.gpus->memory->devices()[(*memory)->local_device()],
          ", which local rank ", r,
          " uses already; NCCL takes one rank per GPU: give every trainer "
          "of a node its own GPU"));
    }
  }
  *opened = std::move(*memory);
  *event = std::move(*ready);
  return absl::OkStatus();
}

void AgentJob::HandleDetach(TrainerSink* sink,
                            const v1::DetachRequest& request) {
  const int32_t rank = RankOf(sink);
  if (rank < 0) return;
  Trainer& trainer = trainers_[rank];
  if (!request.reason().empty()) {
    LOG(INFO) << JobLogPrefix(rank) << "local rank " << rank << " detached ("
              << request.reason() << ")";
  }
  if (!request.finished()) {
    return HandleTrainerGone(sink);
  }
  trainer.detached = true;
  DropDeliveries(rank);
  trainer.sink->Close(absl::OkStatus());
  const bool all = std::all_of(trainers_.begin(), trainers_.end(),
                               [](const Trainer& t) { return t.detached; });
  if (all && static_cast<int32_t>(trainers_.size()) == params_.local_size()) {
    LeaveAndEnd(
        absl::FailedPreconditionError(absl::StrCat(
            "job \"", name_, "\" finished on node ", config_.node_name)),
        /*finished=*/true);
  }
}

void AgentJob::HandleTrainerGone(TrainerSink* sink) {
  const int32_t rank = RankOf(sink);
  if (rank < 0 || state_ == State::kDone) return;
  Trainer& trainer = trainers_[rank];
  trainer.detached = true;
  DropDeliveries(rank);
  const std::string reason = absl::StrCat(
      "trainer local rank ", rank, " (pid ", trainer.pid, ") of job \"", name_,
      "\" on node ", config_.node_name, " disconnected");
  LOG(WARNING) << JobLogPrefix(rank) << reason << "; this node leaves the job";
  LeaveAndEnd(absl::AbortedError(
                  absl::StrCat(reason,
                               "; this node left the job: restart the job's "
                               "trainers on this node")),
              /*finished=*/false);
}

void AgentJob::LeaveAndEnd(const absl::Status& status, bool finished) {
  if (state_ == State::kJoining || state_ == State::kRunning ||
      state_ == State::kReforming) {
    // The last progress first, so the job's global step counts this node's
    // final steps (a short job may end before its first periodic report).
    if (finished) SendReport();
    v1::AgentMessage message;
    v1::LeaveJob* leave = message.mutable_leave();
    leave->set_job(name_);
    leave->set_generation(membership_ ? membership_->generation() : 0);
    leave->set_finished(finished);
    leave->set_reason(std::string(status.message()));
    if (finished && data_plane_) {
      // Every node stops after the round that carries this; the data plane
      // finishes on its own, without an abort.
      data_plane_->Leave();
      retired_.push_back(std::move(data_plane_));
    }
    env_.coordinator->Send(std::move(message));
  }
  End(status);
}

void AgentJob::End(const absl::Status& status) {
  if (state_ == State::kDone) return;
  state_ = State::kDone;
  ended_ = true;
  if (data_plane_) RetireDataPlane(status);
  held_failures_.clear();
  std::vector<uint64_t> ids;
  for (auto& [id, pending] : ops_) {
    if (!pending.notified) ids.push_back(id);
  }
  for (uint64_t id : ids) FailNow(ops_.at(id), status);
  for (Trainer& trainer : trainers_) {
    if (trainer.sink && !trainer.detached) {
      trainer.detached = true;
      trainer.sink->Close(status);
    }
  }
  SampleMetrics();
  if (!done_reported_ && env_.on_done) {
    done_reported_ = true;
    env_.on_done();
  }
}

std::string AgentJob::JobLogPrefix(int32_t local_rank) const {
  return LogPrefix(
      {name_, membership_ ? membership_->generation() : 0, config_.node_name,
       membership_ && local_rank >= 0 ? rank_offset_ + local_rank : -1});
}

void AgentJob::SampleMetrics() {
  int trainers = 0;
  for (const Trainer& t : trainers_) {
    if (t.sink && !t.detached) ++trainers;
  }
  env_.metrics->SetTrainersAttached(trainers);
  if (data_plane_) {
    const Scheduler::Stats stats = data_plane_->stats();
    env_.metrics->SetDataPlane(stats.queue_depth, stats.bytes_in_flight);
  } else {
    env_.metrics->SetDataPlane(0, 0);
  }
}

}  // namespace baton::agent
