#include "agent/reduce.h"

#include <glog/logging.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace baton::agent {
namespace {

// Every entry kernel is compiled three times, for baseline x86-64, AVX2 and
// AVX-512 (x86-64-v4), and the dynamic loader picks one per machine (GCC
// function multiversioning), so one binary runs on every Kubernetes node and
// uses the widest vectors it has. The helpers they call are forced inline so
// that each clone compiles them for its own instruction set. Measured with
// the buffers in cache (where the arithmetic, not memory, is the limit):
// AVX2 sums BFLOAT16 2.3x and float32 in place 1.8x faster than baseline,
// and AVX-512 doubles BFLOAT16 again; from memory the gains are smaller.
// ThreadSanitizer instruments the ifunc resolvers target_clones generates,
// and the dynamic loader runs them before TSan is initialized (a crash at
// start): TSan builds use the baseline kernels only.
#if defined(__SANITIZE_THREAD__)
#define BATON_REDUCE_KERNEL
#else
#define BATON_REDUCE_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#define BATON_REDUCE_INLINE inline __attribute__((always_inline))

// Sums of three or more sources go block by block through an accumulator of
// this many bytes on the stack: small enough to stay in L1 while every source
// streams through it once, and the one place a narrow type is rounded.
constexpr size_t kBlockBytes = 8192;

BATON_REDUCE_INLINE uint32_t BitsOf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

BATON_REDUCE_INLINE float FloatWithBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// cond ? if_true : if_false, as a mask. GCC's vectorizer gives up on a
// ternary whose arm holds a float operation it treats as possibly trapping
// (-ftrapping-math, the default), after sinking that operation into the arm;
// a mask keeps every lane's work unconditional.
BATON_REDUCE_INLINE uint32_t Select(bool cond, uint32_t if_true,
                                    uint32_t if_false) {
  const uint32_t mask = 0u - uint32_t{cond};
  return (if_true & mask) | (if_false & ~mask);
}

// IEEE binary16 to binary32; exact for every input, including subnormals,
// infinities and NaN payloads. Branch-free so that loops over it vectorize.
BATON_REDUCE_INLINE float HalfToFloat(uint16_t half) {
  constexpr uint32_t kExponentMask = 0x7c00u << 13;  // In binary32 position.
  constexpr uint32_t kTwoToMinus14 = 113u << 23;
  const uint32_t magnitude = (half & 0x7fffu) << 13;
  const uint32_t exponent = magnitude & kExponentMask;
  const uint32_t normal = magnitude + ((127u - 15u) << 23);
  const uint32_t inf_or_nan = magnitude + ((255u - 31u) << 23);
  // A subnormal m * 2^-24 is (2^-14 + m * 2^-24) - 2^-14: exact, and it needs
  // no binary32 subnormals, so flush-to-zero modes cannot change it.
  const uint32_t subnormal = BitsOf(FloatWithBits(magnitude + kTwoToMinus14) -
                                    FloatWithBits(kTwoToMinus14));
  const uint32_t bits = Select(exponent == kExponentMask, inf_or_nan,
                               Select(exponent == 0, subnormal, normal));
  return FloatWithBits(bits | (uint32_t{half & 0x8000u} << 16));
}

// binary32 to binary16, rounding to nearest-even; overflow gives infinity and
// NaN stays NaN (quieted, payload truncated, as the F16C instruction does).
BATON_REDUCE_INLINE uint16_t FloatToHalf(float f) {
  constexpr uint32_t kOverflow = (127u + 16u) << 23;  // 2^16; 65520 rounds up.
  constexpr uint32_t kMinNormal = 113u << 23;         // 2^-14.
  constexpr uint32_t kInfinity = 0x7f800000u;
  // Adding 0.5 leaves the bits of a number below 2^-14 rounded (by the FPU,
  // to nearest-even) to a multiple of 2^-24: the half subnormal mantissa.
  constexpr uint32_t kHalfBits = 126u << 23;
  const uint32_t bits = BitsOf(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  const uint32_t subnormal =
      BitsOf(FloatWithBits(magnitude) + FloatWithBits(kHalfBits)) - kHalfBits;
  // Rebias the exponent and round on the 13 dropped bits; a carry out of the
  // mantissa correctly bumps the exponent, up to infinity.
  const uint32_t normal =
      (magnitude - ((127u - 15u) << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >>
      13;
  const uint32_t inf_or_nan = Select(
      magnitude > kInfinity, 0x7e00u | ((magnitude >> 13) & 0x3ffu), 0x7c00u);
  const uint32_t result =
      Select(magnitude >= kOverflow, inf_or_nan,
             Select(magnitude < kMinNormal, subnormal, normal));
  return static_cast<uint16_t>(result | sign);
}

BATON_REDUCE_INLINE float BFloat16ToFloat(uint16_t bfloat) {
  return FloatWithBits(uint32_t{bfloat} << 16);
}

// binary32 to bfloat16, rounding to nearest-even; overflow gives infinity.
// Only for results of float32 arithmetic on widened bfloat16 values: their
// NaNs are quiet and have zero low 16 bits (x86 keeps an operand's payload or
// makes the default NaN), so the rounding carry cannot turn them into
// infinity or flip the sign. A check for other NaNs would cost a third of the
// BFLOAT16 kernels' speed.
BATON_REDUCE_INLINE uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = BitsOf(f);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// How a dtype is stored and summed: elements are widened to Compute, summed
// there, and narrowed back to Storage once. Signed integers are summed as
// their unsigned counterparts, which wrap without undefined behaviour and give
// the same bits.
template <typename T>
struct Native {
  using Storage = T;
  using Compute = T;
  static BATON_REDUCE_INLINE T Widen(T x) { return x; }
  static BATON_REDUCE_INLINE T Narrow(T x) { return x; }
};

struct Float16 {
  using Storage = uint16_t;
  using Compute = float;
  static BATON_REDUCE_INLINE float Widen(uint16_t x) { return HalfToFloat(x); }
  static BATON_REDUCE_INLINE uint16_t Narrow(float x) { return FloatToHalf(x); }
};

struct BFloat16 {
  using Storage = uint16_t;
  using Compute = float;
  static BATON_REDUCE_INLINE float Widen(uint16_t x) {
    return BFloat16ToFloat(x);
  }
  static BATON_REDUCE_INLINE uint16_t Narrow(float x) {
    return FloatToBFloat16(x);
  }
};

// The cast returns uint8_t sums, promoted to int by C++, to their wrapped
// value.
template <typename T>
BATON_REDUCE_INLINE T Add(T a, T b) {
  return static_cast<T>(a + b);
}

// dst = a + b over distinct arrays.
template <typename C>
BATON_REDUCE_INLINE void AddArrays(typename C::Storage* __restrict dst,
                                   const typename C::Storage* __restrict a,
                                   const typename C::Storage* __restrict b,
                                   size_t count) {
  for (size_t i = 0; i < count; ++i) {
    dst[i] = C::Narrow(Add(C::Widen(a[i]), C::Widen(b[i])));
  }
}

// dst += src. Addition commutes for every element type, so this also serves
// dst = src + dst.
template <typename C>
BATON_REDUCE_INLINE void AddArrayInto(typename C::Storage* __restrict dst,
                                      const typename C::Storage* __restrict src,
                                      size_t count) {
  for (size_t i = 0; i < count; ++i) {
    dst[i] = C::Narrow(Add(C::Widen(dst[i]), C::Widen(src[i])));
  }
}

// data += data.
template <typename C>
BATON_REDUCE_INLINE void DoubleArray(typename C::Storage* data, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const typename C::Compute x = C::Widen(data[i]);
    data[i] = C::Narrow(Add(x, x));
  }
}

// acc = a + b, widened.
template <typename C>
BATON_REDUCE_INLINE void WidenSum(typename C::Compute* __restrict acc,
                                  const typename C::Storage* __restrict a,
                                  const typename C::Storage* __restrict b,
                                  size_t count) {
  for (size_t i = 0; i < count; ++i) {
    acc[i] = Add(C::Widen(a[i]), C::Widen(b[i]));
  }
}

// acc = (acc + a) + b: two sources per pass over the accumulator, in order.
template <typename C>
BATON_REDUCE_INLINE void Accumulate2(typename C::Compute* __restrict acc,
                                     const typename C::Storage* __restrict a,
                                     const typename C::Storage* __restrict b,
                                     size_t count) {
  for (size_t i = 0; i < count; ++i) {
    acc[i] = Add(Add(acc[i], C::Widen(a[i])), C::Widen(b[i]));
  }
}

template <typename C>
BATON_REDUCE_INLINE void Accumulate(typename C::Compute* __restrict acc,
                                    const typename C::Storage* __restrict src,
                                    size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] = Add(acc[i], C::Widen(src[i]));
}

template <typename C>
BATON_REDUCE_INLINE void NarrowStore(typename C::Storage* __restrict dst,
                                     const typename C::Compute* __restrict acc,
                                     size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = C::Narrow(acc[i]);
}

// PairwiseSum for codec C. The aliasing cases get kernels of their own so
// that every loop's pointers really are distinct.
template <typename C>
BATON_REDUCE_KERNEL void SumPair(void* dst, const void* a, const void* b,
                                 size_t count) {
  using Storage = typename C::Storage;
  auto* d = static_cast<Storage*>(dst);
  const auto* x = static_cast<const Storage*>(a);
  const auto* y = static_cast<const Storage*>(b);
  if (d == x && d == y) {
    DoubleArray<C>(d, count);
  } else if (d == x) {
    AddArrayInto<C>(d, y, count);
  } else if (d == y) {
    AddArrayInto<C>(d, x, count);
  } else {
    AddArrays<C>(d, x, y, count);
  }
}

// SumInto for codec C and num_srcs >= 3. Each block of dst is written only
// after every source's block was read, so dst may alias any source.
template <typename C>
BATON_REDUCE_KERNEL void SumMany(void* dst, const void* const* srcs,
                                 size_t num_srcs, size_t count) {
  using Storage = typename C::Storage;
  using Compute = typename C::Compute;
  constexpr size_t kBlock = kBlockBytes / sizeof(Compute);
  Compute acc[kBlock];
  auto src = [srcs](size_t k) { return static_cast<const Storage*>(srcs[k]); };
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    WidenSum<C>(acc, src(0) + begin, src(1) + begin, n);
    size_t k = 2;
    for (; k + 1 < num_srcs; k += 2) {
      Accumulate2<C>(acc, src(k) + begin, src(k + 1) + begin, n);
    }
    if (k < num_srcs) Accumulate<C>(acc, src(k) + begin, n);
    NarrowStore<C>(static_cast<Storage*>(dst) + begin, acc, n);
  }
}

template <typename C>
void Sum(void* dst, const void* const* srcs, size_t num_srcs, size_t count) {
  if (num_srcs == 2) {
    SumPair<C>(dst, srcs[0], srcs[1], count);
  } else {
    SumMany<C>(dst, srcs, num_srcs, count);
  }
}

// Floating types, FLOAT16/BFLOAT16 through float32 with one rounding.
template <typename C>
BATON_REDUCE_KERNEL void DivideFloating(void* data, size_t count,
                                        typename C::Compute divisor) {
  auto* __restrict d = static_cast<typename C::Storage*>(data);
  for (size_t i = 0; i < count; ++i) d[i] = C::Narrow(C::Widen(d[i]) / divisor);
}

// Integers of b < p bits, divided in a floating type with a p-bit
// significand (int32 in double, 8-bit in float): the rounded quotient is
// within 2^(b-p) / divisor of the exact one, and a non-integer quotient is at
// least 1 / divisor from the nearest integer, so truncating it is exact; and
// unlike integer division it vectorizes.
template <typename T, typename Wide>
BATON_REDUCE_KERNEL void DivideSmallInteger(void* data, size_t count,
                                            Wide divisor) {
  auto* __restrict d = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) {
    d[i] = static_cast<T>(static_cast<Wide>(d[i]) / divisor);
  }
}

