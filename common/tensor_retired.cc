#include "common/tensor_retired.h"

#include <utility>

#include "absl/strings/cord.h"

namespace baton {
namespace {
constexpr char kRetiredUrl[] = "baton.dev/tensor-retired";
}  // namespace

absl::Status TensorRetiredError(std::string message) {
  absl::Status status = absl::FailedPreconditionError(std::move(message));
  status.SetPayload(kRetiredUrl, absl::Cord());
  return status;
}

bool IsTensorRetired(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         status.GetPayload(kRetiredUrl).has_value();
}

}  // namespace baton
