#pragma once

#include <cstdint>

#include "baton/v1/trainer.pb.h"
#include "common/shm_channel.h"

namespace baton::agent {

// One local rank's enqueue of one step of a declared tensor, as the job
// matches it into an operation. The trainer's stream (EnqueueRequest) and
// its request ring (ChannelEntry) both convert into it, so the ring's fast
// path never builds a protobuf.
struct TensorEnqueue {
  int32_t index = 0;
  int64_t step = 0;
  bool average = false;
  // PUSH_PULL: how the ranks' values combine (not checked yet: a ring entry
  // may carry any value).
  int32_t reduce_op = 0;
  // The broadcast's root (a global rank); 0 for PUSH_PULL.
  int32_t root_rank = 0;
  // Came through the trainer's channel: complete it there too.
  bool via_channel = false;
  // The generation the trainer fenced it to; 0 for none
  // (EnqueueRequest.generation).
  int64_t generation = 0;

  static TensorEnqueue FromRequest(const v1::EnqueueRequest& request) {
    return TensorEnqueue{request.index(),     request.step(),
                         request.average(),   request.reduce_op(),
                         request.root_rank(), /*via_channel=*/false,
                         request.generation()};
  }
  static TensorEnqueue FromChannel(const ChannelEntry& entry) {
    return TensorEnqueue{
        entry.index,
        entry.step,
        (entry.flags & kChannelAverage) != 0,
        (entry.flags & kChannelReduceOpMask) >> kChannelReduceOpShift,
        static_cast<int32_t>(entry.value),
        /*via_channel=*/true,
        entry.generation};
  }
};

}  // namespace baton::agent
