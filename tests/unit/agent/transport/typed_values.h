#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "baton/v1/common.pb.h"
#include "gtest/gtest.h"

// Test data for the transports' collectives: small integers, exact in every
// data type, so that sums (and averages of data made for them) are
// bit-exact whatever the order of additions.

namespace baton::agent {

inline uint16_t HalfBits(int64_t value) {
  if (value == 0) return 0;
  const uint16_t sign = value < 0 ? 0x8000 : 0;
  float magnitude = static_cast<float>(value < 0 ? -value : value);
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof bits);
  const uint32_t exponent = ((bits >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>(sign | (exponent << 10) |
                               ((bits >> 13) & 0x3ff));
}

inline uint16_t BFloat16Bits(int64_t value) {
  const float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

// Writes `value` as element i of a `dtype` array.
inline void WriteElement(v1::DataType dtype, void* data, size_t i,
                         int64_t value) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      static_cast<float*>(data)[i] = static_cast<float>(value);
      return;
    case v1::DATA_TYPE_FLOAT64:
      static_cast<double*>(data)[i] = static_cast<double>(value);
      return;
    case v1::DATA_TYPE_FLOAT16:
      static_cast<uint16_t*>(data)[i] = HalfBits(value);
      return;
    case v1::DATA_TYPE_BFLOAT16:
      static_cast<uint16_t*>(data)[i] = BFloat16Bits(value);
      return;
    case v1::DATA_TYPE_INT32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(value);
      return;
    case v1::DATA_TYPE_INT64:
      static_cast<int64_t*>(data)[i] = value;
      return;
    case v1::DATA_TYPE_UINT8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(value);
      return;
    case v1::DATA_TYPE_INT8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(value);
      return;
    case v1::DATA_TYPE_INT16:
      static_cast<int16_t*>(data)[i] = static_cast<int16_t>(value);
      return;
    default:
      FAIL() << "no test encoding for data type " << dtype;
  }
}

inline bool IsUnsigned(v1::DataType dtype) {
  return dtype == v1::DATA_TYPE_UINT8;
}

// Node `rank`'s element i: 0..31 (unsigned) or -8..23, so that the sum over
// 4 nodes fits int8 and is exact in bfloat16.
inline int64_t Value(int rank, size_t i, v1::DataType dtype) {
  const int64_t v = static_cast<int64_t>((i * 7 + rank * 13) % 32);
  return IsUnsigned(dtype) ? v : v - 8;
}

// Rank `rank`'s element i for an average over `ranks` ranks: the same base
// on every rank, with +1 on rank 0 and -1 on rank 1, so that the average is
// exactly AverageBase(i, dtype) in every type. The base is -4..11 (1..16
// unsigned): the sum over 8 ranks fits int8, so no integer type wraps.
inline int64_t AverageBase(size_t i, v1::DataType dtype) {
  const int64_t v = static_cast<int64_t>((i * 7) % 16);
  return IsUnsigned(dtype) ? v + 1 : v - 4;
}
inline int64_t AverageValue(int rank, int ranks, size_t i, v1::DataType dtype) {
  const int64_t base = AverageBase(i, dtype);
  if (ranks < 2 || rank > 1) return base;
  return rank == 0 ? base + 1 : base - 1;
}

inline constexpr v1::DataType kAllTypes[] = {
    v1::DATA_TYPE_FLOAT32,  v1::DATA_TYPE_FLOAT64, v1::DATA_TYPE_FLOAT16,
    v1::DATA_TYPE_BFLOAT16, v1::DATA_TYPE_INT32,   v1::DATA_TYPE_INT64,
    v1::DATA_TYPE_UINT8,    v1::DATA_TYPE_INT8,    v1::DATA_TYPE_INT16};

// The types NCCL reduces: all but INT16.
inline constexpr v1::DataType kNcclTypes[] = {
    v1::DATA_TYPE_FLOAT32,  v1::DATA_TYPE_FLOAT64, v1::DATA_TYPE_FLOAT16,
    v1::DATA_TYPE_BFLOAT16, v1::DATA_TYPE_INT32,   v1::DATA_TYPE_INT64,
    v1::DATA_TYPE_UINT8,    v1::DATA_TYPE_INT8};

// Rank `rank`'s byte i, for broadcasts: differs from rank to rank.
inline uint8_t BytePattern(int rank, size_t i) {
  return static_cast<uint8_t>(i * 31 + rank * 101 + 7);
}

// Index of the first byte where a and b differ, or -1.
inline int64_t FirstDifference(const std::vector<uint8_t>& a,
                               const std::vector<uint8_t>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin());
  return ia == a.end() ? -1 : ia - a.begin();
}

}  // namespace baton::agent
