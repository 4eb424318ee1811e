#include "agent/reduce_op.h"

#include "common/dtype.h"

namespace baton::agent {

bool ReduceOpApplies(v1::ReduceOp op, v1::DataType dtype) {
  if (!v1::ReduceOp_IsValid(op) || baton::ElementSize(dtype) == 0) {
    return false;
  }
  const bool integer =
      dtype == v1::DATA_TYPE_INT32 || dtype == v1::DATA_TYPE_INT64 ||
      dtype == v1::DATA_TYPE_UINT8 || dtype == v1::DATA_TYPE_INT8 ||
      dtype == v1::DATA_TYPE_INT16;
  return !IsBitwise(op) || integer;
}

bool IsBitwise(v1::ReduceOp op) {
  return op == v1::REDUCE_OP_BAND || op == v1::REDUCE_OP_BOR ||
         op == v1::REDUCE_OP_BXOR;
}

const char* ReduceOpName(v1::ReduceOp op) {
  switch (op) {
    case v1::REDUCE_OP_SUM:
      return "sum";
    case v1::REDUCE_OP_MIN:
      return "min";
    case v1::REDUCE_OP_MAX:
      return "max";
    case v1::REDUCE_OP_PRODUCT:
      return "product";
    case v1::REDUCE_OP_BAND:
      return "band";
    case v1::REDUCE_OP_BOR:
      return "bor";
    case v1::REDUCE_OP_BXOR:
      return "bxor";
    default:
      return "unknown";
  }
}

bool Reduces(v1::CollectiveOp kind) {
  return kind == v1::COLLECTIVE_OP_PUSH_PULL ||
         kind == v1::COLLECTIVE_OP_REDUCE_SCATTER;
}

}  // namespace baton::agent
