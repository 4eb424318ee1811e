#include "agent/job_operations.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/enqueue_validation.h"
#include "agent/scheduler/negotiation.h"
#include "common/membership_view.h"

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

JobOperations::JobOperations(std::string job, const JobEnvironment& env,
                             JobTrainers* trainers, JobMembership* membership,
                             std::function<void(std::function<void()>)> post)
    : job_(std::move(job)),
      env_(env),
      config_(*env.config),
      clock_(*env.clock),
      trainers_(*trainers),
      membership_(*membership),
      post_(std::move(post)) {}

void JobOperations::TensorsDeclared() {
  op_of_tensor_.resize(trainers_.tensor_count(), 0);
  lease_of_tensor_.resize(trainers_.tensor_count(), 0);
}

absl::Status JobOperations::ValidateEnqueue(int32_t rank,
                                            const TensorEnqueue& e) const {
  WaitingEnqueue waiting;
  const uint64_t current =
      e.index >= 0 && static_cast<size_t>(e.index) < op_of_tensor_.size()
          ? op_of_tensor_[e.index]
          : 0;
  if (current != 0) {
    const PendingOp& pending = ops_.at(current);
    waiting.step = pending.step;
    waiting.rank_present = pending.ranks[rank].present;
  }
  const int32_t world =
      membership_.membership() ? membership_.membership()->world_size() : 0;
  return agent::ValidateEnqueue(trainers_, rank, e,
                                current != 0 ? &waiting : nullptr, world);
}

void JobOperations::FailOp(int32_t rank, const TensorEnqueue& enqueue,
                           const absl::Status& status) {
  v1::TrainerEvent event;
  v1::OperationFailed* failed = event.mutable_failed();
  failed->set_index(enqueue.index);
  std::string message(status.message());
  if (enqueue.index >= 0 && enqueue.index < trainers_.tensor_count()) {
    const std::string& name = trainers_.tensor(enqueue.index).spec.name();
    failed->set_tensor(name);
    message = FailureMessage(name, enqueue.step, message);
  }
  failed->set_step(enqueue.step);
  failed->set_generation(membership_.generation());
  failed->set_code(static_cast<int32_t>(status.code()));
  failed->set_message(std::move(message));
  trainers_.trainer(rank).sink->Send(std::move(event));
  env_.metrics->EnqueueRefused();
}

