#pragma once

#include <memory>

#include "agent/scheduler/operation.h"

namespace baton::agent {

// Where a job's operations go to run: the Scheduler of the current
// generation (a fake in the job's tests). Thread-safe.
class DataPlane {
 public:
  virtual ~DataPlane() = default;
  // Hands over an operation whose inputs are ready; its end is reported
  // once, through the op_done the data plane was built with. At most one
  // per tensor at a time.
  virtual void Submit(std::shared_ptr<const Operation> op) = 0;
  // The CUDA tensors' communicators are attached: operations on device
  // memory can run.
  virtual bool has_devices() const = 0;
};

}  // namespace baton::agent
