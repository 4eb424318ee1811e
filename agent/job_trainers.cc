#include "agent/job_trainers.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_context.h"
#include "common/tensor_spec.h"
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

JobTrainers::JobTrainers(std::string job, const AgentConfig& config,
                         const GpuSupport& gpus, std::string shm_prefix,
                         const SharedMemory* doorbell)
    : job_(std::move(job)),
      config_(config),
      gpus_(gpus),
      shm_prefix_(std::move(shm_prefix)),
      doorbell_(doorbell),
      log_prefix_(LogPrefix({job_, 0, config_.node_name})) {}

JobTrainers::~JobTrainers() {
  for (auto& tensor : tensors_) {
    if (tensor && !tensor->on_device()) {
      SharedMemory::Unlink(tensor->memory.name()).IgnoreError();
    }
  }
  for (Trainer& trainer : trainers_) {
    if (trainer.mapping != nullptr) {
      SharedMemory::Unlink(trainer.mapping->memory.name()).IgnoreError();
    }
  }
}

absl::Status JobTrainers::Attach(const std::shared_ptr<TrainerSink>& sink,
                                 const v1::AttachRequest& r, bool attaching) {
  if (r.local_size() < 1 || r.local_size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.local_size is ", r.local_size(),
        "; give the number of trainers of the job on this node, 1..1024"));
  }
  if (r.local_rank() < 0 || r.local_rank() >= r.local_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.local_rank is ", r.local_rank(),
        "; it must be in 0..local_size-1 (local_size ", r.local_size(), ")"));
  }
  if (r.expected_nodes() < 1 || r.expected_nodes() > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttachRequest.expected_nodes is ", r.expected_nodes(),
                     "; give the job's node count, 1..100000"));
  }
  if (r.min_nodes() < 0 || r.min_nodes() > r.expected_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.min_nodes is ", r.min_nodes(),
        "; it must be in 0..expected_nodes (", r.expected_nodes(), ")"));
  }
  if (r.partition_bytes() < 0 || r.partition_bytes() % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.partition_bytes is ", r.partition_bytes(),
        "; give 0 (the coordinator's default) or a positive multiple of 8"));
  }
  if (r.has_node_rank() &&
      (r.node_rank() < 0 || r.node_rank() >= r.expected_nodes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttachRequest.node_rank is ", r.node_rank(), "; it must be in 0..",
        r.expected_nodes() - 1, " (expected_nodes - 1), or unset"));
  }
  if (!r.scheduling().empty() && r.scheduling() != "priority" &&
      r.scheduling() != "fifo") {
    return absl::InvalidArgumentError(
        absl::StrCat("AttachRequest.scheduling is \"", r.scheduling(),
                     "\"; give \"priority\", \"fifo\" or \"\" (the agent's "
                     "--scheduling)"));
  }
  if (!attaching) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job_, "\" is already running on node ", config_.node_name,
        " with all its ", trainers_.size(),
        " local trainers; a trainer cannot attach to it again: restart the "
        "job's trainers on this node (or use another job name)"));
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
                       job_, "\" on this node gave ", theirs,
                       ": every trainer of a job on one node must agree"));
    };
    if (r.local_size() != params_.local_size()) {
      return differs("local_size", r.local_size(), params_.local_size());
    }
    if (r.expected_nodes() != params_.expected_nodes()) {
      return differs("expected_nodes", r.expected_nodes(),
                     params_.expected_nodes());
    }
    if (r.min_nodes() != params_.min_nodes()) {
      return differs("min_nodes", r.min_nodes(), params_.min_nodes());
    }
    if (r.partition_bytes() != params_.partition_bytes()) {
      return differs("partition_bytes", r.partition_bytes(),
                     params_.partition_bytes());
    }
    if (r.scheduling() != params_.scheduling()) {
      return differs("scheduling", "\"" + r.scheduling() + "\"",
                     "\"" + params_.scheduling() + "\"");
    }
    const auto node_rank = [](const v1::AttachRequest& a) {
      return a.has_node_rank() ? std::to_string(a.node_rank()) : "unset";
    };
    if (node_rank(r) != node_rank(params_)) {
      return differs("node_rank", node_rank(r), node_rank(params_));
    }
  }
  Trainer& trainer = trainers_[r.local_rank()];
  if (trainer.sink) {
    return absl::AlreadyExistsError(
        absl::StrCat("local rank ", r.local_rank(), " of job \"", job_,
                     "\" is already attached by process ", trainer.pid,
                     "; give every trainer on this node its own LOCAL_RANK"));
  }
  trainer.sink = sink;
  trainer.pid = r.pid();
  if (doorbell_ != nullptr) {
    auto channel =
        SharedMemory::Create(absl::StrCat(shm_prefix_, "ch", r.local_rank()),
                             sizeof(TrainerChannel), config_.trainer_group);
    if (channel.ok()) {
      trainer.mapping = std::make_shared<ChannelMapping>();
      trainer.mapping->memory = std::move(*channel);
      trainer.mapping->channel =
          new (trainer.mapping->memory.data()) TrainerChannel();
    } else {
      LOG(WARNING) << log_prefix_ << "local rank " << r.local_rank()
                   << " enqueues over gRPC: " << channel.status().message();
    }
  }
  ++attached_;
  return absl::OkStatus();
}

