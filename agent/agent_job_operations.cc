// Operations: validating enqueues, building, submitting and finishing them.
#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/agent_job.h"
#include "agent/scheduler/negotiation.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

std::atomic<uint64_t> next_op_id{1};

// Every failure a trainer sees names its operation, also those for a
// reason that is not about the tensor (a stopped data plane, a node that
// left).
std::string FailureMessage(const std::string& tensor, int64_t step,
                           absl::string_view message) {
  if (absl::StrContains(message, absl::StrCat("\"", tensor, "\""))) {
    return std::string(message);
  }
  return absl::StrCat("tensor \"", tensor, "\" step ", step, ": ", message);
}

}  // namespace

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
  std::string message(status.message());
  if (request.index() >= 0 &&
      request.index() < static_cast<int32_t>(tensors_.size())) {
    const std::string& name = tensors_[request.index()]->spec.name();
    failed->set_tensor(name);
    message = FailureMessage(name, request.step(), message);
  }
  failed->set_step(request.step());
  failed->set_generation(membership_ ? membership_->generation() : 0);
  failed->set_code(static_cast<int32_t>(status.code()));
  failed->set_message(std::move(message));
  trainers_[rank].sink->Send(std::move(event));
  env_.metrics->EnqueueRefused();
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
  // The trainer may have heard of the previous step's success before this
  // thread did.
  RetireFinished(request.index());
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
  if (tensor.on_device()) {
    op->on_device = true;
    for (size_t rank = 0; rank < tensor.device_buffers.size(); ++rank) {
      op->device_buffers.push_back(
          static_cast<uint8_t*>(tensor.device_buffers[rank]->data()));
      op->ready.push_back(tensor.ready_events[rank].get());
    }
  } else {
    for (int64_t offset : tensor.input_offsets) {
      op->inputs.push_back(tensor.memory.data() + offset);
    }
    op->output = tensor.memory.data() + tensor.output_offset;
  }
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
  LocalTensor& tensor = *tensors_[pending.index];
  if (tensor.tensor_id < 0 || !membership_) return;
  if (lease_of_tensor_[pending.index] != 0) return;
  if (pending.op->on_device) {
    if (devices_failed_ && devices_generation_ == membership_->generation()) {
      FinishOp(pending, *devices_failed_);
      return;
    }
    // Waits for this generation's GPU communicators.
    if (!data_plane_->has_devices()) return;
    // The hierarchical path stages the cross-node step in host memory.
    if (config_.gpu_cross_node == GpuCrossNode::kGloo &&
        membership_->nodes_size() > 1) {
      if (tensor.stage.empty()) tensor.stage.resize(tensor.size_bytes);
      pending.op->output = tensor.stage.data();
    }
  }
  // Fill in what depends on the plan and the generation (in place: nothing
  // else holds the operation before it is submitted).
  Operation* op = pending.op.get();
  op->tensor_id = static_cast<uint32_t>(tensor.tensor_id);
  op->priority = tensor.priority;
  // 0: the scheduler's own (tuned) size.
  op->partition_bytes =
      mode_ == SchedulingMode::kFifo || TunesPartitions() ? 0 : partition_bytes_;
  if (op->kind == v1::COLLECTIVE_OP_BROADCAST) {
    if (op->root_rank >= membership_->world_size()) {
      FinishOp(pending, absl::InvalidArgumentError(absl::StrCat(
                            "root rank ", op->root_rank, " of broadcast of \"",
                            op->tensor_name, "\" is outside the world of ",
                            membership_->world_size(), " ranks")));
      return;
    }
    int32_t root_offset = 0;
    for (const v1::NodeInfo& node : membership_->nodes()) {
      if (op->root_rank >= node.rank_offset() &&
          op->root_rank < node.rank_offset() + node.local_size()) {
        op->root_node = node.node_rank();
        root_offset = node.rank_offset();
      }
    }
    // A CUDA tensor's broadcast starts at the root's GPU, which every node
    // names (NCCL rank = node rank x GPUs per node + local GPU).
    op->root_local = op->root_node == node_rank_ || op->on_device
                         ? op->root_rank - root_offset
                         : -1;
  }
  pending.generation = membership_->generation();
  pending.data_plane = data_plane_.get();
  PrepareDelivery(pending);
  data_plane_->Submit(pending.op);
}

bool AgentJob::ChannelMapping::Complete(const ChannelEntry& entry) {
  absl::MutexLock lock(&completions_mu);
  if (!channel->completions.Push(entry)) return false;
  channel->completion_bell.Ring();
  return true;
}

void AgentJob::PrepareDelivery(const PendingOp& pending) {
  Delivery delivery;
  for (size_t r = 0; r < pending.ranks.size(); ++r) {
    const Trainer& trainer = trainers_[r];
    if (!pending.ranks[r].present || !trainer.sink || trainer.detached) {
      continue;
    }
    delivery.targets.push_back(
        {static_cast<int32_t>(r), trainer.sink,
         pending.ranks[r].via_channel ? trainer.mapping : nullptr});
  }
  delivery.entry =
      ChannelEntry{pending.index, 0, pending.step, pending.generation, 0};
  v1::Completion* c = delivery.completion.mutable_completion();
  c->set_index(pending.index);
  c->set_tensor(tensors_[pending.index]->spec.name());
  c->set_step(pending.step);
  c->set_generation(pending.generation);
  absl::MutexLock lock(&deliveries_mu_);
  deliveries_[pending.id] = std::move(delivery);
}

