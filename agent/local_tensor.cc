#include "agent/local_tensor.h"

#include "absl/strings/str_cat.h"
#include "common/tensor_spec.h"

namespace baton::agent {
namespace {

constexpr int64_t kRegionAlign = 4096;

int64_t AlignUp(int64_t value) {
  return (value + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
}

}  // namespace

std::string DescribeDifference(const v1::TensorSpec& a,
                               const v1::TensorSpec& b) {
  if (a.name() != b.name()) {
    return absl::StrCat("name \"", a.name(), "\" vs \"", b.name(), "\"");
  }
  if (a.version() != b.version()) {
    return absl::StrCat("version ", a.version(), " vs ", b.version());
  }
  const uint8_t fields = DiffSpecFields(a, b);
  for (SpecField field : kSpecFields) {
    if ((fields & field) == 0) continue;
    return absl::StrCat(SpecFieldName(field), " ", SpecFieldText(a, field),
                        " vs ", SpecFieldText(b, field));
  }
  return "";
}

absl::StatusOr<std::unique_ptr<LocalTensor>> LocalTensor::Create(
    const std::string& shm_name, const v1::TensorSpec& spec, int32_t local_size,
    std::optional<gid_t> group) {
  auto tensor = std::make_unique<LocalTensor>();
  tensor->spec = spec;
  tensor->size_bytes = ResultSizeBytes(spec);
  tensor->input_bytes = InputSizeBytes(spec);
  tensor->last_step.assign(local_size, -1);
  if (tensor->on_device()) {
    tensor->device_buffers.resize(local_size);
    tensor->ready_events.resize(local_size);
    return tensor;
  }
  const int64_t input_region =
      AlignUp(std::max<int64_t>(tensor->input_bytes, 1));
  // A reduce-scatter's and an alltoall's local ranks each receive their
  // own result.
  const int64_t outputs = ResultPerRank(spec.op()) ? local_size : 1;
  const int64_t output_region =
      AlignUp(std::max<int64_t>(tensor->size_bytes * outputs, 1));
  // The output never aliases an input, even with one trainer: after an
  // aborted generation a collective stuck in the old data plane may still
  // write the output while the trainer already writes its next input.
  auto memory = SharedMemory::Create(
      shm_name, input_region * local_size + output_region, group);
  if (!memory.ok()) return memory.status();
  tensor->memory = std::move(*memory);
  for (int32_t r = 0; r < local_size; ++r) {
    tensor->input_offsets.push_back(r * input_region);
  }
  tensor->output_offset = local_size * input_region;
  return tensor;
}

int64_t LocalTensor::output_offset_of(int32_t local_rank) const {
  return ResultPerRank(spec.op()) ? output_offset + local_rank * size_bytes
                                  : output_offset;
}

}  // namespace baton::agent
