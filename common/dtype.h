#pragma once

#include <cstdint>

#include "baton/v1/common.pb.h"

namespace baton {

// Bytes of one element of `dtype`; 0 for DATA_TYPE_UNSPECIFIED or a value
// that is not a known DataType. The one table every binary uses (the client
// library declares it in baton/session.h too).
int64_t ElementSize(v1::DataType dtype);

}  // namespace baton
