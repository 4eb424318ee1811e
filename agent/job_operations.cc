#include "agent/job_operations.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/enqueue_validation.h"
#include "agent/reduce.h"
#include "agent/scheduler/negotiation.h"
#include "common/membership_view.h"
#include "common/tensor_retired.h"
#include "common/tensor_spec.h"

namespace baton::agent {
namespace {

std::atomic<uint64_t> next_op_id{1};

}  // namespace

JobOperations::JobOperations(std::string job, const JobEnvironment& env,
                             JobTrainers* trainers,
                             const JobGeneration* generation,
                             std::function<void(std::function<void()>)> post)
    : job_(std::move(job)),
      env_(env),
      config_(*env.config),
      clock_(*env.clock),
      trainers_(*trainers),
      generation_(*generation),
      post_(std::move(post)) {}

void JobOperations::TensorsDeclared() {
  op_of_tensor_.resize(trainers_.tensor_count(), 0);
  submitted_of_tensor_.resize(trainers_.tensor_count());
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
      generation_.membership() ? generation_.membership()->world_size() : 0;
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
    message = OperationFailureMessage(name, enqueue.step, message);
  }
  failed->set_step(enqueue.step);
  failed->set_generation(generation_.generation());
  failed->set_code(static_cast<int32_t>(status.code()));
  failed->set_message(std::move(message));
  failed->set_retired(IsTensorRetired(status));
  trainers_.trainer(rank).sink->Send(std::move(event));
  env_.metrics->EnqueueRefused();
}

void JobOperations::Enqueue(int32_t rank, const TensorEnqueue& enqueue) {
  using State = JobGeneration::State;
  const State state = generation_.state();
  if (generation_.membership() &&
      (state == State::kReforming || state == State::kJoining ||
       state == State::kAttaching)) {
    // Between generations, or while a lost local trainer is replaced,
    // nothing can run: say so at once rather than hold the operation until
    // a generation that may never come.
    const absl::Status* aborted =
        generation_.aborted(generation_.membership()->generation());
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
      enqueue.generation != generation_.generation()) {
    // A fenced trainer started this before it heard of the re-form: it must
    // not run in a generation the trainer has not synchronized in.
    const absl::Status* aborted = generation_.aborted(enqueue.generation);
    return FailOp(
        rank, enqueue,
        absl::AbortedError(absl::StrCat(
            "enqueued for generation ", enqueue.generation, " of job \"", job_,
            "\", which is now in generation ", generation_.generation(),
            aborted != nullptr ? absl::StrCat(" (", aborted->message(), ")")
                               : std::string(),
            "; synchronize in the new generation and retry")));
  }
  if (generation_.data_plane_stopped()) {
    return FailOp(rank, enqueue, *generation_.data_plane_stopped());
  }
  // The trainer may have heard of the previous step's success before this
  // thread did.
  ConcludeFinished(enqueue.index);
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
      if (o.average != enqueue.average || o.root_rank != enqueue.root_rank ||
          o.reduce_op != enqueue.reduce_op) {
        const absl::Status disagree = absl::InvalidArgumentError(absl::StrCat(
            "local rank ", rank, " enqueued step ", enqueue.step,
            " of tensor \"", tensor.spec.name(), "\" with average=",
            enqueue.average, " root_rank=", enqueue.root_rank,
            " op=", ReduceOpName(static_cast<v1::ReduceOp>(enqueue.reduce_op)),
            " but another local rank used average=", o.average,
            " root_rank=", o.root_rank,
            " op=", ReduceOpName(static_cast<v1::ReduceOp>(o.reduce_op)),
            "; every rank must enqueue the same operation"));
        FailOp(rank, enqueue, disagree);
        Fail(pending, disagree);
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
    pending.generation = generation_.generation();
    pending.first_enqueued = clock_.Now();
    pending.ranks.assign(trainers_.local_size(), Enqueued{});
    pending.completion = std::make_shared<OpCompletion>(
        tensor.spec.name(), enqueue.index, enqueue.step, pending.generation);
  }
  PendingOp& pending = ops_.at(current);
  pending.ranks[rank] = Enqueued{true, enqueue};
  const JobTrainers::Trainer& trainer = trainers_.trainer(rank);
  if (trainer.sink && !trainer.detached) {
    pending.completion->AddTarget(
        {rank, trainer.sink, enqueue.via_channel ? trainer.mapping : nullptr});
  }
  if (std::all_of(pending.ranks.begin(), pending.ranks.end(),
                  [](const Enqueued& e) { return e.present; })) {
    MakeReady(pending);
  }
}