void JobOperations::Enqueue(int32_t rank, const TensorEnqueue& enqueue) {
  using State = JobMembership::State;
  const State state = membership_.state();
  if (membership_.membership() &&
      (state == State::kReforming || state == State::kJoining ||
       state == State::kAttaching)) {
    // Between generations, or while a lost local trainer is replaced,
    // nothing can run: say so at once rather than hold the operation until
    // a generation that may never come.
    const absl::Status* aborted =
        membership_.aborted(membership_.membership()->generation());
    return FailOp(rank, enqueue,
                  aborted != nullptr ? *aborted
                                     : absl::AbortedError(absl::StrCat(
                                           "job \"", job_,
                                           "\" is between generations; "
                                           "wait for the next one and retry")));
  }
  if (state == State::kAttaching || state == State::kJoining ||
      state == State::kDone) {
    return FailOp(rank, enqueue,
                  absl::FailedPreconditionError(
                      absl::StrCat("job \"", job_,
                                   "\" has no sealed generation yet; "
                                   "enqueue after `attached`")));
  }
  if (enqueue.generation > 0 &&
      enqueue.generation != membership_.generation()) {
    // A fenced trainer started this before it heard of the re-form: it must
    // not run in a generation the trainer has not synchronized in.
    const absl::Status* aborted = membership_.aborted(enqueue.generation);
    return FailOp(
        rank, enqueue,
        absl::AbortedError(absl::StrCat(
            "enqueued for generation ", enqueue.generation, " of job \"", job_,
            "\", which is now in generation ", membership_.generation(),
            aborted != nullptr ? absl::StrCat(" (", aborted->message(), ")")
                               : std::string(),
            "; synchronize in the new generation and retry")));
  }
  if (membership_.data_plane_stopped()) {
    return FailOp(rank, enqueue, *membership_.data_plane_stopped());
  }
  // The trainer may have heard of the previous step's success before this
  // thread did.
  RetireFinished(enqueue.index);
  absl::Status status = ValidateEnqueue(rank, enqueue);
  if (!status.ok()) return FailOp(rank, enqueue, status);
  LocalTensor& tensor = trainers_.tensor(enqueue.index);
  uint64_t& current = op_of_tensor_[enqueue.index];
  if (current != 0) {
    // Local ranks must agree on average and root: otherwise the operation
    // cannot run, and every local rank that enqueued it hears why.
    PendingOp& pending = ops_.at(current);
    for (const Enqueued& other : pending.ranks) {
      if (!other.present) continue;
      const TensorEnqueue& o = other.enqueue;
      if (o.average != enqueue.average || o.root_rank != enqueue.root_rank) {
        const absl::Status disagree = absl::InvalidArgumentError(absl::StrCat(
            "local rank ", rank, " enqueued step ", enqueue.step,
            " of tensor \"", tensor.spec.name(), "\" with average=",
            enqueue.average, " root_rank=", enqueue.root_rank,
            " but another local rank used average=", o.average, " root_rank=",
            o.root_rank, "; every rank must enqueue the same operation"));
        FailOp(rank, enqueue, disagree);
        FinishOp(pending, disagree);
        return;
      }
      break;
    }
  }
  tensor.last_step[rank] = enqueue.step;
  if (current == 0) {
    current = next_op_id.fetch_add(1);
    PendingOp& pending = ops_[current];
    pending.id = current;
    pending.index = enqueue.index;
    pending.step = enqueue.step;
    pending.generation = membership_.generation();
    pending.first_enqueued = clock_.Now();
    pending.ranks.assign(trainers_.local_size(), Enqueued{});
  }
  PendingOp& pending = ops_.at(current);
  pending.ranks[rank] = Enqueued{true, enqueue};
  if (std::all_of(pending.ranks.begin(), pending.ranks.end(),
                  [](const Enqueued& e) { return e.present; })) {
    MakeReady(pending);
  }
}

void JobOperations::MakeReady(PendingOp& pending) {
  LocalTensor& tensor = trainers_.tensor(pending.index);
  const TensorEnqueue& enqueue = pending.ranks[0].enqueue;
  const absl::Time now = clock_.Now();
  pending.generation = membership_.generation();
  auto op = std::make_shared<Operation>();
  op->id = pending.id;
  op->tensor_name = tensor.spec.name();
  op->step = pending.step;
  op->kind = tensor.spec.op();
  op->dtype = tensor.spec.dtype();
  op->average = enqueue.average;
  op->size_bytes = tensor.size_bytes;
  op->ready_unix_us = absl::ToUnixMicros(now);
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
    op->root_rank = enqueue.root_rank;
  pending.op = std::move(op);
  TrySubmit(pending);
}

