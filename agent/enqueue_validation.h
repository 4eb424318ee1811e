#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "agent/job_trainers.h"
#include "agent/tensor_enqueue.h"

namespace baton::agent {

// The operation of a tensor that waits for more local ranks' enqueues.
struct WaitingEnqueue {
  int64_t step = 0;
  // The local rank being checked already enqueued it.
  bool rank_present = false;
};

// Whether local rank `rank` (a local rank of `trainers`) may enqueue
// `enqueue`, which came from its stream or its request ring (both written by
// the trainer, so every field is checked): a tensor it declared and that
// matched the other nodes, a step in 0..Negotiation::kMaxStep above the
// last it enqueued of the tensor and, while `waiting` (the tensor's
// operation waiting for the other local ranks; null when there is none), the
// step they enqueued and not one it enqueued already; for a BROADCAST tensor
// no average and a root in 0..world_size-1 (`world_size` 0 when no
// generation is sealed yet: any root up to Negotiation::kMaxRootRank). The
// error is what the trainer is told (INVALID_ARGUMENT, FAILED_PRECONDITION,
// or the tensor's mismatch). Pure: JobOperations::Enqueue runs it, and
// tests/fuzz/trainer_protocol_fuzz.cc.
absl::Status ValidateEnqueue(const JobTrainers& trainers, int32_t rank,
                             const TensorEnqueue& enqueue,
                             const WaitingEnqueue* waiting, int32_t world_size);

}  // namespace baton::agent