// x86 has no vector integer division; INT64 averages are rare enough that
// the scalar instruction will do.
void DivideInt64(void* data, size_t count, int64_t divisor) {
  auto* __restrict d = static_cast<int64_t*>(data);
  for (size_t i = 0; i < count; ++i) d[i] /= divisor;
}

// FLOAT16 with the F16C conversion instructions, 8 elements per instruction:
// the software conversions above cost about 13 instructions per element,
// which made a two-source FLOAT16 sum several times slower than memory (see
// agent/bench/local_reduce.cc). Same results: both round to nearest-even and
// quiet NaNs the same way. Compiled for AVX + F16C (every x86-64 server CPU
// since 2012); UseF16C() decides at run time.
#define BATON_REDUCE_F16C __attribute__((target("avx,f16c")))

BATON_REDUCE_F16C BATON_REDUCE_INLINE __m256 LoadHalves(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

BATON_REDUCE_F16C BATON_REDUCE_INLINE void StoreHalves(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// The last count % 8 elements go through an 8-element buffer.
BATON_REDUCE_F16C BATON_REDUCE_INLINE __m256
LoadHalvesPartial(const uint16_t* p, size_t n) {
  uint16_t buffer[8] = {};
  std::memcpy(buffer, p, n * sizeof *p);
  return LoadHalves(buffer);
}

BATON_REDUCE_F16C BATON_REDUCE_INLINE void StoreHalvesPartial(uint16_t* p,
                                                              __m256 v,
                                                              size_t n) {
  uint16_t buffer[8];
  StoreHalves(buffer, v);
  std::memcpy(p, buffer, n * sizeof *p);
}

// Every vector of dst is stored after all of its sources were loaded, so dst
// may alias any source.
BATON_REDUCE_F16C void SumPairF16C(void* dst, const void* a, const void* b,
                                   size_t count) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    StoreHalves(d + i, _mm256_add_ps(LoadHalves(x + i), LoadHalves(y + i)));
  }
  if (const size_t n = count - i; n > 0) {
    StoreHalvesPartial(
        d + i,
        _mm256_add_ps(LoadHalvesPartial(x + i, n), LoadHalvesPartial(y + i, n)),
        n);
  }
}

