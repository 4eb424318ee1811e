#include "agent/enqueue_validation.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "agent/reduce_op.h"
#include "agent/scheduler/negotiation.h"
#include "common/tensor_spec.h"

namespace baton::agent {

absl::Status ValidateEnqueue(const JobTrainers& trainers, int32_t rank,
                             const TensorEnqueue& e,
                             const WaitingEnqueue* waiting,
                             int32_t world_size) {
  const int32_t declared = trainers.trainer(rank).declared;
  if (e.index < 0 || e.index >= declared) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EnqueueRequest.index is ", e.index, "; local rank ", rank,
        " declared ", declared, " tensors (0..", declared - 1, ")"));
  }
  const LocalTensor& tensor = trainers.tensor(e.index);
  const std::string named = absl::StrCat("tensor \"", tensor.spec.name(), "\"");
  if (!tensor.mismatch.ok()) return tensor.mismatch;
  if (e.generation < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueRequest.generation is ", e.generation, " for ",
                     named, "; give 0 (no fence) or the generation synced in"));
  }
  if (e.step < 0 || e.step > Negotiation::kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueRequest.step is ", e.step, " for ", named,
                     "; give a step in 0..", Negotiation::kMaxStep));
  }
  if (e.step <= tensor.last_step[rank]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EnqueueRequest.step is ", e.step, " for ", named, " but local rank ",
        rank, " already enqueued step ", tensor.last_step[rank],
        "; steps of a tensor must increase"));
  }
  if (waiting != nullptr) {
    if (waiting->rank_present) {
      return absl::FailedPreconditionError(absl::StrCat(
          named, " step ", waiting->step, " of local rank ", rank,
          " has not completed; wait for it before enqueueing step ", e.step));
    }
    if (waiting->step != e.step) {
      return absl::InvalidArgumentError(
          absl::StrCat("local rank ", rank, " enqueued step ", e.step, " of ",
                       named, " while the other local ranks enqueued step ",
                       waiting->step, "; every rank must run the same steps"));
    }
  }
  if (e.reduce_op != v1::REDUCE_OP_SUM) {
    const auto op = static_cast<v1::ReduceOp>(e.reduce_op);
    if (!Reduces(tensor.spec.op())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EnqueueRequest.reduce_op is ", e.reduce_op, " for ", named,
          ", which was declared ", OpText(tensor.spec.op()),
          "; a reduce op applies to push_pull and reduce_scatter"));
    }
    if (!v1::ReduceOp_IsValid(e.reduce_op)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EnqueueRequest.reduce_op is ", e.reduce_op, " for ", named,
          "; give sum (0), min (1), max (2), product (3), band (4), bor (5) "
          "or bxor (6)"));
    }
    if (e.average) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EnqueueRequest.average is set with reduce op ", ReduceOpName(op),
          " for ", named, "; average applies to a sum only"));
    }
    if (!ReduceOpApplies(op, tensor.spec.dtype())) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce op ", ReduceOpName(op), " does not apply to ",
                       named, " (", v1::DataType_Name(tensor.spec.dtype()),
                       "): the bitwise ops take integer tensors only"));
    }
    if (tensor.spec.memory() == v1::MEMORY_KIND_CUDA && IsBitwise(op)) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce op ", ReduceOpName(op), " on CUDA ", named,
                       ": NCCL has no bitwise reductions; use a host tensor"));
    }
  }
  if (e.average && !Reduces(tensor.spec.op())) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueRequest.average is set for ", named,
                     ", which was declared ", OpText(tensor.spec.op()),
                     "; average applies to push_pull and reduce_scatter"));
  }
  if (tensor.spec.op() == v1::COLLECTIVE_OP_BROADCAST) {
    if (e.root_rank < 0 || (world_size > 0 && e.root_rank >= world_size) ||
        e.root_rank > Negotiation::kMaxRootRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("EnqueueRequest.root_rank is ", e.root_rank, " for ",
                       named, "; give a global rank in 0..", world_size - 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::agent