void JobOperations::TrySubmit(PendingOp& pending) {
  Scheduler* const data_plane = membership_.data_plane();
  if (pending.data_plane != nullptr || !pending.op || data_plane == nullptr ||
      membership_.state() != JobMembership::State::kRunning) {
    return;
  }
  LocalTensor& tensor = trainers_.tensor(pending.index);
  if (tensor.tensor_id < 0 || !membership_.membership()) return;
  const v1::Membership& membership = *membership_.membership();
  if (lease_of_tensor_[pending.index] != 0) return;
  if (pending.op->on_device) {
    if (const absl::Status* failed = membership_.devices_failed()) {
      FinishOp(pending, *failed);
      return;
    }
    // Waits for this generation's GPU communicators.
    if (!data_plane->has_devices()) return;
    // The hierarchical path stages the cross-node step in host memory.
    if (config_.gpu_cross_node == GpuCrossNode::kGloo &&
        membership.num_nodes() > 1) {
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
      trainers_.mode() == SchedulingMode::kFifo || trainers_.TunesPartitions()
          ? 0
          : membership_.partition_bytes();
  if (op->kind == v1::COLLECTIVE_OP_BROADCAST) {
    if (op->root_rank >= membership.world_size()) {
      FinishOp(pending, absl::InvalidArgumentError(absl::StrCat(
                            "root rank ", op->root_rank, " of broadcast of \"",
                            op->tensor_name, "\" is outside the world of ",
                            membership.world_size(), " ranks")));
      return;
    }
    // Inside the world (checked above), so a node holds it.
    const RankPlace root = *NodeOfRank(membership, op->root_rank);
    op->root_node = root.node_rank;
    const int32_t root_offset = root.rank_offset;
    // A CUDA tensor's broadcast starts at the root's GPU, which every node
    // names (NCCL rank = node rank x GPUs per node + local GPU).
    op->root_local = op->root_node == membership_.node_rank() || op->on_device
                         ? op->root_rank - root_offset
                         : -1;
  }
  pending.generation = membership.generation();
  pending.data_plane = data_plane;
  PrepareDelivery(pending);
  data_plane->Submit(pending.op);
}

void JobOperations::PrepareDelivery(const PendingOp& pending) {
  Delivery delivery;
  for (size_t r = 0; r < pending.ranks.size(); ++r) {
    const JobTrainers::Trainer& trainer =
        trainers_.trainer(static_cast<int32_t>(r));
    if (!pending.ranks[r].present || !trainer.sink || trainer.detached) {
      continue;
    }
    delivery.targets.push_back(
        {static_cast<int32_t>(r), trainer.sink,
         pending.ranks[r].enqueue.via_channel ? trainer.mapping : nullptr});
  }
  delivery.entry =
      ChannelEntry{pending.index, 0, pending.step, pending.generation, 0};
  delivery.tensor = &trainers_.tensor(pending.index).spec.name();
  absl::MutexLock lock(&deliveries_mu_);
  deliveries_[pending.id] = std::move(delivery);
}

bool JobOperations::TakeDelivery(uint64_t id) {
  absl::MutexLock lock(&deliveries_mu_);
  return deliveries_.erase(id) > 0;
}

void JobOperations::DropDeliveries(int32_t rank) {
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

void JobOperations::OpDone(uint64_t id, absl::Status status) {
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
        finished_[id] = clock_.Now();
      }
    }
    for (const Delivery::Target& target : delivery.targets) {
      if (target.mapping == nullptr ||
          !target.mapping->Complete(delivery.entry)) {
        // A stream rank, or a full ring: the stream carries it.
        v1::TrainerEvent event;
        v1::Completion* c = event.mutable_completion();
        c->set_index(delivery.entry.index);
        c->set_tensor(*delivery.tensor);
        c->set_step(delivery.entry.step);
        c->set_generation(delivery.entry.value);  // the generation
        target.sink->Send(std::move(event));
      }
    }
  }
  post_([this, id, status = std::move(status)]() mutable {
    OnOpDone(id, std::move(status));
  });
}