// All sources of 8 elements are summed in a register, in source order.
BATON_REDUCE_F16C void SumManyF16C(void* dst, const void* const* srcs,
                                   size_t num_srcs, size_t count) {
  auto* d = static_cast<uint16_t*>(dst);
  auto src = [srcs](size_t k) { return static_cast<const uint16_t*>(srcs[k]); };
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 sum = _mm256_add_ps(LoadHalves(src(0) + i), LoadHalves(src(1) + i));
    for (size_t k = 2; k < num_srcs; ++k) {
      sum = _mm256_add_ps(sum, LoadHalves(src(k) + i));
    }
    StoreHalves(d + i, sum);
  }
  if (const size_t n = count - i; n > 0) {
    __m256 sum = LoadHalvesPartial(src(0) + i, n);
    for (size_t k = 1; k < num_srcs; ++k) {
      sum = _mm256_add_ps(sum, LoadHalvesPartial(src(k) + i, n));
    }
    StoreHalvesPartial(d + i, sum, n);
  }
}

BATON_REDUCE_F16C void DivideF16C(void* data, size_t count, float divisor) {
  auto* d = static_cast<uint16_t*>(data);
  const __m256 by = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    StoreHalves(d + i, _mm256_div_ps(LoadHalves(d + i), by));
  }
  if (const size_t n = count - i; n > 0) {
    StoreHalvesPartial(d + i, _mm256_div_ps(LoadHalvesPartial(d + i, n), by),
                       n);
  }
}

