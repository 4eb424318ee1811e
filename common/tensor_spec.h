#pragma once

#include <google/protobuf/repeated_field.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "baton/v1/common.pb.h"
#include "common/dtype.h"

namespace baton {

// What a tensor spec may be, what it occupies, and how it reads in errors:
// the rules and the text shared by the coordinator's tensor plan (validating
// manifests, recovering plans, describing mismatches) and the agent
// (checking a trainer's declaration, so that a bad one fails at the
// trainer's declare call with the same words). Pure functions; thread-safe.

// Largest tensor a spec may describe, and most dimensions it may have.
inline constexpr int64_t kMaxTensorBytes = int64_t{16} << 30;
inline constexpr int kMaxTensorDims = 8;
// Highest TensorSpec.version: how often one name may be declared anew.
inline constexpr int32_t kMaxTensorVersion = 1000000;

// The fields two declarations of one name can disagree on, as bits.
enum SpecField : uint8_t { kDtype = 1, kShape = 2, kOp = 4, kMemory = 8 };
inline constexpr SpecField kSpecFields[] = {kDtype, kShape, kOp, kMemory};

// OK when `spec` has a valid name, a version in 0..kMaxTensorVersion, a
// known dtype, a known op (an allgather's shape [world size >= 1, ...]),
// a known memory kind, at most kMaxTensorDims dimensions, each >= 0, and holds
// at most kMaxTensorBytes. Otherwise INVALID_ARGUMENT naming the field, with
// `what` naming the spec ("Manifest.tensors[3]").
absl::Status ValidateTensorSpec(const std::string& what,
                                const v1::TensorSpec& spec);

// Element count times element size of a spec whose dims are all >= 0, or -1
// when that exceeds kMaxTensorBytes. A zero dim makes the tensor empty (0),
// whatever the other dims; a scalar (no dims) is one element. Never
// overflows, whatever the dims.
int64_t TensorSizeBytes(const v1::TensorSpec& spec);

// Whether a spec of `op` has the world size as its first dimension, one
// slice per rank: ALLGATHER (the result), REDUCE_SCATTER (the input) and
// ALLTOALL (both: a block per destination, then a block per source).
bool IsRankStacked(v1::CollectiveOp op);
// Whether each rank of `op` receives a result of its own (REDUCE_SCATTER,
// ALLTOALL), not the one every rank receives.
bool ResultPerRank(v1::CollectiveOp op);
// One rank's slice of a rank-stacked spec (the bytes over shape[0]), what
// an operation's partitions divide; TensorSizeBytes for the others.
int64_t SliceSizeBytes(const v1::TensorSpec& spec);
// What one rank writes for one operation: TensorSizeBytes, but for an
// allgather one slice of it (the bytes over shape[0]); -1 as there.
int64_t InputSizeBytes(const v1::TensorSpec& spec);
// What one rank receives: TensorSizeBytes, but for a reduce-scatter one
// slice of it.
int64_t ResultSizeBytes(const v1::TensorSpec& spec);

// "float32"; "unspecified"; "42, not a known DataType".
std::string DtypeText(v1::DataType dtype);
// "push_pull", "broadcast", "allgather", "reduce_scatter", "alltoall";
// "unspecified"; "7, not a known CollectiveOp".
std::string OpText(v1::CollectiveOp op);
// "host", "cuda"; "5, not a known MemoryKind".
std::string MemoryText(v1::MemoryKind memory);
// "[3, 4]"; "[]" for a scalar.
std::string ShapeText(const v1::TensorSpec& spec);
// `"w" (float32 [3, 4] push_pull)`, `"w" (float32 [3, 4] push_pull, cuda)`,
// `"w" version 2 (float32 [3] push_pull)`, for errors that show a whole
// spec.
std::string DescribeSpec(const v1::TensorSpec& spec);

// What identifies a declared tensor within a job: its name and version (a
// name declared anew is a new tensor). Distinct for distinct (name,
// version) pairs: a valid name has no newline. For maps, never for text.
std::string TensorKey(const v1::TensorSpec& spec);
// How a tensor reads in messages and status: `w`, or `w (version 2)` after
// the name was declared anew.
std::string TensorLabel(const v1::TensorSpec& spec);

// "dtype", "shape", "op" or "memory".
const char* SpecFieldName(SpecField field);
// The value of `field` in `spec`, as DtypeText, ShapeText, OpText or
// MemoryText write it.
std::string SpecFieldText(const v1::TensorSpec& spec, SpecField field);
// The SpecFields in which `a` and `b` differ (names are not compared).
uint8_t DiffSpecFields(const v1::TensorSpec& a, const v1::TensorSpec& b);
// Same name, version, dtype, shape, op and memory.
bool SameSpec(const v1::TensorSpec& a, const v1::TensorSpec& b);

// `ranks` (ascending) as "{0,1}" or "{0-7,16-23}": runs of three or more
// consecutive ranks are shortened, and after `max_runs` runs the rest is
// "...".
std::string RanksText(const google::protobuf::RepeatedField<int32_t>& ranks,
                      size_t max_runs);

}  // namespace baton
