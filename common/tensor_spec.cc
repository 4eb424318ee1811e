#include "common/tensor_spec.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/validation.h"

namespace baton {
namespace {

struct DtypeInfo {
  v1::DataType dtype;
  const char* text;
};
constexpr DtypeInfo kDtypes[] = {
    {v1::DATA_TYPE_FLOAT32, "float32"}, {v1::DATA_TYPE_FLOAT64, "float64"},
    {v1::DATA_TYPE_FLOAT16, "float16"}, {v1::DATA_TYPE_BFLOAT16, "bfloat16"},
    {v1::DATA_TYPE_INT32, "int32"},     {v1::DATA_TYPE_INT64, "int64"},
    {v1::DATA_TYPE_UINT8, "uint8"},     {v1::DATA_TYPE_INT8, "int8"},
    {v1::DATA_TYPE_INT16, "int16"},
};
}  // namespace

absl::Status ValidateTensorSpec(const std::string& what,
                                const v1::TensorSpec& spec) {
  BATON_RETURN_IF_ERROR(
      ValidateTensorName(absl::StrCat(what, ".name"), spec.name()));
  const auto bad = [&](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".", field, " of tensor \"", spec.name(), "\" ", why));
  };
  if (spec.version() < 0 || spec.version() > kMaxTensorVersion) {
    return bad("version", absl::StrCat("is ", spec.version(),
                                       "; it must be in 0..", kMaxTensorVersion,
                                       " (the name's earlier declarations)"));
  }
  if (spec.dtype() == v1::DATA_TYPE_UNSPECIFIED ||
      !v1::DataType_IsValid(spec.dtype())) {
    return bad("dtype",
               absl::StrCat("is ", DtypeText(spec.dtype()),
                            ": declare one of float32, float64, float16, "
                            "bfloat16, int32, int64, uint8, int8"));
  }
  if (spec.op() != v1::COLLECTIVE_OP_PUSH_PULL &&
      spec.op() != v1::COLLECTIVE_OP_BROADCAST && !IsRankStacked(spec.op())) {
    return bad("op", absl::StrCat("is ", OpText(spec.op()),
                                  ": declare push_pull, broadcast, allgather, "
                                  "reduce_scatter or alltoall"));
  }
  if (!v1::MemoryKind_IsValid(spec.memory())) {
    return bad("memory", absl::StrCat("is ", MemoryText(spec.memory()),
                                      ": declare host or cuda"));
  }
  if (spec.shape_size() > kMaxTensorDims) {
    return bad("shape", absl::StrCat("has ", spec.shape_size(),
                                     " dimensions; the limit is ",
                                     kMaxTensorDims, ": reshape it"));
  }
  for (int i = 0; i < spec.shape_size(); ++i) {
    if (spec.shape(i) < 0) {
      return bad(
          absl::StrCat("shape[", i, "]"),
          absl::StrCat("is ", spec.shape(i), ": dimensions must be >= 0"));
    }
  }
  if (IsRankStacked(spec.op()) &&
      (spec.shape_size() == 0 || spec.shape(0) < 1)) {
    return bad("shape",
               absl::StrCat("is ", ShapeText(spec), ": an ", OpText(spec.op()),
                            " tensor's shape is [world size, one rank's "
                            "shape...]"));
  }
  if (TensorSizeBytes(spec) < 0) {
    return bad("shape",
               absl::StrCat("(", ShapeText(spec), " ", DtypeText(spec.dtype()),
                            ") holds more than ", kMaxTensorBytes >> 30,
                            " GiB, the most one tensor may hold: "
                            "split it into smaller tensors"));
  }
  return absl::OkStatus();
}

// Dividing before multiplying keeps dims like 2^62 from overflowing.
int64_t TensorSizeBytes(const v1::TensorSpec& spec) {
  for (int64_t dim : spec.shape()) {
    if (dim == 0) return 0;
  }
  int64_t bytes = ElementSize(spec.dtype());
  for (int64_t dim : spec.shape()) {
    if (dim < 0 || bytes > kMaxTensorBytes / dim) return -1;
    bytes *= dim;
  }
  return bytes;
}

bool IsRankStacked(v1::CollectiveOp op) {
  return op == v1::COLLECTIVE_OP_ALLGATHER ||
         op == v1::COLLECTIVE_OP_REDUCE_SCATTER ||
         op == v1::COLLECTIVE_OP_ALLTOALL;
}

bool ResultPerRank(v1::CollectiveOp op) {
  return op == v1::COLLECTIVE_OP_REDUCE_SCATTER ||
         op == v1::COLLECTIVE_OP_ALLTOALL;
}

namespace {

// One rank's slice of a rank-stacked spec's bytes, or -1.
int64_t RankSliceBytes(const v1::TensorSpec& spec, int64_t bytes) {
  if (bytes <= 0) return bytes;
  return spec.shape_size() > 0 && spec.shape(0) > 0 ? bytes / spec.shape(0)
                                                    : -1;
}

}  // namespace

