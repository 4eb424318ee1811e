#include "agent/agent_job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/negotiation.h"
#include "common/grpc_util.h"
#include "common/validation.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

std::atomic<uint64_t> next_op_id{1};

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
      LOG(ERROR) << "cannot open launch trace " << path;
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
    LOG(WARNING) << "job " << name_ << ": no shared-memory fast path ("
                 << doorbell.status().message()
                 << "); trainers enqueue over gRPC";
    doorbell_ = &local_doorbell_;
  }
  thread_ = std::thread([this] { Loop(); });
}

AgentJob::~AgentJob() {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    if (trainer.channel != nullptr) {
      SharedMemory::Unlink(trainer.channel_memory.name()).IgnoreError();
    }
  }
  if (doorbell_ != &local_doorbell_) {
    SharedMemory::Unlink(doorbell_memory_.name()).IgnoreError();
  }
  if (launch_trace_ != nullptr) std::fclose(launch_trace_);
}

void AgentJob::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(mu_);
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
    if (trainer.channel == nullptr || trainer.detached) continue;
    ChannelEntry entry;
    // Bounded: a trainer that keeps pushing cannot starve the others.
    for (uint64_t n = 0;
         n < ChannelRing::kCapacity && trainer.channel->requests.Pop(&entry);
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
      trainer.channel_memory = std::move(*channel);
      trainer.channel = new (trainer.channel_memory.data()) TrainerChannel();
    } else {
      LOG(WARNING) << "job " << name_ << ": local rank " << r.local_rank()
                   << " enqueues over gRPC: " << channel.status().message();
    }
  }
  ++attached_;
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
  // shared memory created, before any is recorded.
  const int32_t first = trainer.declared;
  std::vector<std::unique_ptr<LocalTensor>> created;
  for (int i = 0; i < request.tensors_size(); ++i) {
    const v1::TensorSpec& spec = request.tensors(i);
    const int32_t index = first + i;
    const std::string what = absl::StrCat("DeclareRequest.tensors[", i, "]");
    absl::Status status = ValidateDeclaration(what, spec);
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
        SharedMemory::Unlink(t->memory.name()).IgnoreError();
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
    out->set_shm_name(tensor.memory.name());
    out->set_shm_bytes(static_cast<int64_t>(tensor.memory.size()));
    out->set_input_offset(tensor.input_offsets[rank]);
    out->set_output_offset(tensor.output_offset);
    out->set_size_bytes(tensor.size_bytes);
  }
  trainer.sink->Send(std::move(reply));
  SendManifest();
}

absl::Status AgentJob::ValidateEnqueue(int32_t rank,
                                       const v1::EnqueueRequest& r) {
  if (r.index() < 0 || r.index() >= trainers_[rank].declared) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueRequest.index is ", r.index(), "; local rank ",
                     rank, " declared ", trainers_[rank].declared,
                     " tensors (0..", trainers_[rank].declared - 1, ")"));
  }
  const LocalTensor& tensor = *tensors_[r.index()];
  const std::string named = absl::StrCat("tensor \"", tensor.spec.name(), "\"");
  if (!tensor.mismatch.ok()) return tensor.mismatch;
  if (r.step() < 0 || r.step() > Negotiation::kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueRequest.step is ", r.step(), " for ", named,
                     "; give a step in 0..", Negotiation::kMaxStep));
  }
  if (r.step() <= tensor.last_step[rank]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EnqueueRequest.step is ", r.step(), " for ", named, " but local rank ",
        rank, " already enqueued step ", tensor.last_step[rank],
        "; steps of a tensor must increase"));
  }
  const uint64_t current = op_of_tensor_[r.index()];
  if (current != 0) {
    const PendingOp& pending = ops_.at(current);
    if (pending.ranks[rank].present) {
      return absl::FailedPreconditionError(absl::StrCat(
          named, " step ", pending.step, " of local rank ", rank,
          " has not completed; wait for it before enqueueing step ", r.step()));
    }
    if (pending.step != r.step()) {
      return absl::InvalidArgumentError(
          absl::StrCat("local rank ", rank, " enqueued step ", r.step(), " of ",
                       named, " while the other local ranks enqueued step ",
                       pending.step, "; every rank must run the same steps"));
    }
  }
  if (tensor.spec.op() == v1::COLLECTIVE_OP_BROADCAST) {
    if (r.average()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EnqueueRequest.average is set for ", named,
          ", which was declared BROADCAST; average applies to PUSH_PULL"));
    }
    const int32_t world = membership_ ? membership_->world_size() : 0;
    if (r.root_rank() < 0 || (world > 0 && r.root_rank() >= world) ||
        r.root_rank() > Negotiation::kMaxRootRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("EnqueueRequest.root_rank is ", r.root_rank(), " for ",
                       named, "; give a global rank in 0..", world - 1));
    }
  }
  return absl::OkStatus();
}