bool JobTrainers::all_attached() const {
  return attached_ == params_.local_size();
}

bool JobTrainers::Declare(int32_t rank, uint64_t seq,
                          const v1::DeclareRequest& request,
                          absl::FunctionRef<int64_t(int32_t index)> next_step) {
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
            gpus_.memory->devices()[buffers[i]->local_device()],
            " but local rank ", rank, "'s other CUDA tensors are on ",
            gpus_.memory->devices()[cuda_device],
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
      // A name declared anew is its next version (client/session.cc): the
      // versions before it must be declared, this one must not.
      int32_t latest = -1;
      for (int32_t j = 0; j < index; ++j) {
        const v1::TensorSpec& other = j < static_cast<int32_t>(tensors_.size())
                                          ? tensors_[j]->spec
                                          : request.tensors(j - first);
        if (other.name() == spec.name()) {
          latest = std::max(latest, other.version());
        }
      }
      if (spec.version() != latest + 1) {
        status = absl::InvalidArgumentError(absl::StrCat(
            what, " declares ", DescribeSpec(spec), " but ",
            latest < 0 ? "the name was not declared before"
                       : absl::StrCat("its latest version is ", latest),
            ": declare a name anew as its next version (", latest + 1, ")"));
      }
      if (status.ok()) {
        auto tensor =
            LocalTensor::Create(absl::StrCat(shm_prefix_, index), spec,
                                params_.local_size(), config_.trainer_group);
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
      return false;
    }
  }
  for (auto& tensor : created) tensors_.push_back(std::move(tensor));
  trainer.cuda_device = cuda_device;
  v1::TrainerEvent reply;
  reply.set_reply_to(seq);
  v1::Declared* declared = reply.mutable_declared();
  for (int i = 0; i < request.tensors_size(); ++i) {
    const int32_t index = first + i;
    LocalTensor& tensor = *tensors_[index];
    // Before this rank counts as declaring it: the other ranks' step.
    const int64_t step = next_step(index);
    tensor.last_step[rank] = step - 1;
    ++tensor.declared_by;
    ++trainer.declared;
    v1::DeclaredTensor* out = declared->add_tensors();
    out->set_index(index);
    out->set_next_step(step);
    out->set_name(tensor.spec.name());
    out->set_size_bytes(tensor.size_bytes);
    out->set_input_bytes(tensor.input_bytes);
    if (tensor.on_device()) {
      tensor.device_buffers[rank] = std::move(buffers[i]);
      tensor.ready_events[rank] = std::move(events[i]);
      continue;
    }
    out->set_shm_name(tensor.memory.name());
    out->set_shm_bytes(static_cast<int64_t>(tensor.memory.size()));
    out->set_input_offset(tensor.input_offsets[rank]);
    out->set_output_offset(tensor.output_offset_of(rank));
  }
  trainer.sink->Send(std::move(reply));
  return true;
}

absl::Status JobTrainers::MatchCudaBuffers(
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
    if (IsRankStacked(request.tensors(i).op())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DeclareRequest.tensors[", i, "] (\"", request.tensors(i).name(),
          "\") is a CUDA tensor's ", OpText(request.tensors(i).op()),
          ", which baton does not run yet: use a host copy of it"));
    }
    if (gpus_.memory == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DeclareRequest.tensors[", i, "] (\"", request.tensors(i).name(),
          "\") is a CUDA tensor, but agent ", config_.node_name,
          " has no GPU transport: ", gpus_.unavailable,
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

absl::Status JobTrainers::OpenCudaBuffer(
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
  auto memory = gpus_.memory->Open(spec);
  if (!memory.ok()) return context(memory.status());
  auto ready = gpus_.memory->OpenEvent(spec);
  if (!ready.ok()) return context(ready.status());
  for (size_t r = 0; r < trainers_.size(); ++r) {
    if (static_cast<int32_t>(r) != rank &&
        trainers_[r].cuda_device == (*memory)->local_device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of local rank ", rank, " is on GPU ",
          gpus_.memory->devices()[(*memory)->local_device()],
          ", which local rank ", r,
          " uses already; NCCL takes one rank per GPU: give every trainer "
          "of a node its own GPU"));
    }
  }
  *opened = std::move(*memory);
  *event = std::move(*ready);
  return absl::OkStatus();
}

