#include "agent/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// Independent references: IEEE half conversions come from the compiler's
// _Float16 (libgcc's soft-float), bfloat16 rounding is spelled out below.
uint16_t HalfBits(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

float HalfValue(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof h);
  return static_cast<float>(h);
}

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

float BFloat16Value(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// Round to nearest, ties to the even bfloat16 neighbour.
uint16_t BFloat16Bits(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const uint32_t bits = FloatBits(f);
  const uint32_t toward_zero = bits >> 16;
  const uint32_t dropped = bits & 0xffffu;
  const bool round_up =
      dropped > 0x8000u || (dropped == 0x8000u && (toward_zero & 1u) != 0);
  return static_cast<uint16_t>(toward_zero + (round_up ? 1 : 0));
}

bool IsHalfNaN(uint16_t bits) {
  return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;
}

bool IsBFloat16NaN(uint16_t bits) {
  return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0;
}

// Sums `srcs` (two-byte elements) with SumInto into a fresh buffer.
std::vector<uint16_t> Sum16(v1::DataType dtype,
                            const std::vector<std::vector<uint16_t>>& srcs) {
  std::vector<const void*> pointers;
  for (const auto& src : srcs) pointers.push_back(src.data());
  std::vector<uint16_t> dst(srcs[0].size());
  SumInto(dtype, dst.data(), pointers.data(), pointers.size(), dst.size());
  return dst;
}

uint16_t SumHalves(std::vector<uint16_t> values) {
  std::vector<std::vector<uint16_t>> srcs;
  for (uint16_t v : values) srcs.push_back({v});
  return Sum16(v1::DATA_TYPE_FLOAT16, srcs)[0];
}

uint16_t SumBFloat16s(std::vector<uint16_t> values) {
  std::vector<std::vector<uint16_t>> srcs;
  for (uint16_t v : values) srcs.push_back({v});
  return Sum16(v1::DATA_TYPE_BFLOAT16, srcs)[0];
}

// ---------------------------------------------------------------------------
// Every dtype, source count, length and aliasing, on data whose sums are exact.

const v1::DataType kAllTypes[] = {
    v1::DATA_TYPE_FLOAT32,  v1::DATA_TYPE_FLOAT64, v1::DATA_TYPE_FLOAT16,
    v1::DATA_TYPE_BFLOAT16, v1::DATA_TYPE_INT32,   v1::DATA_TYPE_INT64,
    v1::DATA_TYPE_UINT8,    v1::DATA_TYPE_INT8,    v1::DATA_TYPE_INT16};

// Writes `value` as one element of `dtype`: exactly for the floating types
// (callers keep values small enough), wrapped for the integer types.
void Encode(v1::DataType dtype, int64_t value, uint8_t* out) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32: {
      const float f = static_cast<float>(value);
      std::memcpy(out, &f, sizeof f);
      return;
    }
    case v1::DATA_TYPE_FLOAT64: {
      const double d = static_cast<double>(value);
      std::memcpy(out, &d, sizeof d);
      return;
    }
    case v1::DATA_TYPE_FLOAT16: {
      const uint16_t bits = HalfBits(static_cast<float>(value));
      std::memcpy(out, &bits, sizeof bits);
      return;
    }
    case v1::DATA_TYPE_BFLOAT16: {
      const uint16_t bits = BFloat16Bits(static_cast<float>(value));
      std::memcpy(out, &bits, sizeof bits);
      return;
    }
    default: {
      // Little-endian truncation is the two's complement wrap.
      const uint64_t wrapped = static_cast<uint64_t>(value);
      std::memcpy(out, &wrapped, ElementSize(dtype));
      return;
    }
  }
}

// Values whose sums over up to 8 sources are exact in `dtype`; integers span
// their whole range so that sums wrap.
int64_t RandomValue(v1::DataType dtype, std::mt19937_64& rng) {
  const uint64_t r = rng();
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
    case v1::DATA_TYPE_FLOAT64:
      return static_cast<int64_t>(r % 2001) - 1000;
    case v1::DATA_TYPE_FLOAT16:
      return static_cast<int64_t>(r % 129) - 64;  // |sum| <= 512 < 2^11.
    case v1::DATA_TYPE_BFLOAT16:
      return static_cast<int64_t>(r % 33) - 16;  // |sum| <= 128 < 2^8.
    case v1::DATA_TYPE_INT32:
      return static_cast<int32_t>(r);
    case v1::DATA_TYPE_INT64:
      return static_cast<int64_t>(r);
    case v1::DATA_TYPE_UINT8:
      return static_cast<uint8_t>(r);
    case v1::DATA_TYPE_INT8:
      return static_cast<int8_t>(r);
    case v1::DATA_TYPE_INT16:
      return static_cast<int16_t>(r);
    default:
      ADD_FAILURE() << "no values for dtype " << dtype;
      return 0;
  }
}

enum class Alias { kNone, kFirst, kLast };