void AgentJob::FailOp(int32_t rank, const v1::EnqueueRequest& request,
                      const absl::Status& status) {
  v1::TrainerEvent event;
  v1::OperationFailed* failed = event.mutable_failed();
  failed->set_index(request.index());
  if (request.index() >= 0 &&
      request.index() < static_cast<int32_t>(tensors_.size())) {
    failed->set_tensor(tensors_[request.index()]->spec.name());
  }
  failed->set_step(request.step());
  failed->set_generation(membership_ ? membership_->generation() : 0);
  failed->set_code(static_cast<int32_t>(status.code()));
  failed->set_message(std::string(status.message()));
  trainers_[rank].sink->Send(std::move(event));
}

void AgentJob::HandleEnqueue(TrainerSink* sink,
                             const v1::EnqueueRequest& request,
                             bool via_channel) {
  const int32_t rank = RankOf(sink);
  if (rank < 0) return;
  if (membership_ &&
      (state_ == State::kReforming || state_ == State::kJoining)) {
    // Between generations nothing can run: say so at once rather than hold
    // the operation until a generation that may never come.
    auto aborted = aborted_.find(membership_->generation());
    return FailOp(rank, request,
                  aborted != aborted_.end()
                      ? aborted->second
                      : absl::AbortedError(
                            absl::StrCat("job \"", name_,
                                         "\" is between generations; "
                                         "wait for the next one and retry")));
  }
  if (state_ == State::kAttaching || state_ == State::kJoining ||
      state_ == State::kDone) {
    return FailOp(rank, request,
                  absl::FailedPreconditionError(
                      absl::StrCat("job \"", name_,
                                   "\" has no sealed generation yet; "
                                   "enqueue after `attached`")));
  }
  if (data_plane_stopped_) return FailOp(rank, request, *data_plane_stopped_);
  absl::Status status = ValidateEnqueue(rank, request);
  if (!status.ok()) return FailOp(rank, request, status);
  LocalTensor& tensor = *tensors_[request.index()];
  uint64_t& current = op_of_tensor_[request.index()];
  if (current != 0) {
    // Local ranks must agree on average and root: otherwise the operation
    // cannot run, and every local rank that enqueued it hears why.
    PendingOp& pending = ops_.at(current);
    for (const Enqueued& other : pending.ranks) {
      if (!other.present) continue;
      const auto& o = other.request;
      if (o.average() != request.average() ||
          o.root_rank() != request.root_rank()) {
        const absl::Status disagree = absl::InvalidArgumentError(absl::StrCat(
            "local rank ", rank, " enqueued step ", request.step(),
            " of tensor \"", tensor.spec.name(), "\" with average=",
            request.average(), " root_rank=", request.root_rank(),
            " but another local rank used average=", o.average(), " root_rank=",
            o.root_rank(), "; every rank must enqueue the same operation"));
        FailOp(rank, request, disagree);
        FinishOp(pending, disagree);
        return;
      }
      break;
    }
  }
  tensor.last_step[rank] = request.step();
  if (!tensor.first_enqueued[rank]) {
    tensor.first_enqueued[rank] = true;
    if (!tensor.unlinked &&
        std::all_of(tensor.first_enqueued.begin(), tensor.first_enqueued.end(),
                    [](bool b) { return b; })) {
      // Every local trainer has mapped it: nothing is left behind if the
      // agent is killed from now on.
      SharedMemory::Unlink(tensor.memory.name()).IgnoreError();
      tensor.unlinked = true;
    }
  }
  if (current == 0) {
    current = next_op_id.fetch_add(1);
    PendingOp& pending = ops_[current];
    pending.id = current;
    pending.index = request.index();
    pending.step = request.step();
    pending.generation = membership_ ? membership_->generation() : 0;
    pending.first_enqueued = Clock::now();
    pending.ranks.assign(params_.local_size(), Enqueued{});
  }
  PendingOp& pending = ops_.at(current);
  pending.ranks[rank] = Enqueued{true, request, via_channel};
  if (std::all_of(pending.ranks.begin(), pending.ranks.end(),
                  [](const Enqueued& e) { return e.present; })) {
    MakeReady(pending);
  }
}