// True where the CPU has AVX and F16C, unless the environment sets
// BATON_REDUCE_F16C=0, which tests use to cover the software conversions.
bool UseF16C() {
  static const bool use = [] {
    const char* setting = std::getenv("BATON_REDUCE_F16C");
    if (setting != nullptr && std::string_view(setting) == "0") return false;
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return use;
}

// The element-wise operations other than the sum, on the Compute type.
// Integers: MIN and MAX on their signed type, PRODUCT and the bitwise ops on
// the unsigned one (wrapping without undefined behaviour, same bits).
struct MinOp {
  template <typename T>
  static BATON_REDUCE_INLINE T Apply(T a, T b) {
    // a != a: a is NaN (never for integers); a NaN in b fails a < b.
    return (a < b || a != a) ? a : b;
  }
};
struct MaxOp {
  template <typename T>
  static BATON_REDUCE_INLINE T Apply(T a, T b) {
    return (a > b || a != a) ? a : b;
  }
};
struct ProductOp {
  template <typename T>
  static BATON_REDUCE_INLINE T Apply(T a, T b) {
    return static_cast<T>(a * b);
  }
};
struct AndOp {
  template <typename T>
  static BATON_REDUCE_INLINE T Apply(T a, T b) {
    return static_cast<T>(a & b);
  }
};
struct OrOp {
  template <typename T>
  static BATON_REDUCE_INLINE T Apply(T a, T b) {
    return static_cast<T>(a | b);
  }
};
struct XorOp {
  template <typename T>
  static BATON_REDUCE_INLINE T Apply(T a, T b) {
    return static_cast<T>(a ^ b);
  }
};

// ReduceInto for codec C and operation Op: every element of every source is
// read before dst's element is written, so dst may alias any source.
template <typename C, typename Op>
BATON_REDUCE_KERNEL void CombineMany(void* dst, const void* const* srcs,
                                     size_t num_srcs, size_t count) {
  using Storage = typename C::Storage;
  auto* d = static_cast<Storage*>(dst);
  for (size_t i = 0; i < count; ++i) {
    typename C::Compute acc = C::Widen(static_cast<const Storage*>(srcs[0])[i]);
    for (size_t k = 1; k < num_srcs; ++k) {
      acc = Op::Apply(acc, C::Widen(static_cast<const Storage*>(srcs[k])[i]));
    }
    d[i] = C::Narrow(acc);
  }
}

template <typename C, typename Op>
void CombinePair(void* dst, const void* a, const void* b, size_t count) {
  const void* srcs[2] = {a, b};
  CombineMany<C, Op>(dst, srcs, 2, count);
}

using CombineFn = void (*)(void* dst, const void* const* srcs, size_t num_srcs,
                           size_t count);

// The kernels of one operation, by dtype; nullptr where it does not apply.
struct OpKernels {
  CombineFn many;
  PairwiseSum pair;
};

template <typename Op>
OpKernels OrderedKernels(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return {&CombineMany<Native<float>, Op>, &CombinePair<Native<float>, Op>};
    case v1::DATA_TYPE_FLOAT64:
      return {&CombineMany<Native<double>, Op>,
              &CombinePair<Native<double>, Op>};
    case v1::DATA_TYPE_FLOAT16:
      return {&CombineMany<Float16, Op>, &CombinePair<Float16, Op>};
    case v1::DATA_TYPE_BFLOAT16:
      return {&CombineMany<BFloat16, Op>, &CombinePair<BFloat16, Op>};
    case v1::DATA_TYPE_INT32:
      return {&CombineMany<Native<int32_t>, Op>,
              &CombinePair<Native<int32_t>, Op>};
    case v1::DATA_TYPE_INT64:
      return {&CombineMany<Native<int64_t>, Op>,
              &CombinePair<Native<int64_t>, Op>};
    case v1::DATA_TYPE_UINT8:
      return {&CombineMany<Native<uint8_t>, Op>,
              &CombinePair<Native<uint8_t>, Op>};
    case v1::DATA_TYPE_INT8:
      return {&CombineMany<Native<int8_t>, Op>,
              &CombinePair<Native<int8_t>, Op>};
    case v1::DATA_TYPE_INT16:
      return {&CombineMany<Native<int16_t>, Op>,
              &CombinePair<Native<int16_t>, Op>};
    default:
      return {nullptr, nullptr};
  }
}