void JobOperations::RetireFinished(int32_t index) {
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

void JobOperations::SubmitWaiting() {
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

void JobOperations::OnOpDone(uint64_t id, absl::Status status) {
  std::optional<absl::Time> finished;
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
    if (const absl::Status* aborted = membership_.aborted(pending.generation)) {
      status = absl::Status(
          aborted->code(),
          absl::StrCat(aborted->message(),
                       " (the data plane saw: ", status.message(), ")"));
    } else if (membership_.HoldFailure(id, status)) {
      return;
    }
  }
  // A success's latency ends when OpDone told the trainers.
  FinishOp(pending, status, finished.value_or(clock_.Now()));
}

void JobOperations::Notify(PendingOp& pending, const absl::Status& status) {
  const LocalTensor& tensor = trainers_.tensor(pending.index);
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
  LocalTensor& leased = trainers_.tensor(pending.index);
  for (size_t r = 0; r < pending.ranks.size(); ++r) {
    if (!pending.ranks[r].present) continue;
    const int32_t rank = static_cast<int32_t>(r);
    if (status.ok()) {
      // OpDone told it (a success reaches the trainers only that way).
      trainers_.Completed(rank, pending.step);
      continue;
    }
    const JobTrainers::Trainer& trainer = trainers_.trainer(rank);
    // A failed step may be enqueued again (a retry after re-syncing).
    leased.last_step[r] = std::min(leased.last_step[r], pending.step - 1);
    if (trainer.sink && !trainer.detached) trainer.sink->Send(*event);
  }
  if (op_of_tensor_[pending.index] == pending.id) {
    op_of_tensor_[pending.index] = 0;
  }
}

void JobOperations::FinishOp(PendingOp& pending, const absl::Status& status) {
  FinishOp(pending, status, clock_.Now());
}

void JobOperations::FinishOp(PendingOp& pending, const absl::Status& status,
                             absl::Time ended) {
  const LocalTensor& tensor = trainers_.tensor(pending.index);
  if (status.ok() && tensor.tensor_id >= 0) {
    // Never below 0, even if the wall clock stepped back meanwhile.
    const absl::Duration latency =
        std::max(ended - pending.first_enqueued, absl::ZeroDuration());
    env_.metrics->OperationCompleted(tensor.spec.name(),
                                     absl::ToChronoNanoseconds(latency),
                                     tensor.size_bytes);
    const int64_t us = absl::ToInt64Microseconds(latency);
    Latency& l = latencies_[static_cast<uint32_t>(tensor.tensor_id)];
    ++l.count;
    l.total_us += us;
    l.max_us = std::max(l.max_us, us);
    l.last_step = std::max(l.last_step, pending.step);
  }
  Notify(pending, status);
  ops_.erase(pending.id);
}

void JobOperations::FailNow(PendingOp& pending, const absl::Status& status) {
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

void JobOperations::Finish(uint64_t id, const absl::Status& status) {
  auto it = ops_.find(id);
  if (it != ops_.end()) FinishOp(it->second, status);
}

void JobOperations::FailUnsubmitted(int32_t index, const absl::Status& status) {
  const uint64_t id = op_of_tensor_[index];
  if (id != 0 && ops_.at(id).data_plane == nullptr) {
    FinishOp(ops_.at(id), status);
  }
}

void JobOperations::FailGeneration(int64_t generation,
                                   const absl::Status& status,
                                   bool only_waiting) {
  std::vector<uint64_t> ids;
  for (auto& [id, pending] : ops_) {
    if (only_waiting && pending.data_plane != nullptr) continue;
    if (!pending.notified && pending.generation == generation) {
      ids.push_back(id);
    }
  }
  for (uint64_t id : ids) FailNow(ops_.at(id), status);
}

void JobOperations::FailAll(const absl::Status& status) {
  std::vector<uint64_t> ids;
  for (auto& [id, pending] : ops_) {
    if (!pending.notified) ids.push_back(id);
  }
  for (uint64_t id : ids) FailNow(ops_.at(id), status);
}

int64_t JobOperations::NextStep(int32_t index) const {
  if (index < static_cast<int32_t>(op_of_tensor_.size()) &&
      op_of_tensor_[index] != 0) {
    const PendingOp& pending = ops_.at(op_of_tensor_[index]);
    if (pending.op == nullptr) return pending.step;
  }
  const std::vector<int64_t>& last = trainers_.tensor(index).last_step;
  return *std::max_element(last.begin(), last.end()) + 1;
}

absl::flat_hash_map<uint32_t, JobOperations::Latency>
JobOperations::TakeLatencies() {
  return std::exchange(latencies_, {});
}

}  // namespace baton::agent
