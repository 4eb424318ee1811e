#pragma once

#include <cstddef>
#include <cstdint>

#include "agent/reduce_op.h"
#include "baton/v1/common.pb.h"
#include "common/dtype.h"

namespace baton::agent {

// Element-wise kernels for the agent's reductions: the local sum of every
// local trainer's buffer, gloo's pairwise reduction, and the division that
// turns a sum into an average. Supported types: FLOAT32, FLOAT64, FLOAT16,
// BFLOAT16 (both accumulated in float32 and rounded to nearest-even once),
// INT32, INT64, UINT8, INT8, INT16 (integers wrap on overflow, like torch).
// Vectorized by the compiler, in baseline x86-64, AVX2 and AVX-512 versions
// picked per machine at load time; FLOAT16 uses the F16C instructions where
// the CPU has them, with the same results. No kernel allocates, and all are
// safe to call from any number of threads at once.

// Bytes per element (baton::ElementSize, common/dtype.h) as a size; 0 for
// DATA_TYPE_UNSPECIFIED or an unknown value.
inline size_t ElementSize(v1::DataType dtype) {
  return static_cast<size_t>(baton::ElementSize(dtype));
}

// dst[i] = srcs[0][i] + ... + srcs[num_srcs - 1][i] for i < count, summed
// in that order. `dst` may be one of `srcs` (any position); other overlap is
// undefined. num_srcs == 1 is a copy. FLOAT16/BFLOAT16 sum all sources in
// float32 and round once. CHECK-fails when num_srcs is 0 or the dtype is
// unsupported (ElementSize(dtype) == 0).
void SumInto(v1::DataType dtype, void* dst, const void* const* srcs,
             size_t num_srcs, size_t count);

// dst[i] = a[i] + b[i]; dst may equal a or b. The signature gloo's
// AllreduceOptions::setReduceFunction expects, bound to one dtype; nullptr
// for an unsupported dtype.
using PairwiseSum = void (*)(void* dst, const void* a, const void* b,
                             size_t count);
PairwiseSum PairwiseSumFor(v1::DataType dtype);

// dst[i] = op(srcs[0][i], ..., srcs[num_srcs - 1][i]), as SumInto (which it
// is for REDUCE_OP_SUM): `dst` may be one of `srcs`, FLOAT16/BFLOAT16 are
// computed in float32 and rounded once per element, integer PRODUCT wraps.
// MIN and MAX of a NaN are NaN. CHECK-fails unless ReduceOpApplies.
void ReduceInto(v1::ReduceOp op, v1::DataType dtype, void* dst,
                const void* const* srcs, size_t num_srcs, size_t count);

// PairwiseSum's counterpart for `op` (PairwiseSumFor for REDUCE_OP_SUM);
// nullptr unless ReduceOpApplies.
PairwiseSum PairwiseFor(v1::ReduceOp op, v1::DataType dtype);

// data[i] /= divisor (divisor >= 1). Floating types divide in their own
// precision (FLOAT16/BFLOAT16 in float32, rounded once); integers truncate
// toward zero, as torch's integer division for averages does. CHECK-fails
// on divisor < 1 or an unsupported dtype.
void DivideInPlace(v1::DataType dtype, void* data, size_t count,
                   int64_t divisor);

}  // namespace baton::agent
