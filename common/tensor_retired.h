#pragma once

#include <string>

#include "absl/status/status.h"

namespace baton {

// A tensor (a name and a version) is retired when its nodes declared it
// differently: it is never planned, every operation on it fails with this
// status, and the trainers declare the name anew (its next version) for
// their next operation on it, so that the job goes on.
//
// FAILED_PRECONDITION carrying `message` (the mismatch, naming the values
// and the ranks holding each) and a payload that marks it.
absl::Status TensorRetiredError(std::string message);

// Whether `status` came from TensorRetiredError (or was marked as such).
bool IsTensorRetired(const absl::Status& status);

}  // namespace baton
