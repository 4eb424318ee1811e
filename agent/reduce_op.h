#pragma once

#include "baton/v1/common.pb.h"

namespace baton::agent {

// Whether push-pulls of `dtype` can combine with `op` (a v1::ReduceOp
// value, checked): SUM, MIN, MAX and PRODUCT every supported dtype, the
// bitwise ops the integer ones. The kernels (reduce.h) exist for exactly
// these. No kernels here, so that anything may link it.
bool ReduceOpApplies(v1::ReduceOp op, v1::DataType dtype);
// BAND, BOR, BXOR: integer dtypes only, and no device transport has them.
bool IsBitwise(v1::ReduceOp op);
// "sum", "min", "max", "product", "band", "bor", "bxor"; "unknown" for any
// other value.
const char* ReduceOpName(v1::ReduceOp op);
// Whether collectives of `kind` combine the ranks' values, so that a reduce
// op and average apply: push-pull and reduce-scatter.
bool Reduces(v1::CollectiveOp kind);

}  // namespace baton::agent