void JobTrainers::Detach(int32_t rank) { trainers_[rank].detached = true; }

void JobTrainers::Lose(int32_t rank) {
  Trainer& trainer = trainers_[rank];
  if (!trainer.sink) return;
  for (int32_t i = 0; i < trainer.declared; ++i) --tensors_[i]->declared_by;
  if (trainer.mapping != nullptr) {
    SharedMemory::Unlink(trainer.mapping->memory.name()).IgnoreError();
  }
  // Its progress stays: the node's completed step never goes back.
  const int64_t completed = trainer.completed_step;
  trainer = Trainer();
  trainer.completed_step = completed;
  --attached_;
}

bool JobTrainers::all_detached() const {
  const bool all = std::all_of(trainers_.begin(), trainers_.end(),
                               [](const Trainer& t) { return t.detached; });
  return all && static_cast<int32_t>(trainers_.size()) == params_.local_size();
}

void JobTrainers::CloseAll(const absl::Status& status) {
  for (Trainer& trainer : trainers_) {
    if (trainer.sink && !trainer.detached) {
      trainer.detached = true;
      trainer.sink->Close(status);
    }
  }
}

bool JobTrainers::DrainChannels(
    absl::FunctionRef<void(int32_t rank, const TensorEnqueue& enqueue)>
        enqueue) {
  bool any = false;
  for (size_t r = 0; r < trainers_.size(); ++r) {
    Trainer& trainer = trainers_[r];
    if (trainer.mapping == nullptr || trainer.detached) continue;
    ChannelRing& requests = trainer.mapping->channel->requests;
    if (requests.Corrupt()) {
      // The trainer wrote the ring's head or tail (the memory is its too):
      // its session ends, once, and the job hears of a lost trainer.
      if (!trainer.ring_refused) {
        trainer.ring_refused = true;
        const absl::Status status = absl::InvalidArgumentError(absl::StrCat(
            "local rank ", r, " of job \"", job_, "\": its request ring holds ",
            requests.Size(), " entries by its head and tail, more than its ",
            ChannelRing::kCapacity,
            " slots; the trainer wrote the ring's head or tail, which only "
            "the baton client may move: its session ends"));
        LOG(WARNING) << log_prefix_ << status.message();
        trainer.sink->Close(status);
      }
      continue;
    }
    ChannelEntry entry;
    for (uint64_t n = 0; n < ChannelRing::kCapacity && requests.Pop(&entry);
         ++n) {
      any = true;
      enqueue(static_cast<int32_t>(r), TensorEnqueue::FromChannel(entry));
    }
  }
  return any;
}

void JobTrainers::SendToAll(const v1::TrainerEvent& event) {
  for (Trainer& t : trainers_) {
    if (t.sink && !t.detached) t.sink->Send(event);
  }
}

int32_t JobTrainers::RankOf(const TrainerSink* sink) const {
  for (size_t r = 0; r < trainers_.size(); ++r) {
    if (trainers_[r].sink.get() == sink && !trainers_[r].detached) {
      return static_cast<int32_t>(r);
    }
  }
  return -1;
}

void JobTrainers::Completed(int32_t rank, int64_t step) {
  Trainer& trainer = trainers_[rank];
  trainer.completed_step = std::max(trainer.completed_step, step);
}

int64_t JobTrainers::CompletedStep() const {
  int64_t step = -1;
  bool first = true;
  for (const Trainer& t : trainers_) {
    step = first ? t.completed_step : std::min(step, t.completed_step);
    first = false;
  }
  return step;
}

std::vector<int> JobTrainers::CudaDevices() const {
  std::vector<int> devices;
  for (const Trainer& trainer : trainers_) {
    devices.push_back(trainer.cuda_device);
  }
  return devices;
}

int JobTrainers::connected() const {
  int trainers = 0;
  for (const Trainer& t : trainers_) {
    if (t.sink && !t.detached) ++trainers;
  }
  return trainers;
}

void JobTrainers::AddChannel(int32_t local_rank, v1::Attached* attached) const {
  const Trainer& trainer = trainers_[local_rank];
  if (trainer.mapping == nullptr) return;
  attached->set_doorbell_shm_name(doorbell_->name());
  attached->set_doorbell_shm_bytes(static_cast<int64_t>(doorbell_->size()));
  attached->set_channel_shm_name(trainer.mapping->memory.name());
  attached->set_channel_shm_bytes(
      static_cast<int64_t>(trainer.mapping->memory.size()));
}

bool JobTrainers::TunesPartitions() const {
  return config_.tune_partition_bytes && params_.partition_bytes() == 0;
}

}  // namespace baton::agent