std::string AliasName(Alias alias) {
  switch (alias) {
    case Alias::kNone:
      return "separate dst";
    case Alias::kFirst:
      return "dst == srcs[0]";
    case Alias::kLast:
      return "dst == srcs[last]";
  }
  return "?";
}

// Names the first element that differs, or the guard past the end.
::testing::AssertionResult SameBytes(const std::vector<uint8_t>& actual,
                                     const std::vector<uint8_t>& expected,
                                     size_t element_size) {
  for (size_t i = 0; i < expected.size(); ++i) {
    if (actual[i] != expected[i]) {
      return ::testing::AssertionFailure()
             << "element " << i / element_size << " of "
             << expected.size() / element_size << " (counting the guard)"
             << " differs at byte " << i % element_size;
    }
  }
  return ::testing::AssertionSuccess();
}

class SumIntoAllTypesTest : public ::testing::TestWithParam<v1::DataType> {};

TEST_P(SumIntoAllTypesTest, MatchesExactSumForEverySourceCountLengthAndAlias) {
  const v1::DataType dtype = GetParam();
  const size_t size = ElementSize(dtype);
  constexpr uint8_t kGuard = 0xa5;  // One element past the end of dst.
  std::mt19937_64 rng(dtype);
  for (size_t num_srcs : {1, 2, 3, 8}) {
    for (size_t count : {0, 1, 7, 1023, 1025, 100003}) {
      std::vector<std::vector<uint8_t>> srcs(
          num_srcs, std::vector<uint8_t>((count + 1) * size, kGuard));
      std::vector<uint8_t> expected((count + 1) * size, kGuard);
      for (size_t i = 0; i < count; ++i) {
        int64_t sum = 0;
        for (auto& src : srcs) {
          const int64_t value = RandomValue(dtype, rng);
          Encode(dtype, value, &src[i * size]);
          // Integers wrap in two's complement: add as unsigned.
          sum = static_cast<int64_t>(static_cast<uint64_t>(sum) +
                                     static_cast<uint64_t>(value));
        }
        Encode(dtype, sum, &expected[i * size]);
      }
      for (Alias alias : {Alias::kNone, Alias::kFirst, Alias::kLast}) {
        SCOPED_TRACE(::testing::Message()
                     << "num_srcs=" << num_srcs << " count=" << count << " "
                     << AliasName(alias));
        std::vector<std::vector<uint8_t>> inputs = srcs;
        std::vector<uint8_t> separate((count + 1) * size, kGuard);
        std::vector<uint8_t>& dst = alias == Alias::kNone    ? separate
                                    : alias == Alias::kFirst ? inputs.front()
                                                             : inputs.back();
        std::vector<const void*> pointers;
        for (const auto& input : inputs) pointers.push_back(input.data());
        SumInto(dtype, dst.data(), pointers.data(), num_srcs, count);
        EXPECT_TRUE(SameBytes(dst, expected, size));

        if (num_srcs != 2) continue;
        // gloo's reduce function: the same sums, the same aliasing.
        inputs = srcs;
        std::vector<uint8_t> pair_separate((count + 1) * size, kGuard);
        std::vector<uint8_t>& pair_dst = alias == Alias::kNone ? pair_separate
                                         : alias == Alias::kFirst
                                             ? inputs.front()
                                             : inputs.back();
        PairwiseSumFor(dtype)(pair_dst.data(), inputs[0].data(),
                              inputs[1].data(), count);
        EXPECT_TRUE(SameBytes(pair_dst, expected, size)) << "PairwiseSumFor";
      }
    }
  }
}

TEST_P(SumIntoAllTypesTest, PairwiseSumOfABufferWithItselfDoublesIt) {
  const v1::DataType dtype = GetParam();
  const size_t size = ElementSize(dtype);
  std::mt19937_64 rng(dtype);
  constexpr size_t kCount = 1025;
  std::vector<uint8_t> data(kCount * size);
  std::vector<uint8_t> expected(kCount * size);
  for (size_t i = 0; i < kCount; ++i) {
    const int64_t value = RandomValue(dtype, rng);
    Encode(dtype, value, &data[i * size]);
    Encode(dtype, static_cast<int64_t>(static_cast<uint64_t>(value) * 2),
           &expected[i * size]);
  }
  PairwiseSumFor(dtype)(data.data(), data.data(), data.data(), kCount);
  EXPECT_TRUE(SameBytes(data, expected, size));
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, SumIntoAllTypesTest, ::testing::ValuesIn(kAllTypes),
    [](const ::testing::TestParamInfo<v1::DataType>& info) {
      return v1::DataType_Name(info.param);
    });