// PRODUCT and the bitwise ops: integers as their unsigned type.
template <typename Op, bool kFloatingToo>
OpKernels WrappingKernels(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_INT32:
      return {&CombineMany<Native<uint32_t>, Op>,
              &CombinePair<Native<uint32_t>, Op>};
    case v1::DATA_TYPE_INT64:
      return {&CombineMany<Native<uint64_t>, Op>,
              &CombinePair<Native<uint64_t>, Op>};
    case v1::DATA_TYPE_UINT8:
    case v1::DATA_TYPE_INT8:
      return {&CombineMany<Native<uint8_t>, Op>,
              &CombinePair<Native<uint8_t>, Op>};
    case v1::DATA_TYPE_INT16:
      return {&CombineMany<Native<uint16_t>, Op>,
              &CombinePair<Native<uint16_t>, Op>};
    default:
      if constexpr (kFloatingToo) {
        return OrderedKernels<Op>(dtype);
      } else {
        return {nullptr, nullptr};
      }
  }
}

OpKernels KernelsFor(v1::ReduceOp op, v1::DataType dtype) {
  switch (op) {
    case v1::REDUCE_OP_MIN:
      return OrderedKernels<MinOp>(dtype);
    case v1::REDUCE_OP_MAX:
      return OrderedKernels<MaxOp>(dtype);
    case v1::REDUCE_OP_PRODUCT:
      return WrappingKernels<ProductOp, /*kFloatingToo=*/true>(dtype);
    case v1::REDUCE_OP_BAND:
      return WrappingKernels<AndOp, /*kFloatingToo=*/false>(dtype);
    case v1::REDUCE_OP_BOR:
      return WrappingKernels<OrOp, /*kFloatingToo=*/false>(dtype);
    case v1::REDUCE_OP_BXOR:
      return WrappingKernels<XorOp, /*kFloatingToo=*/false>(dtype);
    default:
      return {nullptr, nullptr};
  }
}

}  // namespace