void AgentJob::MakeReady(PendingOp& pending) {
  LocalTensor& tensor = *tensors_[pending.index];
  const v1::EnqueueRequest& request = pending.ranks[0].request;
  pending.ready = Clock::now();
  pending.generation = membership_ ? membership_->generation() : 0;
  auto op = std::make_shared<Operation>();
  op->id = pending.id;
  op->tensor_name = tensor.spec.name();
  op->step = pending.step;
  op->kind = tensor.spec.op();
  op->dtype = tensor.spec.dtype();
  op->average = request.average();
  op->size_bytes = tensor.size_bytes;
  op->ready_unix_us = absl::ToUnixMicros(absl::Now());
  for (int64_t offset : tensor.input_offsets) {
    op->inputs.push_back(tensor.memory.data() + offset);
  }
  op->output = tensor.memory.data() + tensor.output_offset;
  if (op->kind == v1::COLLECTIVE_OP_BROADCAST)
    op->root_rank = request.root_rank();
  pending.op = std::move(op);
  TrySubmit(pending);
}

void AgentJob::TrySubmit(PendingOp& pending) {
  if (pending.data_plane != nullptr || !pending.op || !data_plane_ ||
      state_ != State::kRunning) {
    return;
  }
  const LocalTensor& tensor = *tensors_[pending.index];
  if (tensor.tensor_id < 0 || !membership_) return;
  if (lease_of_tensor_[pending.index] != 0) return;
  // Fill in what depends on the plan and the generation.
  auto op = std::make_shared<Operation>(*pending.op);
  op->tensor_id = static_cast<uint32_t>(tensor.tensor_id);
  op->priority = tensor.priority;
  op->partition_bytes = mode_ == SchedulingMode::kFifo ? 0 : partition_bytes_;
  if (op->kind == v1::COLLECTIVE_OP_BROADCAST) {
    if (op->root_rank >= membership_->world_size()) {
      FinishOp(pending, absl::InvalidArgumentError(absl::StrCat(
                            "root rank ", op->root_rank, " of broadcast of \"",
                            op->tensor_name, "\" is outside the world of ",
                            membership_->world_size(), " ranks")));
      return;
    }
    for (const v1::NodeInfo& node : membership_->nodes()) {
      if (op->root_rank >= node.rank_offset() &&
          op->root_rank < node.rank_offset() + node.local_size()) {
        op->root_node = node.node_rank();
      }
    }
    op->root_local =
        op->root_node == node_rank_ ? op->root_rank - rank_offset_ : -1;
  }
  pending.op = op;
  pending.generation = membership_->generation();
  pending.data_plane = data_plane_.get();
  data_plane_->Submit(std::move(op));
}

void AgentJob::SubmitWaiting() {
  std::vector<uint64_t> ids;
  for (auto& [id, pending] : ops_) {
    if (pending.op && pending.data_plane == nullptr) ids.push_back(id);
  }
  // Lower ids were enqueued first.
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    auto it = ops_.find(id);
    if (it != ops_.end()) TrySubmit(it->second);
  }
}

void AgentJob::OnOpDone(uint64_t id, absl::Status status) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  PendingOp& pending = it->second;
  if (pending.notified) {
    // Its trainers already know; the buffers are free again.
    lease_of_tensor_[pending.index] = 0;
    ops_.erase(it);
    SubmitWaiting();
    return;
  }
  if (!status.ok()) {
    auto aborted = aborted_.find(pending.generation);
    if (aborted != aborted_.end()) {
      status = absl::Status(
          aborted->second.code(),
          absl::StrCat(aborted->second.message(),
                       " (the data plane saw: ", status.message(), ")"));
    } else if (data_plane_failure_) {
      held_failures_.emplace_back(id, std::move(status));
      return;
    }
  }
  FinishOp(pending, status);
}