TEST(ElementSizeTest, IsTheStorageSizeAndZeroForUnsupportedTypes) {
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_FLOAT32), 4u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_FLOAT64), 8u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_FLOAT16), 2u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_BFLOAT16), 2u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_INT32), 4u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_INT64), 8u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_UINT8), 1u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_INT8), 1u);
  EXPECT_EQ(ElementSize(v1::DATA_TYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(ElementSize(static_cast<v1::DataType>(99)), 0u);
}

TEST(PairwiseSumForTest, IsNullForUnsupportedTypes) {
  for (v1::DataType dtype : kAllTypes) {
    EXPECT_NE(PairwiseSumFor(dtype), nullptr) << v1::DataType_Name(dtype);
  }
  EXPECT_EQ(PairwiseSumFor(v1::DATA_TYPE_UNSPECIFIED), nullptr);
  EXPECT_EQ(PairwiseSumFor(static_cast<v1::DataType>(99)), nullptr);
}

// ---------------------------------------------------------------------------
// FLOAT16: sums in float32, one round to nearest-even.

constexpr uint16_t kHalfOne = 0x3c00;
constexpr uint16_t kHalfTwoToMinus11 = 0x1000;  // Half an ulp of 1.
constexpr uint16_t kHalfTwoToMinus12 = 0x0c00;
constexpr uint16_t kHalfMax = 0x7bff;  // 65504.
constexpr uint16_t kHalfInfinity = 0x7c00;
constexpr uint16_t kHalfNaN = 0x7e00;

TEST(Float16SumTest, RoundsTiesToEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: the even one is 1.
  EXPECT_EQ(SumHalves({kHalfOne, kHalfTwoToMinus11}), kHalfOne);
  // (1 + 2^-10) + 2^-11 is halfway to 1 + 2^-9, which is even.
  EXPECT_EQ(SumHalves({0x3c01, kHalfTwoToMinus11}), 0x3c02);
  // 1 + 3 * 2^-11: halfway between 0x3c01 and 0x3c02.
  EXPECT_EQ(SumHalves({kHalfOne, 0x1600}), 0x3c02);
  // Just above halfway rounds up.
  EXPECT_EQ(SumHalves({kHalfOne, 0x1001}), 0x3c01);
  // Negative numbers round symmetrically.
  EXPECT_EQ(SumHalves({0xbc00, 0x9000}), 0xbc00);
  EXPECT_EQ(SumHalves({0xbc01, 0x9000}), 0xbc02);
}

TEST(Float16SumTest, RoundsOnceAfterSummingAllSourcesInFloat32) {
  // Rounded after each step, 1 + 2^-11 + 2^-12 would stay 1; summed in
  // float32 it is past halfway and rounds up.
  EXPECT_EQ(SumHalves({kHalfOne, kHalfTwoToMinus11, kHalfTwoToMinus12}),
            0x3c01);
  // 2048 + 1 + 1: each step alone is a tie back to 2048.
  EXPECT_EQ(SumHalves({0x6800, kHalfOne, kHalfOne}), 0x6801);
  // 1 + 7 * 2^-11 = 1 + 3.5 * 2^-10, a tie between 3 and 4 ulps: 4.
  EXPECT_EQ(SumHalves({kHalfOne, kHalfTwoToMinus11, kHalfTwoToMinus11,
                       kHalfTwoToMinus11, kHalfTwoToMinus11, kHalfTwoToMinus11,
                       kHalfTwoToMinus11, kHalfTwoToMinus11}),
            0x3c04);
}

TEST(Float16SumTest, ManySmallGradientsAreNotLost) {
  // Eight trainers each contribute 1/4096 on top of a running value of 1:
  // per-step half rounding would return 1 for every element.
  constexpr size_t kCount = 5000;
  std::vector<std::vector<uint16_t>> srcs(
      8, std::vector<uint16_t>(kCount, 0x0c00));
  srcs[0].assign(kCount, kHalfOne);
  for (uint16_t bits : Sum16(v1::DATA_TYPE_FLOAT16, srcs)) {
    ASSERT_EQ(bits, HalfBits(1.0f + 7.0f / 4096.0f));
  }
  EXPECT_EQ(HalfBits(1.0f + 7.0f / 4096.0f), 0x3c02);
}

TEST(Float16SumTest, OverflowsToInfinityExactlyPastTheHalfwayPoint) {
  EXPECT_EQ(SumHalves({kHalfMax, 0x4800}), kHalfMax);       // 65504 + 8.
  EXPECT_EQ(SumHalves({kHalfMax, 0x4c00}), kHalfInfinity);  // 65504 + 16.
  EXPECT_EQ(SumHalves({kHalfMax, kHalfMax}), kHalfInfinity);
  EXPECT_EQ(SumHalves({0xfbff, 0xfbff}), 0xfc00);
  // Partial sums above the half range are fine if the total is in range.
  EXPECT_EQ(SumHalves({kHalfMax, kHalfMax, 0xfbff}), kHalfMax);
}

TEST(Float16SumTest, PropagatesInfinityAndNaN) {
  EXPECT_EQ(SumHalves({kHalfInfinity, kHalfOne}), kHalfInfinity);
  EXPECT_EQ(SumHalves({0xfc00, kHalfMax}), 0xfc00);
  EXPECT_TRUE(IsHalfNaN(SumHalves({kHalfInfinity, 0xfc00})));
  EXPECT_TRUE(IsHalfNaN(SumHalves({kHalfNaN, kHalfOne})));
  EXPECT_TRUE(IsHalfNaN(SumHalves({kHalfOne, 0xfe00})));
  EXPECT_TRUE(IsHalfNaN(SumHalves({kHalfOne, kHalfOne, 0x7c01})));
  EXPECT_TRUE(IsHalfNaN(SumHalves({kHalfInfinity, kHalfOne, 0xfc00})));
  EXPECT_TRUE(IsHalfNaN(SumHalves({0x7fff, kHalfOne})));
  EXPECT_TRUE(IsHalfNaN(SumHalves({kHalfOne, 0xffff, kHalfOne})));
}

TEST(Float16SumTest, HandlesSubnormalsAndSignedZeros) {
  EXPECT_EQ(SumHalves({0x0001, 0x0001}), 0x0002);  // 2^-24 + 2^-24.
  EXPECT_EQ(SumHalves({0x03ff, 0x0001}), 0x0400);  // Up to the least normal.
  EXPECT_EQ(SumHalves({0x0400, 0x8001}), 0x03ff);  // Down to a subnormal.
  EXPECT_EQ(SumHalves({0x0001, 0x8001}), 0x0000);
  EXPECT_EQ(SumHalves({0x8000, 0x8000}), 0x8000);  // -0 + -0 = -0.
  EXPECT_EQ(SumHalves({0x8000, 0x0000}), 0x0000);
  EXPECT_EQ(SumHalves({0x0155, 0x0155, 0x0155}), 0x03ff);
}

TEST(Float16SumTest, EveryHalfSurvivesAddingZero) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const std::vector<uint16_t> sum =
      Sum16(v1::DATA_TYPE_FLOAT16, {all, std::vector<uint16_t>(65536, 0)});
  for (size_t i = 0; i < all.size(); ++i) {
    if (IsHalfNaN(all[i])) {
      EXPECT_TRUE(IsHalfNaN(sum[i])) << std::hex << all[i];
    } else if (all[i] == 0x8000) {
      EXPECT_EQ(sum[i], 0x0000);
    } else {
      EXPECT_EQ(sum[i], all[i]) << std::hex << all[i];
    }
  }
}