bool AgentJob::TakeDelivery(uint64_t id) {
  absl::MutexLock lock(&deliveries_mu_);
  return deliveries_.erase(id) > 0;
}

void AgentJob::DropDeliveries(int32_t rank) {
  absl::MutexLock lock(&deliveries_mu_);
  for (auto& [id, delivery] : deliveries_) {
    auto& targets = delivery.targets;
    targets.erase(std::remove_if(targets.begin(), targets.end(),
                                 [rank](const Delivery::Target& t) {
                                   return t.rank == rank;
                                 }),
                  targets.end());
  }
}

void AgentJob::OpDone(uint64_t id, absl::Status status) {
  if (status.ok()) {
    Delivery delivery;
    {
      absl::MutexLock lock(&deliveries_mu_);
      auto it = deliveries_.find(id);
      if (it != deliveries_.end()) {
        delivery = std::move(it->second);
        deliveries_.erase(it);
        // Before the trainers can hear of it: their next enqueue of this
        // tensor finds it free (RetireFinished).
        finished_[id] = Clock::now();
      }
    }
    for (const Delivery::Target& target : delivery.targets) {
      if (target.mapping == nullptr ||
          !target.mapping->Complete(delivery.entry)) {
        // A stream rank, or a full ring: the stream carries it.
        target.sink->Send(delivery.completion);
      }
    }
  }
  Post([this, id, status = std::move(status)]() mutable {
    OnOpDone(id, std::move(status));
  });
}

void AgentJob::RetireFinished(int32_t index) {
  if (index < 0 || static_cast<size_t>(index) >= op_of_tensor_.size() ||
      op_of_tensor_[index] == 0) {
    return;
  }
  const uint64_t id = op_of_tensor_[index];
  {
    absl::MutexLock lock(&deliveries_mu_);
    if (!finished_.contains(id)) return;
  }
  OnOpDone(id, absl::OkStatus());
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
  std::optional<Clock::time_point> finished;
  {
    absl::MutexLock lock(&deliveries_mu_);
    // A failure leaves its delivery record: FinishOp takes it.
    auto it = finished_.find(id);
    if (it != finished_.end()) {
      finished = it->second;
      finished_.erase(it);
    }
  }
  auto it = ops_.find(id);
  if (it == ops_.end()) return;  // retired already (RetireFinished)
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
  // A success's latency ends when OpDone told the trainers.
  FinishOp(pending, status, finished.value_or(Clock::now()));
}

void AgentJob::Notify(PendingOp& pending, const absl::Status& status) {
  const LocalTensor& tensor = *tensors_[pending.index];
  std::optional<v1::TrainerEvent> event;
  if (!status.ok()) {
    // Whoever takes the delivery record tells the trainers; OpDone did not.
    TakeDelivery(pending.id);
    env_.metrics->OperationFailed();
    event.emplace();
    v1::OperationFailed* f = event->mutable_failed();
    f->set_index(pending.index);
    f->set_tensor(tensor.spec.name());
    f->set_step(pending.step);
    f->set_generation(pending.generation);
    f->set_code(static_cast<int32_t>(status.code()));
    f->set_message(
        FailureMessage(tensor.spec.name(), pending.step, status.message()));
  }
  LocalTensor& leased = *tensors_[pending.index];
  for (size_t r = 0; r < pending.ranks.size(); ++r) {
    if (!pending.ranks[r].present) continue;
    Trainer& trainer = trainers_[r];
    if (status.ok()) {
      // OpDone told it (a success reaches the trainers only that way).
      trainer.completed_step = std::max(trainer.completed_step, pending.step);
      continue;
    }
    // A failed step may be enqueued again (a retry after re-syncing).
    leased.last_step[r] = std::min(leased.last_step[r], pending.step - 1);
    if (trainer.sink && !trainer.detached) trainer.sink->Send(*event);
  }
  if (op_of_tensor_[pending.index] == pending.id) {
    op_of_tensor_[pending.index] = 0;
  }
}

void AgentJob::FinishOp(PendingOp& pending, const absl::Status& status,
                        Clock::time_point ended) {
  const LocalTensor& tensor = *tensors_[pending.index];
  if (status.ok() && tensor.tensor_id >= 0) {
    const Clock::duration latency = ended - pending.first_enqueued;
    env_.metrics->OperationCompleted(tensor.spec.name(), latency,
                                     tensor.size_bytes);
    const int64_t us =
        std::chrono::duration_cast<std::chrono::microseconds>(latency).count();
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
  // Already delivered as a success: its OnOpDone is on the way.
  if (!TakeDelivery(pending.id)) return;
  Notify(pending, status);
  pending.notified = true;
  lease_of_tensor_[pending.index] = pending.id;
}

}  // namespace baton::agent