void ReduceInto(v1::ReduceOp op, v1::DataType dtype, void* dst,
                const void* const* srcs, size_t num_srcs, size_t count) {
  if (op == v1::REDUCE_OP_SUM)
    return SumInto(dtype, dst, srcs, num_srcs, count);
  const OpKernels kernels = KernelsFor(op, dtype);
  CHECK(kernels.many != nullptr) << "ReduceInto: " << ReduceOpName(op)
                                 << " does not apply to dtype " << dtype;
  CHECK_GE(num_srcs, 1u) << "ReduceInto: no sources";
  if (count == 0) return;
  if (num_srcs == 1) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * ElementSize(dtype));
    return;
  }
  kernels.many(dst, srcs, num_srcs, count);
}

PairwiseSum PairwiseFor(v1::ReduceOp op, v1::DataType dtype) {
  if (op == v1::REDUCE_OP_SUM) return PairwiseSumFor(dtype);
  return KernelsFor(op, dtype).pair;
}

void SumInto(v1::DataType dtype, void* dst, const void* const* srcs,
             size_t num_srcs, size_t count) {
  const size_t element_size = ElementSize(dtype);
  CHECK_NE(element_size, 0u) << "SumInto: unsupported dtype " << dtype;
  CHECK_GE(num_srcs, 1u) << "SumInto: no sources";
  if (count == 0) return;
  if (num_srcs == 1) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * element_size);
    return;
  }
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return Sum<Native<float>>(dst, srcs, num_srcs, count);
    case v1::DATA_TYPE_FLOAT64:
      return Sum<Native<double>>(dst, srcs, num_srcs, count);
    case v1::DATA_TYPE_FLOAT16:
      if (UseF16C()) {
        return num_srcs == 2 ? SumPairF16C(dst, srcs[0], srcs[1], count)
                             : SumManyF16C(dst, srcs, num_srcs, count);
      }
      return Sum<Float16>(dst, srcs, num_srcs, count);
    case v1::DATA_TYPE_BFLOAT16:
      return Sum<BFloat16>(dst, srcs, num_srcs, count);
    case v1::DATA_TYPE_INT32:
      return Sum<Native<uint32_t>>(dst, srcs, num_srcs, count);
    case v1::DATA_TYPE_INT64:
      return Sum<Native<uint64_t>>(dst, srcs, num_srcs, count);
    case v1::DATA_TYPE_UINT8:
    case v1::DATA_TYPE_INT8:
      return Sum<Native<uint8_t>>(dst, srcs, num_srcs, count);
    case v1::DATA_TYPE_INT16:
      return Sum<Native<uint16_t>>(dst, srcs, num_srcs, count);
    default:
      LOG(FATAL) << "unreachable: dtype " << dtype;
  }
}