// Random bit patterns (every class of value) against the compiler's own
// half conversions, for the pairwise and the block-wise kernels.
TEST(Float16SumTest, MatchesFloat32SumRoundedOnceOnRandomBitPatterns) {
  std::mt19937 rng(16);
  constexpr size_t kCount = 50000;
  for (size_t num_srcs : {2, 3, 8}) {
    std::vector<std::vector<uint16_t>> srcs(num_srcs,
                                            std::vector<uint16_t>(kCount));
    for (auto& src : srcs) {
      for (auto& bits : src) bits = static_cast<uint16_t>(rng());
    }
    const std::vector<uint16_t> sum = Sum16(v1::DATA_TYPE_FLOAT16, srcs);
    for (size_t i = 0; i < kCount; ++i) {
      float expected = HalfValue(srcs[0][i]);
      for (size_t k = 1; k < num_srcs; ++k) expected += HalfValue(srcs[k][i]);
      if (std::isnan(expected)) {
        ASSERT_TRUE(IsHalfNaN(sum[i])) << i;
      } else {
        ASSERT_EQ(sum[i], HalfBits(expected))
            << "num_srcs=" << num_srcs << " i=" << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// BFLOAT16: the same rules with an 8-bit significand.

constexpr uint16_t kBFloatOne = 0x3f80;
constexpr uint16_t kBFloatTwoToMinus8 = 0x3b80;  // Half an ulp of 1.
constexpr uint16_t kBFloatMax = 0x7f7f;
constexpr uint16_t kBFloatInfinity = 0x7f80;

TEST(BFloat16SumTest, RoundsTiesToEven) {
  EXPECT_EQ(SumBFloat16s({kBFloatOne, kBFloatTwoToMinus8}), kBFloatOne);
  EXPECT_EQ(SumBFloat16s({0x3f81, kBFloatTwoToMinus8}), 0x3f82);
  EXPECT_EQ(SumBFloat16s({kBFloatOne, 0x3c40}), 0x3f82);  // 1 + 3 * 2^-8.
  EXPECT_EQ(SumBFloat16s({kBFloatOne, 0x3b81}), 0x3f81);
  EXPECT_EQ(SumBFloat16s({0xbf80, 0xbb80}), 0xbf80);
}

TEST(BFloat16SumTest, RoundsOnceAfterSummingAllSourcesInFloat32) {
  // 1 + 2^-8 + 2^-9 is past halfway only when summed before rounding.
  EXPECT_EQ(SumBFloat16s({kBFloatOne, kBFloatTwoToMinus8, 0x3b00}), 0x3f81);
  // 256 + 1 + 1.
  EXPECT_EQ(SumBFloat16s({0x4380, kBFloatOne, kBFloatOne}), 0x4381);
}

TEST(BFloat16SumTest, OverflowsToInfinityAndPropagatesNaN) {
  EXPECT_EQ(SumBFloat16s({kBFloatMax, 0x7a80}), kBFloatMax);       // + 1/4 ulp.
  EXPECT_EQ(SumBFloat16s({kBFloatMax, 0x7b00}), kBFloatInfinity);  // Tie.
  EXPECT_EQ(SumBFloat16s({kBFloatMax, kBFloatMax}), kBFloatInfinity);
  EXPECT_EQ(SumBFloat16s({0xff7f, 0xff7f}), 0xff80);
  EXPECT_EQ(SumBFloat16s({kBFloatInfinity, kBFloatOne}), kBFloatInfinity);
  EXPECT_TRUE(IsBFloat16NaN(SumBFloat16s({kBFloatInfinity, 0xff80})));
  EXPECT_TRUE(IsBFloat16NaN(SumBFloat16s({0x7fc0, kBFloatOne})));
  EXPECT_TRUE(IsBFloat16NaN(SumBFloat16s({kBFloatOne, kBFloatOne, 0xff81})));
  // Every payload bit set: rounding must not carry out of the NaN.
  EXPECT_TRUE(IsBFloat16NaN(SumBFloat16s({0x7fff, kBFloatOne})));
  EXPECT_TRUE(IsBFloat16NaN(SumBFloat16s({kBFloatOne, 0xffff, kBFloatOne})));
}

TEST(BFloat16SumTest, HandlesSubnormalsAndSignedZeros) {
  EXPECT_EQ(SumBFloat16s({0x0001, 0x0001}), 0x0002);  // 2^-133 + 2^-133.
  EXPECT_EQ(SumBFloat16s({0x007f, 0x0001}), 0x0080);  // The least normal.
  EXPECT_EQ(SumBFloat16s({0x0080, 0x8001}), 0x007f);
  EXPECT_EQ(SumBFloat16s({0x8000, 0x8000}), 0x8000);
  EXPECT_EQ(SumBFloat16s({0x8000, 0x0000}), 0x0000);
}

TEST(BFloat16SumTest, MatchesFloat32SumRoundedOnceOnRandomBitPatterns) {
  std::mt19937 rng(17);
  constexpr size_t kCount = 50000;
  for (size_t num_srcs : {2, 3, 8}) {
    std::vector<std::vector<uint16_t>> srcs(num_srcs,
                                            std::vector<uint16_t>(kCount));
    for (auto& src : srcs) {
      for (auto& bits : src) bits = static_cast<uint16_t>(rng());
    }
    const std::vector<uint16_t> sum = Sum16(v1::DATA_TYPE_BFLOAT16, srcs);
    for (size_t i = 0; i < kCount; ++i) {
      float expected = BFloat16Value(srcs[0][i]);
      for (size_t k = 1; k < num_srcs; ++k) {
        expected += BFloat16Value(srcs[k][i]);
      }
      if (std::isnan(expected)) {
        ASSERT_TRUE(IsBFloat16NaN(sum[i])) << i;
      } else {
        ASSERT_EQ(sum[i], BFloat16Bits(expected))
            << "num_srcs=" << num_srcs << " i=" << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Integers wrap.

TEST(IntegerSumTest, WrapsOnOverflowLikeTwosComplement) {
  const int32_t int32s[] = {std::numeric_limits<int32_t>::max(), 1};
  int32_t int32_sum = 0;
  const void* int32_srcs[] = {&int32s[0], &int32s[1]};
  SumInto(v1::DATA_TYPE_INT32, &int32_sum, int32_srcs, 2, 1);
  EXPECT_EQ(int32_sum, std::numeric_limits<int32_t>::min());

  const int64_t int64s[] = {std::numeric_limits<int64_t>::min(), -1, -1};
  int64_t int64_sum = 0;
  const void* int64_srcs[] = {&int64s[0], &int64s[1], &int64s[2]};
  SumInto(v1::DATA_TYPE_INT64, &int64_sum, int64_srcs, 3, 1);
  EXPECT_EQ(int64_sum, std::numeric_limits<int64_t>::max() - 1);

  std::vector<int8_t> int8s = {127, -128, 100};
  const std::vector<int8_t> ones = {1, -1, 100};
  PairwiseSumFor(v1::DATA_TYPE_INT8)(int8s.data(), int8s.data(), ones.data(),
                                     int8s.size());
  EXPECT_THAT(int8s, ElementsAre(-128, 127, -56));

  std::vector<uint8_t> uint8s = {255, 200, 3};
  const std::vector<uint8_t> more = {1, 100, 4};
  PairwiseSumFor(v1::DATA_TYPE_UINT8)(uint8s.data(), uint8s.data(), more.data(),
                                      uint8s.size());
  EXPECT_THAT(uint8s, ElementsAre(0, 44, 7));
}

// ---------------------------------------------------------------------------
// DivideInPlace: averages.

TEST(DivideInPlaceTest, IntegersTruncateTowardZero) {
  std::vector<int32_t> int32s = {7,
                                 -7,
                                 -1,
                                 1,
                                 std::numeric_limits<int32_t>::min(),
                                 std::numeric_limits<int32_t>::max()};
  DivideInPlace(v1::DATA_TYPE_INT32, int32s.data(), int32s.size(), 2);
  EXPECT_THAT(int32s, ElementsAre(3, -3, 0, 0, -1073741824, 1073741823));

  std::vector<int64_t> int64s = {7, -7, -5,
                                 std::numeric_limits<int64_t>::min()};
  DivideInPlace(v1::DATA_TYPE_INT64, int64s.data(), int64s.size(), 3);
  EXPECT_THAT(int64s, ElementsAre(2, -2, -1, -3074457345618258602));

  std::vector<int8_t> int8s = {-128, 127, -5, 5};
  DivideInPlace(v1::DATA_TYPE_INT8, int8s.data(), int8s.size(), 3);
  EXPECT_THAT(int8s, ElementsAre(-42, 42, -1, 1));

  std::vector<uint8_t> uint8s = {255, 5, 1};
  DivideInPlace(v1::DATA_TYPE_UINT8, uint8s.data(), uint8s.size(), 2);
  EXPECT_THAT(uint8s, ElementsAre(127, 2, 0));
}

TEST(DivideInPlaceTest, IntegersMatchCppDivisionForEveryDivisorSize) {
  std::mt19937_64 rng(5);
  const int64_t divisors[] = {2,
                              3,
                              7,
                              8,
                              255,
                              256,
                              1000003,
                              2147483647,
                              2147483648,
                              int64_t{1} << 40,
                              9223372036854775807};
  for (int64_t divisor : divisors) {
    SCOPED_TRACE(divisor);
    std::vector<int32_t> int32s(4096);
    for (auto& x : int32s) x = static_cast<int32_t>(rng());
    int32s[0] = std::numeric_limits<int32_t>::min();
    int32s[1] = std::numeric_limits<int32_t>::max();
    std::vector<int32_t> expected32;
    for (int32_t x : int32s)
      expected32.push_back(static_cast<int32_t>(x / divisor));
    DivideInPlace(v1::DATA_TYPE_INT32, int32s.data(), int32s.size(), divisor);
    EXPECT_THAT(int32s, ElementsAreArray(expected32));

    std::vector<int64_t> int64s(4096);
    for (auto& x : int64s) x = static_cast<int64_t>(rng());
    std::vector<int64_t> expected64;
    for (int64_t x : int64s) expected64.push_back(x / divisor);
    DivideInPlace(v1::DATA_TYPE_INT64, int64s.data(), int64s.size(), divisor);
    EXPECT_THAT(int64s, ElementsAreArray(expected64));

    std::vector<int8_t> int8s(256);
    std::vector<uint8_t> uint8s(256);
    std::vector<int8_t> expected8;
    std::vector<uint8_t> expected_u8;
    for (int i = 0; i < 256; ++i) {
      int8s[i] = static_cast<int8_t>(i);
      uint8s[i] = static_cast<uint8_t>(i);
      expected8.push_back(static_cast<int8_t>(int8s[i] / divisor));
      expected_u8.push_back(static_cast<uint8_t>(uint8s[i] / divisor));
    }
    DivideInPlace(v1::DATA_TYPE_INT8, int8s.data(), int8s.size(), divisor);
    DivideInPlace(v1::DATA_TYPE_UINT8, uint8s.data(), uint8s.size(), divisor);
    EXPECT_THAT(int8s, ElementsAreArray(expected8));
    EXPECT_THAT(uint8s, ElementsAreArray(expected_u8));
  }
}

TEST(DivideInPlaceTest, FloatsDivideInTheirOwnPrecision) {
  std::vector<float> floats = {1.0f, 3.0f, -2.0f, 1e-40f, INFINITY};
  DivideInPlace(v1::DATA_TYPE_FLOAT32, floats.data(), floats.size(), 3);
  EXPECT_THAT(floats, ElementsAre(1.0f / 3.0f, 1.0f, -2.0f / 3.0f,
                                  1e-40f / 3.0f, INFINITY));

  std::vector<double> doubles = {1.0, -10.0};
  DivideInPlace(v1::DATA_TYPE_FLOAT64, doubles.data(), doubles.size(), 3);
  EXPECT_THAT(doubles, ElementsAre(1.0 / 3.0, -10.0 / 3.0));

  std::vector<float> nan = {NAN};
  DivideInPlace(v1::DATA_TYPE_FLOAT32, nan.data(), 1, 4);
  EXPECT_TRUE(std::isnan(nan[0]));
}

TEST(DivideInPlaceTest, EveryFloat16IsDividedInFloat32AndRoundedOnce) {
  for (int64_t divisor : {2, 3, 8, 1000}) {
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    DivideInPlace(v1::DATA_TYPE_FLOAT16, all.data(), all.size(), divisor);
    for (size_t i = 0; i < all.size(); ++i) {
      const uint16_t in = static_cast<uint16_t>(i);
      if (IsHalfNaN(in)) {
        ASSERT_TRUE(IsHalfNaN(all[i]));
      } else {
        ASSERT_EQ(all[i], HalfBits(HalfValue(in) / static_cast<float>(divisor)))
            << std::hex << in << " / " << std::dec << divisor;
      }
    }
  }
}

TEST(DivideInPlaceTest, EveryBFloat16IsDividedInFloat32AndRoundedOnce) {
  for (int64_t divisor : {2, 3, 8, 1000}) {
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    DivideInPlace(v1::DATA_TYPE_BFLOAT16, all.data(), all.size(), divisor);
    for (size_t i = 0; i < all.size(); ++i) {
      const uint16_t in = static_cast<uint16_t>(i);
      if (IsBFloat16NaN(in)) {
        ASSERT_TRUE(IsBFloat16NaN(all[i]));
      } else {
        ASSERT_EQ(all[i],
                  BFloat16Bits(BFloat16Value(in) / static_cast<float>(divisor)))
            << std::hex << in << " / " << std::dec << divisor;
      }
    }
  }
}

TEST(DivideInPlaceTest, AveragesHalvesOverTrainers) {
  // Three trainers; each column is one element.
  std::vector<uint16_t> sum =
      Sum16(v1::DATA_TYPE_FLOAT16, {{kHalfOne, 0x4200, 0x0003, kHalfOne},
                                    {0x3800, 0x0000, 0x0000, 0x0000},
                                    {0x0000, 0x0000, 0x0000, 0x0000}});
  DivideInPlace(v1::DATA_TYPE_FLOAT16, sum.data(), sum.size(), 3);
  // 1.5 / 3, 3 / 3, 3 * 2^-24 / 3, and 1 / 3 rounded to 0.333251953125.
  EXPECT_THAT(sum, ElementsAre(0x3800, 0x3c00, 0x0001, 0x3555));

  std::vector<uint16_t> halves = {0x0003, 0x0001, 0x4200};
  DivideInPlace(v1::DATA_TYPE_FLOAT16, halves.data(), halves.size(), 2);
  EXPECT_THAT(halves, ElementsAre(0x0002, 0x0000, 0x3e00));  // Ties to even.

  std::vector<uint16_t> bfloats = {0x4040, kBFloatOne};  // 3, 1.
  DivideInPlace(v1::DATA_TYPE_BFLOAT16, bfloats.data(), bfloats.size(), 2);
  EXPECT_THAT(bfloats, ElementsAre(0x3fc0, 0x3f00));
}

TEST(DivideInPlaceTest, DivisorOneLeavesEveryBitUnchanged) {
  std::vector<uint16_t> halves = {0x7c01, 0x8000, 0x0001};
  DivideInPlace(v1::DATA_TYPE_FLOAT16, halves.data(), halves.size(), 1);
  EXPECT_THAT(halves, ElementsAre(0x7c01, 0x8000, 0x0001));
}

TEST(ReduceDeathTest, RejectsNonPositiveDivisorAndUnsupportedTypes) {
  float data = 1.0f;
  EXPECT_DEATH(DivideInPlace(v1::DATA_TYPE_FLOAT32, &data, 1, 0),
               "divisor must be positive");
  const void* srcs[] = {&data, &data};
  EXPECT_DEATH(SumInto(v1::DATA_TYPE_UNSPECIFIED, &data, srcs, 2, 1),
               "unsupported dtype");
}

// The reduce ops other than the sum: every source read before dst is
// written (dst may be a source), signed integers compared as signed,
// products wrapping, FLOAT16 through float32, NaN winning MIN and MAX.
TEST(ReduceIntoTest, MinMaxProductOfSignedIntegersAcrossThreeSources) {
  std::vector<int8_t> a = {-3, 5, 100, 0};
  const std::vector<int8_t> b = {2, -7, 2, 9};
  const std::vector<int8_t> c = {1, 1, 2, -9};
  const void* srcs[] = {a.data(), b.data(), c.data()};
  std::vector<int8_t> out(4);
  ReduceInto(v1::REDUCE_OP_MIN, v1::DATA_TYPE_INT8, out.data(), srcs, 3, 4);
  EXPECT_THAT(out, ElementsAre(-3, -7, 2, -9));
  ReduceInto(v1::REDUCE_OP_MAX, v1::DATA_TYPE_INT8, out.data(), srcs, 3, 4);
  EXPECT_THAT(out, ElementsAre(2, 5, 100, 9));
  // 100 * 2 * 2 = 400 wraps to -112, as torch's int8 product does.
  ReduceInto(v1::REDUCE_OP_PRODUCT, v1::DATA_TYPE_INT8, a.data(), srcs, 3, 4);
  EXPECT_THAT(a, ElementsAre(-6, -35, -112, 0));
}

TEST(ReduceIntoTest, BitwiseOpsOnIntegersOnly) {
  const std::vector<int64_t> a = {0b1100, -1, 0};
  const std::vector<int64_t> b = {0b1010, 5, 7};
  const void* srcs[] = {a.data(), b.data()};
  std::vector<int64_t> out(3);
  ReduceInto(v1::REDUCE_OP_BAND, v1::DATA_TYPE_INT64, out.data(), srcs, 2, 3);
  EXPECT_THAT(out, ElementsAre(0b1000, 5, 0));
  ReduceInto(v1::REDUCE_OP_BOR, v1::DATA_TYPE_INT64, out.data(), srcs, 2, 3);
  EXPECT_THAT(out, ElementsAre(0b1110, -1, 7));
  PairwiseSum bxor = PairwiseFor(v1::REDUCE_OP_BXOR, v1::DATA_TYPE_INT64);
  ASSERT_NE(bxor, nullptr);
  bxor(out.data(), a.data(), b.data(), 3);
  EXPECT_THAT(out, ElementsAre(0b0110, ~int64_t{5}, 7));
  for (v1::DataType dtype : {v1::DATA_TYPE_FLOAT32, v1::DATA_TYPE_FLOAT64,
                             v1::DATA_TYPE_FLOAT16, v1::DATA_TYPE_BFLOAT16}) {
    for (v1::ReduceOp op :
         {v1::REDUCE_OP_BAND, v1::REDUCE_OP_BOR, v1::REDUCE_OP_BXOR}) {
      EXPECT_FALSE(ReduceOpApplies(op, dtype)) << ReduceOpName(op) << dtype;
      EXPECT_EQ(PairwiseFor(op, dtype), nullptr);
    }
    for (v1::ReduceOp op : {v1::REDUCE_OP_SUM, v1::REDUCE_OP_MIN,
                            v1::REDUCE_OP_MAX, v1::REDUCE_OP_PRODUCT}) {
      EXPECT_TRUE(ReduceOpApplies(op, dtype)) << ReduceOpName(op) << dtype;
    }
  }
  EXPECT_FALSE(ReduceOpApplies(v1::REDUCE_OP_MIN, v1::DATA_TYPE_UNSPECIFIED));
  EXPECT_FALSE(
      ReduceOpApplies(static_cast<v1::ReduceOp>(42), v1::DATA_TYPE_INT32));
}

TEST(ReduceIntoTest, NaNWinsMinAndMaxWhereverItIs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> a = {nan, 1.0f, -0.5f};
  const std::vector<float> b = {2.0f, nan, -1.5f};
  for (v1::ReduceOp op : {v1::REDUCE_OP_MIN, v1::REDUCE_OP_MAX}) {
    PairwiseSum pair = PairwiseFor(op, v1::DATA_TYPE_FLOAT32);
    ASSERT_NE(pair, nullptr);
    std::vector<float> out(3);
    pair(out.data(), a.data(), b.data(), 3);
    EXPECT_TRUE(std::isnan(out[0])) << ReduceOpName(op);
    EXPECT_TRUE(std::isnan(out[1])) << ReduceOpName(op);
    EXPECT_EQ(out[2], op == v1::REDUCE_OP_MIN ? -1.5f : -0.5f);
  }
}

TEST(ReduceIntoTest, HalvesAreCombinedInFloat32AndRoundedOnce) {
  // 1.5 * 1.5 * 1.5 = 3.375, exact in half; max of halves compares values.
  std::vector<uint16_t> a = {HalfBits(1.5f), HalfBits(-2.0f)};
  const std::vector<uint16_t> b = {HalfBits(1.5f), HalfBits(0.25f)};
  const std::vector<uint16_t> c = {HalfBits(1.5f), HalfBits(-8.0f)};
  const void* srcs[] = {a.data(), b.data(), c.data()};
  std::vector<uint16_t> out(2);
  ReduceInto(v1::REDUCE_OP_PRODUCT, v1::DATA_TYPE_FLOAT16, out.data(), srcs, 3,
             2);
  EXPECT_EQ(HalfValue(out[0]), 3.375f);
  EXPECT_EQ(HalfValue(out[1]), 4.0f);
  ReduceInto(v1::REDUCE_OP_MAX, v1::DATA_TYPE_FLOAT16, a.data(), srcs, 3, 2);
  EXPECT_EQ(HalfValue(a[0]), 1.5f);
  EXPECT_EQ(HalfValue(a[1]), 0.25f);
}

// ReduceOpApplies (reduce_op.h, no kernels) says exactly where kernels
// exist.
TEST(ReduceIntoTest, ReduceOpAppliesWhereKernelsExist) {
  for (int op = -1; op <= 7; ++op) {
    for (int dtype = 0; dtype <= 9; ++dtype) {
      const auto o = static_cast<v1::ReduceOp>(op);
      const auto d = static_cast<v1::DataType>(dtype);
      EXPECT_EQ(ReduceOpApplies(o, d), PairwiseFor(o, d) != nullptr)
          << "op " << op << " dtype " << dtype;
    }
  }
}

TEST(ReduceDeathTest, ABitwiseOpOnFloatsIsRefused) {
  float data = 1.0f;
  const void* srcs[] = {&data, &data};
  EXPECT_DEATH(
      ReduceInto(v1::REDUCE_OP_BAND, v1::DATA_TYPE_FLOAT32, &data, srcs, 2, 1),
      "band does not apply");
}

}  // namespace
}  // namespace baton::agent
