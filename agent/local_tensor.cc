#include "agent/local_tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/reduce.h"
#include "common/validation.h"

namespace baton::agent {
namespace {

constexpr int64_t kMaxTensorBytes = int64_t{16} << 30;
constexpr int kMaxDims = 8;
constexpr int64_t kRegionAlign = 4096;

int64_t AlignUp(int64_t value) {
  return (value + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
}

std::string Shape(const v1::TensorSpec& spec) {
  return absl::StrCat("[", absl::StrJoin(spec.shape(), ","), "]");
}

}  // namespace

absl::Status ValidateDeclaration(const std::string& what,
                                 const v1::TensorSpec& spec) {
  absl::Status status = ValidateTensorName(what + ".name", spec.name());
  if (!status.ok()) return status;
  const std::string named = absl::StrCat(what, " (\"", spec.name(), "\")");
  if (ElementSize(spec.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        named, " has dtype ", v1::DataType_Name(spec.dtype()),
        "; give one of FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64, "
        "UINT8, INT8"));
  }
  if (spec.op() != v1::COLLECTIVE_OP_PUSH_PULL &&
      spec.op() != v1::COLLECTIVE_OP_BROADCAST) {
    return absl::InvalidArgumentError(
        absl::StrCat(named, " has no op: give PUSH_PULL or BROADCAST"));
  }
  if (!v1::MemoryKind_IsValid(spec.memory())) {
    return absl::InvalidArgumentError(
        absl::StrCat(named, " has memory ", static_cast<int>(spec.memory()),
                     ": give MEMORY_KIND_HOST or MEMORY_KIND_CUDA"));
  }
  if (spec.shape_size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        named, " has ", spec.shape_size(), " dimensions; the limit is 8"));
  }
  int64_t elements = 1;
  for (int i = 0; i < spec.shape_size(); ++i) {
    const int64_t dim = spec.shape(i);
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          named, " has shape ", Shape(spec), ": dimensions must be >= 0"));
    }
    if (dim > 0 && elements > kMaxTensorBytes / dim) {
      elements = kMaxTensorBytes + 1;
    } else {
      elements *= dim;
    }
  }
  if (elements >
      kMaxTensorBytes / static_cast<int64_t>(ElementSize(spec.dtype()))) {
    return absl::InvalidArgumentError(
        absl::StrCat(named, " with shape ", Shape(spec),
                     " holds more than 16 GiB; split it into several tensors"));
  }
  return absl::OkStatus();
}

int64_t DeclaredBytes(const v1::TensorSpec& spec) {
  int64_t elements = 1;
  for (int64_t dim : spec.shape()) elements *= dim;
  return elements * static_cast<int64_t>(ElementSize(spec.dtype()));
}

std::string DescribeDifference(const v1::TensorSpec& a,
                               const v1::TensorSpec& b) {
  if (a.name() != b.name()) {
    return absl::StrCat("name \"", a.name(), "\" vs \"", b.name(), "\"");
  }
  if (a.dtype() != b.dtype()) {
    return absl::StrCat("dtype ", v1::DataType_Name(a.dtype()), " vs ",
                        v1::DataType_Name(b.dtype()));
  }
  if (Shape(a) != Shape(b)) {
    return absl::StrCat("shape ", Shape(a), " vs ", Shape(b));
  }
  if (a.op() != b.op()) {
    return absl::StrCat("op ", v1::CollectiveOp_Name(a.op()), " vs ",
                        v1::CollectiveOp_Name(b.op()));
  }
  if (a.memory() != b.memory()) {
    return absl::StrCat("memory ", v1::MemoryKind_Name(a.memory()), " vs ",
                        v1::MemoryKind_Name(b.memory()));
  }
  return "";
}

absl::StatusOr<std::unique_ptr<LocalTensor>> LocalTensor::Create(
    const std::string& shm_name, const v1::TensorSpec& spec,
    int32_t local_size) {
  auto tensor = std::make_unique<LocalTensor>();
  tensor->spec = spec;
  tensor->size_bytes = DeclaredBytes(spec);
  tensor->first_enqueued.assign(local_size, false);
  tensor->last_step.assign(local_size, -1);
  if (tensor->on_device()) {
    tensor->device_buffers.resize(local_size);
    tensor->ready_events.resize(local_size);
    tensor->unlinked = true;  // nothing to unlink
    return tensor;
  }
  const int64_t region = AlignUp(std::max<int64_t>(tensor->size_bytes, 1));
  // The output never aliases an input, even with one trainer: after an
  // aborted generation a collective stuck in the old data plane may still
  // write the output while the trainer already writes its next input.
  const int32_t regions = local_size + 1;
  auto memory = SharedMemory::Create(shm_name, region * regions);
  if (!memory.ok()) return memory.status();
  tensor->memory = std::move(*memory);
  for (int32_t r = 0; r < local_size; ++r) {
    tensor->input_offsets.push_back(r * region);
  }
  tensor->output_offset = local_size * region;
  return tensor;
}

}  // namespace baton::agent
