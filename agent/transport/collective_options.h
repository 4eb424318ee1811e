#pragma once

#include <chrono>
#include <cstdint>

#include "baton/v1/common.pb.h"

namespace baton::agent {

// Options every collective takes. The timeout bounds the whole operation; a
// collective that cannot finish in time fails with DEADLINE_EXCEEDED.
struct CollectiveOptions {
  std::chrono::milliseconds timeout{60000};
  // Distinguishes operations that may be in flight at once on one
  // communicator. Callers that use a communicator from one thread may leave
  // it 0.
  uint32_t tag = 0;
  // Allreduce only. When set, this node's values are read from here
  // (`count` elements, not overlapping `data` unless equal to it) and `data`
  // only receives the result: an out-of-place allreduce, which spares the
  // caller a copy.
  const void* input = nullptr;
  // Allreduce only: how the members' values combine. Only a SUM may have a
  // divisor, and only a SUM may leave out blocks of zeros (TcpRing).
  v1::ReduceOp op = v1::REDUCE_OP_SUM;
  // Allreduce only: the result is the sum divided by this (at least 1;
  // the job's world size for an average). A transport that divides only
  // the part of the result it finished itself (TcpRing) does 1/N of the
  // work of dividing the whole result on every node.
  int64_t divisor = 1;
};

}  // namespace baton::agent