void JobOperations::MakeReady(PendingOp& pending) {
  LocalTensor& tensor = trainers_.tensor(pending.index);
  const TensorEnqueue& enqueue = pending.ranks[0].enqueue;
  const absl::Time now = clock_.Now();
  auto op = std::make_shared<Operation>();
  op->id = pending.id;
  op->tensor_name = tensor.spec.name();
  op->step = pending.step;
  op->kind = tensor.spec.op();
  op->dtype = tensor.spec.dtype();
  op->average = enqueue.average;
  op->reduce_op = static_cast<v1::ReduceOp>(enqueue.reduce_op);
  // One rank's slice: an allgather's input, a reduce-scatter's result, an
  // alltoall's block.
  op->size_bytes = SliceSizeBytes(tensor.spec);
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
  DataPlane* const data_plane = generation_.data_plane();
  if (pending.submitted || !pending.op || data_plane == nullptr ||
      generation_.state() != JobGeneration::State::kRunning) {
    return;
  }
  LocalTensor& tensor = trainers_.tensor(pending.index);
  if (tensor.tensor_id < 0 || !generation_.membership()) return;
  const v1::Membership& membership = *generation_.membership();
  // The lease: the previous step may still be inside an old data plane.
  const std::shared_ptr<const OpCompletion>& previous =
      submitted_of_tensor_[pending.index];
  if (previous != nullptr && !previous->released()) return;
  if (pending.op->on_device) {
    if (const absl::Status* failed = generation_.devices_failed()) {
      Fail(pending, *failed);
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
          : generation_.partition_bytes();
  if (IsRankStacked(op->kind)) {
    // The slices are laid out for the world the tensor was declared in.
    if (tensor.spec.shape(0) != membership.world_size()) {
      Fail(pending,
           absl::FailedPreconditionError(absl::StrCat(
               CollectiveName(op->kind), " of \"", op->tensor_name,
               "\" was declared for ", tensor.spec.shape(0), " ranks (shape ",
               ShapeText(tensor.spec), "), but generation ",
               membership.generation(), " has ", membership.world_size(),
               ": declare the name again with the new world size")));
      return;
    }
    op->rank_offset = membership.self().rank_offset();
  }
  if (op->kind == v1::COLLECTIVE_OP_BROADCAST) {
    if (op->root_rank >= membership.world_size()) {
      Fail(pending, absl::InvalidArgumentError(absl::StrCat(
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
    op->root_local =
        op->root_node == membership.self().node_rank() || op->on_device
            ? op->root_rank - root_offset
            : -1;
  }
  pending.submitted = true;
  pending.completion->Submitted();
  submitted_of_tensor_[pending.index] = pending.completion;
  {
    absl::MutexLock lock(&in_flight_mu_);
    in_flight_[pending.id] = pending.completion;
  }
  // May report at once, on this thread (OpDone).
  data_plane->Submit(pending.op);
}

void JobOperations::DropDeliveries(int32_t rank) {
  for (auto& [id, pending] : ops_) pending.completion->Forget(rank);
}

void JobOperations::OpDone(uint64_t id, const absl::Status& status) {
  std::shared_ptr<OpCompletion> completion;
  {
    absl::MutexLock lock(&in_flight_mu_);
    auto it = in_flight_.find(id);
    if (it != in_flight_.end()) {
      completion = std::move(it->second);
      in_flight_.erase(it);
    }
  }
  // A success reaches the trainers here; a failure waits for the job
  // thread's explanation.
  if (completion != nullptr) completion->DataPlaneDone(status, clock_.Now());
  post_([this, id, status] { OnOpDone(id, status); });
}

void JobOperations::OnOpDone(uint64_t id, const absl::Status& status) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;  // concluded and forgotten already
  PendingOp& pending = it->second;
  const int32_t index = pending.index;
  if (!pending.completion->finished()) {
    // A failure of the data plane's: explained before anyone hears of it.
    if (generation_.aborted(pending.generation) == nullptr &&
        generation_.holds_failures()) {
      pending.held = status;
      return;
    }
    pending.completion->Finish(Explained(pending, status), clock_.Now());
  }
  if (!pending.concluded) {
    Conclude(pending);
  } else {
    MaybeForget(pending);
  }
  // Its tensor's next operation may have waited for the lease.
  const uint64_t next = op_of_tensor_[index];
  if (next != 0 && next != id) TrySubmit(ops_.at(next));
}

absl::Status JobOperations::Explained(const PendingOp& pending,
                                      const absl::Status& status) const {
  const absl::Status* aborted = generation_.aborted(pending.generation);
  if (aborted == nullptr) return status;
  return absl::Status(aborted->code(),
                      absl::StrCat(aborted->message(), " (the data plane saw: ",
                                   status.message(), ")"));
}

void JobOperations::ReleaseHeld() {
  std::vector<uint64_t> ids;
  for (const auto& [id, pending] : ops_) {
    if (pending.held) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    PendingOp& pending = ops_.at(id);
    const absl::Status held = *std::exchange(pending.held, std::nullopt);
    Fail(pending, Explained(pending, held));
  }
}

void JobOperations::ConcludeFinished(int32_t index) {
  if (index < 0 || static_cast<size_t>(index) >= op_of_tensor_.size() ||
      op_of_tensor_[index] == 0) {
    return;
  }
  PendingOp& pending = ops_.at(op_of_tensor_[index]);
  if (!pending.concluded && pending.completion->finished()) {
    Conclude(pending);
  }
}

void JobOperations::SubmitWaiting() {
  std::vector<uint64_t> ids;
  for (auto& [id, pending] : ops_) {
    if (pending.op && !pending.submitted && !pending.concluded) {
      ids.push_back(id);
    }
  }
  // Lower ids were enqueued first.
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    auto it = ops_.find(id);
    if (it != ops_.end()) TrySubmit(it->second);
  }
}

void JobOperations::Fail(PendingOp& pending, const absl::Status& status) {
  // False when it succeeded meanwhile: then it concludes as a success.
  pending.completion->Finish(status, clock_.Now());
  if (!pending.concluded) Conclude(pending);
}

void JobOperations::Conclude(PendingOp& pending) {
  pending.concluded = true;
  const absl::Status status = pending.completion->status();
  LocalTensor& tensor = trainers_.tensor(pending.index);
  if (status.ok()) {
    if (tensor.tensor_id >= 0) {
      // From the first enqueue to when the trainers were told; never below
      // 0, even if the wall clock stepped back meanwhile.
      const absl::Duration latency =
          std::max(pending.completion->finished_at() - pending.first_enqueued,
                   absl::ZeroDuration());
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
  } else {
    env_.metrics->OperationFailed();
  }
  for (size_t r = 0; r < pending.ranks.size(); ++r) {
    if (!pending.ranks[r].present) continue;
    if (status.ok()) {
      trainers_.Completed(static_cast<int32_t>(r), pending.step);
    } else {
      // A failed step may be enqueued again (a retry after re-syncing).
      tensor.last_step[r] = std::min(tensor.last_step[r], pending.step - 1);
    }
  }
  if (op_of_tensor_[pending.index] == pending.id) {
    op_of_tensor_[pending.index] = 0;
  }
  MaybeForget(pending);
}

void JobOperations::MaybeForget(PendingOp& pending) {
  if (pending.concluded && pending.completion->released()) {
    ops_.erase(pending.id);
  }
}

void JobOperations::FailUnsubmitted(int32_t index, const absl::Status& status) {
  const uint64_t id = op_of_tensor_[index];
  if (id != 0 && !ops_.at(id).submitted) Fail(ops_.at(id), status);
}

void JobOperations::FailGeneration(int64_t generation,
                                   const absl::Status& status,
                                   bool only_waiting) {
  std::vector<uint64_t> ids;
  for (auto& [id, pending] : ops_) {
    if (only_waiting && pending.submitted) continue;
    if (!pending.concluded && pending.generation == generation) {
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) Fail(ops_.at(id), status);
}

void JobOperations::FailAll(const absl::Status& status) {
  std::vector<uint64_t> ids;
  for (auto& [id, pending] : ops_) {
    if (!pending.concluded) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) Fail(ops_.at(id), status);
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