PairwiseSum PairwiseSumFor(v1::DataType dtype) {
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return &SumPair<Native<float>>;
    case v1::DATA_TYPE_FLOAT64:
      return &SumPair<Native<double>>;
    case v1::DATA_TYPE_FLOAT16:
      return UseF16C() ? &SumPairF16C : &SumPair<Float16>;
    case v1::DATA_TYPE_BFLOAT16:
      return &SumPair<BFloat16>;
    case v1::DATA_TYPE_INT32:
      return &SumPair<Native<uint32_t>>;
    case v1::DATA_TYPE_INT64:
      return &SumPair<Native<uint64_t>>;
    case v1::DATA_TYPE_UINT8:
    case v1::DATA_TYPE_INT8:
      return &SumPair<Native<uint8_t>>;
    case v1::DATA_TYPE_INT16:
      return &SumPair<Native<uint16_t>>;
    default:
      return nullptr;
  }
}

void DivideInPlace(v1::DataType dtype, void* data, size_t count,
                   int64_t divisor) {
  CHECK_GE(divisor, 1) << "DivideInPlace: divisor must be positive";
  CHECK_NE(ElementSize(dtype), 0u)
      << "DivideInPlace: unsupported dtype " << dtype;
  if (divisor == 1 || count == 0) return;
  switch (dtype) {
    case v1::DATA_TYPE_FLOAT32:
      return DivideFloating<Native<float>>(data, count,
                                           static_cast<float>(divisor));
    case v1::DATA_TYPE_FLOAT64:
      return DivideFloating<Native<double>>(data, count,
                                            static_cast<double>(divisor));
    case v1::DATA_TYPE_FLOAT16:
      if (UseF16C()) {
        return DivideF16C(data, count, static_cast<float>(divisor));
      }
      return DivideFloating<Float16>(data, count, static_cast<float>(divisor));
    case v1::DATA_TYPE_BFLOAT16:
      return DivideFloating<BFloat16>(data, count, static_cast<float>(divisor));
    case v1::DATA_TYPE_INT32:
      return DivideSmallInteger<int32_t, double>(data, count,
                                                 static_cast<double>(divisor));
    case v1::DATA_TYPE_INT64:
      return DivideInt64(data, count, divisor);
    case v1::DATA_TYPE_UINT8:
      return DivideSmallInteger<uint8_t, float>(data, count,
                                                static_cast<float>(divisor));
    case v1::DATA_TYPE_INT8:
      return DivideSmallInteger<int8_t, float>(data, count,
                                               static_cast<float>(divisor));
    case v1::DATA_TYPE_INT16:
      return DivideSmallInteger<int16_t, float>(data, count,
                                                static_cast<float>(divisor));
    default:
      LOG(FATAL) << "unreachable: dtype " << dtype;
  }
}

}  // namespace baton::agent