int64_t InputSizeBytes(const v1::TensorSpec& spec) {
  const int64_t bytes = TensorSizeBytes(spec);
  return spec.op() == v1::COLLECTIVE_OP_ALLGATHER ? RankSliceBytes(spec, bytes)
                                                  : bytes;
}

int64_t SliceSizeBytes(const v1::TensorSpec& spec) {
  const int64_t bytes = TensorSizeBytes(spec);
  return IsRankStacked(spec.op()) ? RankSliceBytes(spec, bytes) : bytes;
}

int64_t ResultSizeBytes(const v1::TensorSpec& spec) {
  const int64_t bytes = TensorSizeBytes(spec);
  return spec.op() == v1::COLLECTIVE_OP_REDUCE_SCATTER
             ? RankSliceBytes(spec, bytes)
             : bytes;
}

std::string DtypeText(v1::DataType dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info.text;
  }
  if (dtype == v1::DATA_TYPE_UNSPECIFIED) return "unspecified";
  return absl::StrCat(static_cast<int>(dtype), ", not a known DataType");
}

std::string OpText(v1::CollectiveOp op) {
  if (op == v1::COLLECTIVE_OP_PUSH_PULL) return "push_pull";
  if (op == v1::COLLECTIVE_OP_BROADCAST) return "broadcast";
  if (op == v1::COLLECTIVE_OP_ALLGATHER) return "allgather";
  if (op == v1::COLLECTIVE_OP_REDUCE_SCATTER) return "reduce_scatter";
  if (op == v1::COLLECTIVE_OP_ALLTOALL) return "alltoall";
  if (op == v1::COLLECTIVE_OP_UNSPECIFIED) return "unspecified";
  return absl::StrCat(static_cast<int>(op), ", not a known CollectiveOp");
}

std::string MemoryText(v1::MemoryKind memory) {
  if (memory == v1::MEMORY_KIND_HOST) return "host";
  if (memory == v1::MEMORY_KIND_CUDA) return "cuda";
  return absl::StrCat(static_cast<int>(memory), ", not a known MemoryKind");
}

std::string ShapeText(const v1::TensorSpec& spec) {
  return absl::StrCat("[", absl::StrJoin(spec.shape(), ", "), "]");
}

std::string DescribeSpec(const v1::TensorSpec& spec) {
  return absl::StrCat(
      "\"", spec.name(), "\"",
      spec.version() == 0 ? "" : absl::StrCat(" version ", spec.version()),
      " (", DtypeText(spec.dtype()), " ", ShapeText(spec), " ",
      OpText(spec.op()),
      spec.memory() == v1::MEMORY_KIND_HOST
          ? ""
          : absl::StrCat(", ", MemoryText(spec.memory())),
      ")");
}

const char* SpecFieldName(SpecField field) {
  switch (field) {
    case kDtype:
      return "dtype";
    case kShape:
      return "shape";
    case kOp:
      return "op";
    case kMemory:
      return "memory";
  }
  return "?";
}

std::string SpecFieldText(const v1::TensorSpec& spec, SpecField field) {
  switch (field) {
    case kDtype:
      return DtypeText(spec.dtype());
    case kShape:
      return ShapeText(spec);
    case kOp:
      return OpText(spec.op());
    case kMemory:
      return MemoryText(spec.memory());
  }
  return "?";
}

uint8_t DiffSpecFields(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  uint8_t fields = 0;
  if (a.dtype() != b.dtype()) fields |= kDtype;
  if (!std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(),
                  b.shape().end())) {
    fields |= kShape;
  }
  if (a.op() != b.op()) fields |= kOp;
  if (a.memory() != b.memory()) fields |= kMemory;
  return fields;
}

bool SameSpec(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  return a.name() == b.name() && a.version() == b.version() &&
         DiffSpecFields(a, b) == 0;
}

std::string TensorKey(const v1::TensorSpec& spec) {
  if (spec.version() == 0) return spec.name();
  return absl::StrCat(spec.name(), "\n", spec.version());
}

std::string TensorLabel(const v1::TensorSpec& spec) {
  if (spec.version() == 0) return spec.name();
  return absl::StrCat(spec.name(), " (version ", spec.version(), ")");
}

std::string RanksText(const google::protobuf::RepeatedField<int32_t>& ranks,
                      size_t max_runs) {
  std::vector<std::string> runs;
  for (int i = 0; i < ranks.size();) {
    if (runs.size() >= max_runs) {
      runs.push_back("...");
      break;
    }
    int j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i >= 2) {
      runs.push_back(absl::StrCat(ranks[i], "-", ranks[j]));
    } else {
      for (int k = i; k <= j; ++k) runs.push_back(absl::StrCat(ranks[k]));
    }
    i = j + 1;
  }
  return absl::StrCat("{", absl::StrJoin(runs, ","), "}");
}

}  // namespace baton