void AgentJob::Notify(PendingOp& pending, const absl::Status& status) {
  const LocalTensor& tensor = *tensors_[pending.index];
  v1::TrainerEvent event;
  if (status.ok()) {
    v1::Completion* c = event.mutable_completion();
    c->set_index(pending.index);
    c->set_tensor(tensor.spec.name());
    c->set_step(pending.step);
    c->set_generation(pending.generation);
  } else {
    v1::OperationFailed* f = event.mutable_failed();
    f->set_index(pending.index);
    f->set_tensor(tensor.spec.name());
    f->set_step(pending.step);
    f->set_generation(pending.generation);
    f->set_code(static_cast<int32_t>(status.code()));
    f->set_message(std::string(status.message()));
  }
  LocalTensor& leased = *tensors_[pending.index];
  for (size_t r = 0; r < pending.ranks.size(); ++r) {
    if (!pending.ranks[r].present) continue;
    Trainer& trainer = trainers_[r];
    if (status.ok()) {
      trainer.completed_step = std::max(trainer.completed_step, pending.step);
    } else {
      // A failed step may be enqueued again (a retry after re-syncing).
      leased.last_step[r] = std::min(leased.last_step[r], pending.step - 1);
    }
    if (!trainer.sink || trainer.detached) continue;
    if (status.ok() && pending.ranks[r].via_channel &&
        trainer.channel != nullptr) {
      ChannelEntry entry{pending.index, 0, pending.step, pending.generation, 0};
      if (trainer.channel->completions.Push(entry)) {
        trainer.channel->completion_bell.Ring();
        continue;
      }
    }
    // Failures carry text, and a full ring falls back to the stream.
    trainer.sink->Send(event);
  }
  if (op_of_tensor_[pending.index] == pending.id) {
    op_of_tensor_[pending.index] = 0;
  }
}

void AgentJob::FinishOp(PendingOp& pending, const absl::Status& status) {
  const LocalTensor& tensor = *tensors_[pending.index];
  if (status.ok() && tensor.tensor_id >= 0) {
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                           Clock::now() - pending.first_enqueued)
                           .count();
    Latency& l = latencies_[static_cast<uint32_t>(tensor.tensor_id)];
    ++l.count;
    l.total_us += us;
    l.max_us = std::max(l.max_us, us);
  }
  Notify(pending, status);
  ops_.erase(pending.id);
}

void AgentJob::FailNow(PendingOp& pending, const absl::Status& status) {
  if (pending.notified) return;
  if (pending.data_plane == nullptr) {
    FinishOp(pending, status);
    return;
  }
  Notify(pending, status);
  pending.notified = true;
  lease_of_tensor_[pending.index] = pending.id;
}

void AgentJob::HandleDetach(TrainerSink* sink,
                            const v1::DetachRequest& request) {
  const int32_t rank = RankOf(sink);
  if (rank < 0) return;
  Trainer& trainer = trainers_[rank];
  if (!request.reason().empty()) {
    LOG(INFO) << "job " << name_ << ": local rank " << rank << " detached ("
              << request.reason() << ")";
  }
  if (!request.finished()) {
    return HandleTrainerGone(sink);
  }
  trainer.finished = true;
  trainer.detached = true;
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
  const std::string reason = absl::StrCat(
      "trainer local rank ", rank, " (pid ", trainer.pid, ") of job \"", name_,
      "\" on node ", config_.node_name, " disconnected");
  LOG(WARNING) << reason << "; this node leaves the job";
  LeaveAndEnd(absl::AbortedError(
                  absl::StrCat(reason,
                               "; this node left the job: restart the job's "
                               "trainers on this node")),
              /*finished=*/false);
}

void AgentJob::LeaveAndEnd(const absl::Status& status, bool finished) {
  if (state_ == State::kJoining || state_ == State::kRunning ||
      state_ == State::kReforming) {
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
  if (!done_reported_ && env_.on_done) {
    done_reported_ = true;
    env_.on_done();
  }
}

}  // namespace baton::agent
