#include "common/dtype.h"

namespace baton {

int64_t ElementSize(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT64:
    case v1::DATA_TYPE_INT64:
      return 8;
    case v1::DATA_TYPE_FLOAT32:
    case v1::DATA_TYPE_INT32:
      return 4;
    case v1::DATA_TYPE_FLOAT16:
    case v1::DATA_TYPE_BFLOAT16:
    case v1::DATA_TYPE_INT16:
      return 2;
    case v1::DATA_TYPE_UINT8:
    case v1::DATA_TYPE_INT8:
      return 1;
    default:
      return 0;
  }
}

}  // namespace baton
